"""``typevet-async batch``: judge every line of a JSONL file (or pipe) into another, in input
order, each answer line flushed as written; ``--resume`` continues an output a kill cut short.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import stat
import sys
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any, Final, TextIO

import anyio
from tqdm import tqdm

import typevet_async as tv
from typevet_async._apps.cli.arguments import (
    AddCommand,
    question_flags,
    session_flags,
)
from typevet_async._apps.cli.exits import EXIT_FAILED_RECORDS, EXIT_OK, CommandLineError, reason
from typevet_async._apps.cli.inputs import questions_from_args, session_from_args
from typevet_async._apps.jsonl import (
    BOM,
    PipeLines,
    Resumable,
    dumps,
    error_line,
    json_error,
    open_to_continue,
    read_resumable,
    refuse_overwrite,
)
from typevet_async._apps.presenting import judgment_fields
from typevet_async._core.wires.jsonvalues import parse_json, record_key

__all__ = ["add_parser", "run_batch"]


def add_parser(command: AddCommand) -> None:
    batch = command("batch", "Judge every line of a JSONL file into another, in input order.")
    batch.add_argument(
        "input",
        help="the JSONL records: a file, - for stdin, or a pipe such as /dev/stdin or <(...) "
        "(read once, as it comes; the progress bar then has no total)",
    )
    question_flags(batch)
    batch.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="FILE",
        help="the JSONL answers, one line per input line, each flushed as written; it must not "
        "exist or be empty, unless --resume; it must not be the input",
    )
    batch.add_argument(
        "--resume",
        action="store_true",
        help="continue --out: skip the records it already has (a last line cut short by a "
        "kill is dropped and judged again)",
    )
    batch.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr (the summary stays)"
    )
    session_flags(batch)


#: Error lines (bad JSON, repeated ids) the reader may hold back behind records still being
#: judged, before it waits for them to be written: the order is kept in bounded memory.
_BACKLOG_LIMIT: Final = 1024
#: Lines a pipe's reader thread may read ahead of the batch.
_PIPE_READ_AHEAD: Final = 256


def _answer_line(item: tv.BatchItem) -> bytes:
    if item.judgment is None:
        assert item.error is not None
        return error_line(item.record_id, type(item.error).__name__, str(item.error))
    fields = judgment_fields(item.judgment)
    body = {"id": item.record_id, "answers": fields["answers"], "usage": fields["usage"]}
    return dumps(body) + b"\n"


def _answered(out: Path) -> tuple[Counter[str], Resumable]:
    """The answer lines --out already holds, by record id, and where to continue it."""
    counts: Counter[str] = Counter()

    def take(_: int, line: Any) -> None:
        if not isinstance(line, dict) or "id" not in line:
            raise TypeError('not {"id": ..., ...}')
        counts[record_key(line["id"])] += 1

    try:
        return counts, read_resumable(out, take, shape="an answer line")
    except OSError as error:
        raise CommandLineError(f"--out {out}: cannot read it: {reason(error)}") from None


class _AnswerSink:
    """Writes answer lines in input order, each flushed. A record being judged holds its
    place (its batch index); the error lines the reader makes wait behind it.

    :raises CommandLineError: a write failed (a full disk, a lost mount).
    """

    def __init__(self, file: io.FileIO, path: Path, bar: tqdm[Any]) -> None:
        self.file = file
        self.path = path
        self.bar = bar
        self.pending: deque[int | bytes] = deque()
        self.backlog = 0
        self.written = 0
        self.failed = 0
        self._drained: anyio.Event | None = None

    def write_raw(self, data: bytes) -> None:
        # Unbuffered, so a killed run keeps every line it wrote, and a failed write is not
        # tried again (and failed again) when the file closes.
        pending = memoryview(data)
        try:
            while pending:
                pending = pending[self.file.write(pending) :]
        except OSError as error:
            raise CommandLineError(f"cannot write to --out {self.path}: {reason(error)}") from None

    def _write(self, line: bytes) -> None:
        self.write_raw(line)
        self.written += 1
        self.bar.update(1)

    def expect(self, index: int) -> None:
        self.pending.append(index)

    def error_line(self, line: bytes) -> None:
        self.failed += 1
        if self.pending:
            self.pending.append(line)
            self.backlog += 1
        else:
            self._write(line)

    def deliver(self, item: tv.BatchItem) -> None:
        expected = self.pending.popleft()
        assert expected == item.index, (expected, item.index)  # judge_many is ordered
        self.failed += not item.ok
        self._write(_answer_line(item))
        while self.pending and isinstance(self.pending[0], bytes):
            line = self.pending.popleft()
            assert isinstance(line, bytes)
            self.backlog -= 1
            self._write(line)
        if not self.pending and self._drained is not None:
            self._drained.set()

    async def wait_for_backlog(self) -> None:
        while self.backlog > _BACKLOG_LIMIT and self.pending:
            self._drained = anyio.Event()
            await self._drained.wait()


def _parse_line(number: int, line: bytes) -> tuple[Any, Any, str | None] | None:
    """An input line's (id, state, problem): ``{"id", "state"}`` or a bare state (its id is
    its line number), or the problem that makes it an error line; None for a blank line."""
    if number == 1:
        line = line.removeprefix(BOM)
    if not line.strip():
        return None
    try:
        data = parse_json(line)
    except ValueError as error:
        return number, None, f"line {number}: not valid JSON ({json_error(error)})"
    if isinstance(data, dict) and "id" in data and "state" in data:
        return data["id"], data["state"], None
    return number, data, None


class _Reader:
    """Turns input lines into records to judge and, in place, error lines for lines that are
    not JSON or repeat an id; skips (for --resume) the records --out already has."""

    def __init__(self, answered: Counter[str], sink: _AnswerSink) -> None:
        self.answered = answered
        self.sink = sink
        self.seen: Counter[str] = Counter()
        self.first_line: dict[str, int] = {}
        self.skipped = 0
        self.judged = 0

    def _take(self, number: int, line: bytes) -> tuple[Any, Any] | None:
        """The line's (id, state) to judge, or None once it is skipped or its error written."""
        parsed = _parse_line(number, line)
        if parsed is None:
            return None
        record_id, state, problem = parsed
        key = record_key(record_id)
        occurrence = self.seen[key]
        self.seen[key] += 1
        if occurrence < self.answered[key]:  # --resume: --out has this line already
            self.skipped += 1
            self.first_line.setdefault(key, number)
            return None
        if problem is None and key in self.first_line:
            problem = (
                f"line {number}: the id {dumps(record_id).decode()} is already taken, by "
                f"line {self.first_line[key]}; each record needs its own id"
            )
        self.first_line.setdefault(key, number)
        if problem is not None:
            self.sink.error_line(error_line(record_id, "InvalidInputError", problem))
            return None
        return record_id, state

    async def records(
        self, lines: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[tuple[Any, Any], None]:
        number = 0
        async with contextlib.aclosing(lines):  # a pipe's reader stops as soon as we do
            async for line in lines:
                number += 1
                record = self._take(number, line)
                if record is None:
                    await self.sink.wait_for_backlog()
                    continue
                self.sink.expect(self.judged)
                self.judged += 1
                yield record


async def _lines_of_pipe(source: IO[bytes]) -> AsyncGenerator[bytes, None]:
    lines = PipeLines(source.fileno(), read_ahead=_PIPE_READ_AHEAD, name="typevet-async input")
    try:
        async for line in lines:
            yield line
    finally:
        lines.stop()


async def _lines_of_file(source: IO[bytes]) -> AsyncGenerator[bytes, None]:
    for line in source:
        yield line


async def _then(
    first: tuple[Any, Any], rest: AsyncIterator[tuple[Any, Any]]
) -> AsyncIterator[tuple[Any, Any]]:
    yield first
    async for record in rest:
        yield record


@contextlib.contextmanager
def _open_input(argument: str) -> Iterator[IO[bytes]]:
    if argument == "-":
        yield sys.stdin.buffer
        return
    try:
        source = open(argument, "rb")  # noqa: SIM115 (closed below, after the batch)
    except OSError as error:
        raise CommandLineError(f"cannot read the input {argument}: {reason(error)}") from None
    with source:
        yield source


def _check_out(args: argparse.Namespace, source: IO[bytes]) -> None:
    """Refuse an --out that is the input (through a symlink, a hard link or another path),
    or that --resume could not continue, before anything is written."""
    try:
        out_status = os.stat(args.out)  # follows symlinks, as the writes would
    except FileNotFoundError:
        return
    except OSError as error:
        raise CommandLineError(f"--out {args.out}: {reason(error)}") from None
    input_status = os.fstat(source.fileno())
    if (out_status.st_dev, out_status.st_ino) == (input_status.st_dev, input_status.st_ino):
        raise CommandLineError(
            f"--out {args.out} is the input {args.input} (the same file): the answers would "
            "overwrite the records; write them to another file"
        )
    regular = stat.S_ISREG(out_status.st_mode)
    if args.resume and not regular:
        raise CommandLineError(f"--resume needs --out to be a regular file; {args.out} is not")
    if regular:
        refuse_overwrite(
            args.out, resume=args.resume, named=f"--out {args.out}", how_to_resume="pass --resume"
        )


#: Repeated ids a refusal names at most.
_DUPLICATES_SHOWN: Final = 5


def _scan_file(source: IO[bytes], path: str) -> int:
    """The records of an input file (its non-blank lines), once no id repeats: a file can be
    read twice, so duplicates are refused before anything is judged (a pipe's are refused
    line by line, each an error line naming the first).

    :raises CommandLineError: ids that repeat, each named with its lines.
    """
    lines: dict[str, list[int]] = {}
    shown: dict[str, Any] = {}
    count = 0
    for number, line in enumerate(source, 1):
        parsed = _parse_line(number, line)
        if parsed is None:
            continue
        count += 1
        record_id, _, problem = parsed
        if problem is None:
            key = record_key(record_id)
            lines.setdefault(key, []).append(number)
            shown.setdefault(key, record_id)
    source.seek(0)
    repeated = [(key, numbers) for key, numbers in lines.items() if len(numbers) > 1]
    if repeated:
        named = "; ".join(
            f"{dumps(shown[key]).decode()} on lines {', '.join(map(str, numbers))}"
            for key, numbers in repeated[:_DUPLICATES_SHOWN]
        )
        more = len(repeated) - _DUPLICATES_SHOWN
        raise CommandLineError(
            f"{path} repeats record ids: {named}{f' (and {more} more)' if more > 0 else ''}; "
            "each record needs its own id (a bare line's id is its line number); nothing "
            "was judged"
        )
    return count


async def run_batch(args: argparse.Namespace, out: TextIO) -> int:
    questions = questions_from_args(args)
    session = session_from_args(args, os.environ)
    with _open_input(args.input) as source:
        _check_out(args, source)
        answered, resumable = _answered(args.out) if args.resume else (Counter(), Resumable())
        regular = stat.S_ISREG(os.fstat(source.fileno()).st_mode)
        # A pipe can be read once only: its total is unknown, its duplicates refused in place.
        total = max(_scan_file(source, args.input) - resumable.lines, 0) if regular else None
        try:
            sink_file = open_to_continue(args.out, resumable)
        except OSError as error:
            raise CommandLineError(f"cannot write to --out {args.out}: {reason(error)}") from None
        started = time.monotonic()
        # disable=None: a bar only when stderr is a terminal (a log would fill with redraws).
        bar = tqdm(
            total=total, unit="rec", disable=True if args.no_progress else None, file=sys.stderr
        )
        with sink_file, bar:
            sink = _AnswerSink(sink_file, args.out, bar)
            reader = _Reader(answered, sink)
            lines = _lines_of_file(source) if regular else _lines_of_pipe(source)
            records = reader.records(lines)
            async with contextlib.aclosing(records):
                # The server starts only once there is a record to judge.
                first = await anext(records, None)
                if first is not None:
                    async with session:
                        stream = session.judge_many(_then(first, records), questions)
                        async with contextlib.aclosing(stream):
                            async for item in stream:
                                sink.deliver(item)
    elapsed = time.monotonic() - started
    print(
        f"{sink.written} records ({reader.skipped} skipped as done), {sink.failed} failed, "
        f"{sink.written / elapsed if elapsed else 0:.2f} records/s",
        file=out,
    )
    return EXIT_FAILED_RECORDS if sink.failed else EXIT_OK
