"""A Ray Data pipeline (`tv.RayJudge`) against `judge_many` in one process, on SIMULATED servers.

The servers are the bottleneck here, so they are simulated: `benchmarks.client_cost.replay_server`
in its simulation mode (a child process answering each ``POST /completion`` with a real recorded
llama.cpp body after holding one of ``--slots`` slots for ``--service-time`` seconds;
``asyncio.sleep``, no CPU). Real llama.cpp servers on this 2-core machine would share the
client's CPUs and measure the machine, not the pipelines. One Noul per record (one read).

**Throughput**, side by side in one run, rounds with the passes' order rotated, all on one
simulated server (default 8 slots of 0.05 s: at most 160 reads/s):

- ``judge_many cap C``: ``session.judge_many`` in this process on
  ``tv.Session.llama_cpp(url, max_concurrency=C)``, for C = ``--cap`` x 1, 2, 4;
- ``Ray, N actors``: ``ds.map_batches(tv.RayJudge, ...)`` on a local Ray cluster
  (``ray.init(num_cpus=2)``, started once) with N = 1, 2, 4 actors (``ActorPoolStrategy(size=N,
  max_concurrent_calls_per_actor=2)``, ``num_cpus=0.25`` each), each actor's session capped at
  ``--cap`` (default 2), so N actors have the cap of ``judge_many cap N x --cap``.

Each pass judges ``--records`` records (rows ``{"id", "state"}``, distinct tickets) and
must answer all of them. Reported: records/s end to end (for Ray: from building the pipeline
to its last row, actor start-up and the sessions' probes included); records/s while the server
was busy (records over the span from its first ``/completion`` arrival to its last answer,
which leaves Ray's start-up out); for Ray the seconds to its first output batch; the most
slots the server had held at once.

**Ray's own HTTP processor** (``ray.data.llm.HttpRequestProcessorConfig`` with
``build_processor``, which needs neither vLLM nor a GPU) against `tv.RayJudge` and a plain
``asyncio.gather`` of aiohttp posts, on a simulated server of 8 slots of 0.3 s: 8 records in
one batch of 8, and 32 records in 4 batches of 8, each Ray pipeline on its defaults (one
actor, ``batch_size=8``, one batch at a time); the processor posts the very ``/completion`` body
the SDK sends (captured from an SDK judgment, the ticket swapped per row). Reported: the
server's busy span, the most slots held at once and the connections the clients opened.

    python -m benchmarks.scale.bench_ray [--rounds 3] [--records 1600] [--service-time 0.05]
        [--slots 8] [--cap 2] [--actors 1 2 4] [--batch-size 25] [--http-rounds 2]
        [--skip-http-processor]

Figures go to ``benchmarks/results/scale/bench_ray.json``. The machine is shared and has 2 cores:
read the spreads, not just the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import statistics
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import ray
import ray.data
from ray.data.llm import HttpRequestProcessorConfig, build_processor

import typevet_async as tv
from benchmarks._shared import ROOT, fmt, markdown_table, spread, ticket, write_results
from benchmarks.client_cost.replay_server import (
    PRIME_TICKET,
    QUESTIONS,
    RECORDED_SETTINGS,
    ReplayServerProcess,
    capture_sdk_body,
)

NAME = "bench_ray"
#: Ray batches one actor runs at once in the throughput passes.
CALLS_PER_ACTOR = 2


def rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": n, "state": ticket(n)} for n in range(start, start + count)]


def start_ray() -> None:
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def server_figures(server: ReplayServerProcess, records: int) -> dict[str, Any]:
    simulation = server.stats()["simulation"]
    span = simulation["last_answer"] - simulation["first_arrival"]
    return {
        "served": simulation["served"],
        "server_span_s": span,
        "busy_records_per_s": records / span,
        "peak_slots_held": simulation["peak_slots_held"],
        "connections_opened": simulation["connections_opened"],
    }


# -- throughput passes -----------------------------------------------------------------------


async def _judge_many(url: str, cap: int, records: list[dict[str, Any]]) -> int:
    answered = 0
    async with tv.Session.llama_cpp(url, max_concurrency=cap, **RECORDED_SETTINGS) as session:
        pairs = ((row["id"], row["state"]) for row in records)
        async for item in session.judge_many(pairs, QUESTIONS, ordered=False):
            if item.judgment is None:
                raise RuntimeError(f"record {item.record_id} failed: {item.error!r}")
            answered += 1
    return answered


def judge_many_pass(server: ReplayServerProcess, cap: int, count: int) -> dict[str, Any]:
    records = rows(count)
    server.reset()
    started = time.perf_counter()
    answered = asyncio.run(_judge_many(server.url, cap, records))
    elapsed = time.perf_counter() - started
    if answered != count:
        raise RuntimeError(f"judge_many answered {answered} of {count}")
    return {
        "records": count,
        "wall_s": elapsed,
        "records_per_s": count / elapsed,
        **server_figures(server, count),
    }


def judged(
    url: str, cap: int, records: list[dict[str, Any]], batch_size: int, compute: Any
) -> ray.data.Dataset:
    blocks = max(1, len(records) // batch_size)
    dataset = ray.data.from_items(records, override_num_blocks=blocks)
    return dataset.map_batches(
        tv.RayJudge,
        fn_constructor_kwargs={
            "session_factory": functools.partial(
                tv.Session.llama_cpp, url, max_concurrency=cap, **RECORDED_SETTINGS
            ),
            "questions": QUESTIONS,
            "id_column": "id",
        },
        compute=compute,
        batch_size=batch_size,
        batch_format="pyarrow",
        num_cpus=0.25,
    )


def ray_pass(
    server: ReplayServerProcess, actors: int, cap: int, count: int, batch_size: int
) -> dict[str, Any]:
    records = rows(count)
    server.reset()
    started = time.perf_counter()
    first_batch: float | None = None
    answered = failed = 0
    compute = ray.data.ActorPoolStrategy(
        size=actors, max_concurrent_calls_per_actor=CALLS_PER_ACTOR
    )
    pipeline = judged(server.url, cap, records, batch_size, compute)
    for batch in pipeline.iter_batches(batch_format="pyarrow", batch_size=None):
        if first_batch is None:
            first_batch = time.perf_counter() - started
        errors = batch.column("error")
        failed += batch.num_rows - errors.null_count
        answered += errors.null_count
    elapsed = time.perf_counter() - started
    if answered != count or failed:
        raise RuntimeError(f"Ray answered {answered} of {count}, {failed} failed")
    return {
        "records": count,
        "wall_s": elapsed,
        "records_per_s": count / elapsed,
        "first_batch_s": first_batch,
        **server_figures(server, count),
    }


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    passes = [("judge_many", n) for n in args.actors] + [("ray", n) for n in args.actors]
    figures: dict[str, list[dict[str, Any]]] = {f"{kind} {n}": [] for kind, n in passes}
    with ReplayServerProcess(service_time=args.service_time, slots=args.slots) as server:
        for round_number in range(args.rounds):
            shift = round_number % len(passes)
            for kind, n in passes[shift:] + passes[:shift]:
                if kind == "judge_many":
                    result = judge_many_pass(server, args.cap * n, args.records)
                else:
                    result = ray_pass(server, n, args.cap, args.records, args.batch_size)
                figures[f"{kind} {n}"].append(result)
                print(
                    f"round {round_number + 1}: {kind} {n}: {result['records_per_s']:.1f} "
                    f"records/s ({result['wall_s']:.1f} s)",
                    flush=True,
                )
    return figures


def throughput_table(args: argparse.Namespace, figures: dict[str, Any]) -> str:
    ceiling = args.slots / args.service_time
    header = [
        "pipeline",
        "cap (reads in flight)",
        "records/s end to end",
        "records/s while the server was busy",
        "first batch (s)",
        "slots held at most",
    ]
    table: list[list[str]] = []
    for kind in ("judge_many", "ray"):
        for n in args.actors:
            runs = figures[f"{kind} {n}"]
            first = [r["first_batch_s"] for r in runs if r.get("first_batch_s") is not None]
            table.append(
                [
                    f"judge_many, one process, cap {args.cap * n}"
                    if kind == "judge_many"
                    else f"Ray, {n} actor{'s' if n > 1 else ''} x cap {args.cap}",
                    str(args.cap * n),
                    fmt(spread([r["records_per_s"] for r in runs]), 1),
                    fmt(spread([r["busy_records_per_s"] for r in runs]), 1),
                    fmt(spread(first), 1) if first else "-",
                    str(max(r["peak_slots_held"] for r in runs)),
                ]
            )
    note = (
        f"\nSimulated server: {args.slots} slots x {args.service_time} s (at most "
        f"{ceiling:.0f} records/s); {args.records} records a pass; median (min-max) of "
        f"{args.rounds} rounds."
    )
    return markdown_table(header, table) + note


# -- Ray's own HTTP processor ------------------------------------------------------------------


def http_processor_pass(
    server: ReplayServerProcess, template: dict[str, Any], count: int
) -> dict[str, Any]:
    prompt: str = template["prompt"]
    primed = ticket(PRIME_TICKET)

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        body = dict(template)
        body["prompt"] = prompt.replace(primed, row["state"])
        return {"payload": body}

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {"id": row["id"], "entries": len(row["http_response"]["completion_probabilities"])}

    config = HttpRequestProcessorConfig(url=f"{server.url}/completion", batch_size=8)
    processor = build_processor(config, preprocess=preprocess, postprocess=postprocess)
    dataset = ray.data.from_items(rows(count), override_num_blocks=max(1, count // 8))
    server.reset()
    started = time.perf_counter()
    out = processor(dataset).take_all()
    elapsed = time.perf_counter() - started
    if len(out) != count:
        raise RuntimeError(f"the HTTP processor returned {len(out)} of {count} rows")
    return {"wall_s": elapsed, **server_figures(server, count)}


def ray_judge_pass(server: ReplayServerProcess, count: int) -> dict[str, Any]:
    server.reset()
    started = time.perf_counter()
    compute = ray.data.ActorPoolStrategy(size=1)
    out = judged(server.url, 8, rows(count), 8, compute).take_all()
    elapsed = time.perf_counter() - started
    if len(out) != count or any(row["error"] is not None for row in out):
        raise RuntimeError("RayJudge did not answer every row")
    return {"wall_s": elapsed, **server_figures(server, count)}


async def _gather(url: str, template: dict[str, Any], count: int) -> None:
    prompt: str = template["prompt"]
    primed = ticket(PRIME_TICKET)
    async with aiohttp.ClientSession() as http:

        async def one(n: int) -> None:
            body = dict(template)
            body["prompt"] = prompt.replace(primed, ticket(n))
            async with http.post(f"{url}/completion", data=orjson.dumps(body)) as response:
                response.raise_for_status()
                await response.read()

        await asyncio.gather(*(one(n) for n in range(count)))


def gather_pass(
    server: ReplayServerProcess, template: dict[str, Any], count: int
) -> dict[str, Any]:
    server.reset()
    started = time.perf_counter()
    asyncio.run(_gather(server.url, template, count))
    return {"wall_s": time.perf_counter() - started, **server_figures(server, count)}


def http_processor(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, list[dict[str, Any]]] = {}
    with ReplayServerProcess(service_time=0.3, slots=8) as server:
        asyncio.run(capture_sdk_body(tv.Session.llama_cpp(server.url, **RECORDED_SETTINGS)))
        template = orjson.loads(server.last_completion())
        passes = [(kind, count) for count in (8, 32) for kind in ("http", "ray_judge", "gather")]
        for round_number in range(args.http_rounds):
            shift = round_number % len(passes)
            for kind, count in passes[shift:] + passes[:shift]:
                if kind == "http":
                    result = http_processor_pass(server, template, count)
                elif kind == "ray_judge":
                    result = ray_judge_pass(server, count)
                else:
                    result = gather_pass(server, template, count)
                figures.setdefault(f"{kind} {count}", []).append(result)
                print(
                    f"round {round_number + 1}: {kind} {count}: server busy "
                    f"{result['server_span_s']:.2f} s",
                    flush=True,
                )
    return figures


def http_processor_table(figures: dict[str, Any]) -> str:
    names = {
        "http": "Ray `HttpRequestProcessorConfig` (`build_processor`)",
        "ray_judge": "`tv.RayJudge`, session cap 8",
        "gather": "`asyncio.gather` of aiohttp posts",
    }
    table = []
    for count, batches in ((8, 1), (32, 4)):
        for kind, name in names.items():
            runs = figures[f"{kind} {count}"]
            table.append(
                [
                    f"{count} requests"
                    + ("" if kind == "gather" else f" in {batches} batch" + "es" * (batches > 1)),
                    name,
                    fmt(spread([r["server_span_s"] for r in runs]), 2, " s"),
                    str(max(r["peak_slots_held"] for r in runs)),
                    f"{statistics.median(r['connections_opened'] for r in runs):g}",
                ]
            )
    header = ["requests", "client", "server busy", "slots held at most", "connections opened"]
    note = "\nSimulated server: 8 slots x 0.3 s; median (min-max) over rounds."
    return markdown_table(header, table) + note


@contextlib.contextmanager
def ray_cluster() -> Iterator[None]:
    start_ray()
    try:
        yield
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1600)
    parser.add_argument("--service-time", type=float, default=0.05)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--cap", type=int, default=2)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch-size", type=int, default=25)
    parser.add_argument("--http-rounds", type=int, default=2)
    parser.add_argument("--skip-http-processor", action="store_true")
    args = parser.parse_args()
    with ray_cluster():
        figures: dict[str, Any] = {"throughput": throughput(args)}
        if not args.skip_http_processor:
            figures["http_processor"] = http_processor(args)
    tables = {"throughput": throughput_table(args, figures["throughput"])}
    if "http_processor" in figures:
        tables["http_processor"] = http_processor_table(figures["http_processor"])
    settings = {
        key: getattr(args, key)
        for key in ("rounds", "records", "service_time", "slots", "cap", "actors", "batch_size")
    }
    settings["calls_per_actor"] = CALLS_PER_ACTOR
    settings["ray"] = ray.__version__
    path = write_results(NAME, {"settings": settings, "figures": figures, "tables": tables})
    for text in tables.values():
        print("\n" + text)
    print(f"\nwritten: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
