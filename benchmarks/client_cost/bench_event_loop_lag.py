"""Event-loop lag while the SDK judges: a 1 ms ticker on the same loop, 64 judgments in flight.

The replay server (`benchmarks.client_cost.replay_server`: real recorded llama.cpp bodies, answered
at once, in a CHILD process) stands in for a fast server, so the loop is busy with the client's
own work only. In the client process a ticker task sleeps 1 ms (``asyncio.sleep(0.001)``) in
a loop; its lag is how late each tick wakes up (actual sleep minus 1 ms). It runs while
``session.judge_many(tickets, {"refund": Noul}, max_in_flight=64)`` streams the questions
(``max_concurrency=64``, default settings, after the probe and a warm-up batch).

Side by side, each pass in a fresh client process, rounds rotated:
- ``idle``: the ticker alone for the same time (asyncio's own timer granularity: the selector
  waits in whole milliseconds);
- ``floor``: a minimal aiohttp loop, 64 workers posting the SDK's captured body and reading
  the bytes;
- ``sdk default``: the SDK at its default read; ``sdk top4096``: with ``top_k=4096`` (the old
  default's 370 KB bodies); ``sdk pipeline``: the default read with ``time_slice=None`` (a
  batch pipeline's session: its reads never yield, so this shows what the slices hold off).

Per pass: p50, p99 and max lag over every tick; cells are medians over rounds (min-max).

    python -m benchmarks.client_cost.bench_event_loop_lag [--rounds 3] [--questions 5000]
        [--questions-4096 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

import typevet_async as tv
from benchmarks._shared import (
    fmt,
    markdown_table,
    percentile,
    run_json_subprocess,
    spread,
    ticket_stream,
    write_results,
)
from benchmarks.client_cost.replay_server import (
    QUESTIONS,
    RECORDED_SETTINGS,
    ReplayServerProcess,
    capture_sdk_body,
    floor_loop,
)

NAME = "bench_event_loop_lag"
IN_FLIGHT = 64
WARM_UP = 300
TICK = 0.001
TARGET_P99_MS = 5.0
READS: dict[str, int | None] = {"default": None, "top4096": 4096, "pipeline": None}  # top_k
PASSES = ("idle", "floor", "sdk default", "sdk top4096", "sdk pipeline")


async def with_ticker(work: Callable[[], Awaitable[int]]) -> dict[str, Any]:
    """Run ``work`` with a 1 ms ticker on the same loop; the ticks' lags in ms."""
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            await asyncio.sleep(TICK)
            lags.append((time.perf_counter() - started - TICK) * 1e3)

    gc.collect()
    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    wall_started = time.perf_counter()
    done = await work()
    wall = time.perf_counter() - wall_started
    stop.set()
    await task
    ordered = sorted(lags)
    return {
        "questions": done,
        "wall_s": wall,
        "ticks": len(ordered),
        "p50_ms": percentile(ordered, 0.50),
        "p99_ms": percentile(ordered, 0.99),
        "max_ms": ordered[-1] if ordered else float("nan"),
        "share_over_5ms": sum(1 for lag in ordered if lag > 5.0) / max(len(ordered), 1),
    }


async def sdk_pass(url: str, read: str, count: int) -> dict[str, Any]:
    # "pipeline": the default read on a session whose reads never yield (``time_slice=None``).
    extra: dict[str, Any] = {"time_slice": None} if read == "pipeline" else {}
    session = tv.Session.llama_cpp(
        url, max_concurrency=IN_FLIGHT, top_k=READS[read], **RECORDED_SETTINGS, **extra
    )
    async with session:
        await session.probe()
        async for item in session.judge_many(
            ticket_stream(WARM_UP, start=2 * 10**9), QUESTIONS, max_in_flight=IN_FLIGHT
        ):
            if item.judgment is None:
                raise RuntimeError(f"warm-up record {item.index} failed: {item.error!r}")

        async def work() -> int:
            answered = 0
            async for item in session.judge_many(
                ticket_stream(count), QUESTIONS, max_in_flight=IN_FLIGHT
            ):
                answered += item.judgment is not None
            return answered

        return await with_ticker(work)


async def floor_pass(url: str, template: dict[str, Any], count: int) -> dict[str, Any]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=IN_FLIGHT)) as http:
        run = floor_loop(http, url, template, IN_FLIGHT)
        await run(WARM_UP, 2 * 10**9)

        async def work() -> int:
            await run(count, 0)  # (it returns the bytes received, not the questions)
            return count

        return await with_ticker(work)


async def idle_pass(seconds: float) -> dict[str, Any]:
    async def work() -> int:
        await asyncio.sleep(seconds)
        return 0

    return await with_ticker(work)


def run(args: argparse.Namespace) -> None:
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in PASSES}
    started = time.perf_counter()
    with ReplayServerProcess() as server, tempfile.TemporaryDirectory() as scratch:
        asyncio.run(capture_sdk_body(tv.Session.llama_cpp(server.url, **RECORDED_SETTINGS)))
        body_file = Path(scratch) / "body.json"
        body_file.write_bytes(server.last_completion())
        default_k = orjson.loads(body_file.read_bytes())["n_probs"]
        idle_seconds = 2.0
        for round_index in range(args.rounds):
            shift = round_index % len(PASSES)
            for name in PASSES[shift:] + PASSES[:shift]:
                command = [
                    "benchmarks.client_cost.bench_event_loop_lag",
                    "--pass",
                    name,
                    "--url",
                    server.url,
                ]
                if name == "idle":
                    command += ["--seconds", str(idle_seconds)]
                elif name == "floor":
                    command += ["--questions", str(args.questions), "--body-file", str(body_file)]
                else:
                    count = args.questions_4096 if name.endswith("4096") else args.questions
                    command += ["--questions", str(count)]
                result = run_json_subprocess(command)
                results[name].append(result)
                if name == "sdk default":
                    idle_seconds = max(result["wall_s"], 1.0)
                print(
                    f"round {round_index + 1} {name:12} p50 {result['p50_ms']:.2f} p99 "
                    f"{result['p99_ms']:.2f} max {result['max_ms']:.2f} ms "
                    f"({result['ticks']} ticks, {result['wall_s']:.1f} s)",
                    flush=True,
                )
        stats = server.stats()
    elapsed = time.perf_counter() - started
    rows = []
    cells: dict[str, Any] = {}
    for name in PASSES:
        runs = results[name]
        cell = {key: spread([r[key] for r in runs]) for key in ("p50_ms", "p99_ms", "max_ms")}
        cells[name] = {**cell, "runs": runs}
        label = {
            "idle": "ticker alone (idle loop)",
            "floor": f"minimal aiohttp loop, 64 in flight (K={default_k} body)",
            "sdk default": f"SDK `judge_many`, 64 in flight, default read (K={default_k})",
            "sdk top4096": "SDK `judge_many`, 64 in flight, `top_k=4096`",
            "sdk pipeline": "SDK `judge_many`, 64 in flight, default read, `time_slice=None`",
        }[name]
        rows.append(
            [
                label,
                fmt(cell["p50_ms"], 2),
                fmt(cell["p99_ms"], 2),
                fmt(cell["max_ms"], 1),
                f"{statistics.median(r['questions'] / r['wall_s'] for r in runs):,.0f}"
                if name != "idle"
                else "-",
            ]
        )
    table = markdown_table(["while", "lag p50 ms", "lag p99 ms", "lag max ms", "questions/s"], rows)
    p99 = cells["sdk default"]["p99_ms"]["median"]
    verdict = (
        f"- p99 lag at the default read: {p99:.2f} ms (target <= {TARGET_P99_MS:.0f} ms): "
        f"{'met' if p99 <= TARGET_P99_MS else 'MISSED'}"
    )
    path = write_results(
        NAME,
        {
            "settings": {
                "rounds": args.rounds,
                "questions": args.questions,
                "questions_4096": args.questions_4096,
                "in_flight": IN_FLIGHT,
                "tick_s": TICK,
            },
            "default_n_probs": default_k,
            "replay_server": stats,
            "cells": cells,
            "elapsed_s": elapsed,
            "table": table,
            "verdicts": [verdict],
        },
    )
    print()
    print(
        f"1 ms ticker on the client's loop; replay server in a child process; {args.rounds} "
        f"rounds, passes rotated, each a fresh process; median (min-max); {elapsed:.0f} s"
    )
    print()
    print(table)
    print()
    print(verdict)
    unanswered = stats["requests"].get("unanswered", 0)
    if unanswered:
        print(f"UNANSWERED requests at the replay server: {unanswered}: {stats['unanswered']}")
    print(f"(figures in {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=5000)
    parser.add_argument("--questions-4096", type=int, default=1000)
    parser.add_argument("--pass", dest="name", choices=PASSES)
    parser.add_argument("--url")
    parser.add_argument("--body-file", type=Path)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if args.name is None:
        run(args)
        return
    if args.name == "idle":
        result = asyncio.run(idle_pass(args.seconds))
    elif args.name == "floor":
        template = orjson.loads(args.body_file.read_bytes())
        result = asyncio.run(floor_pass(args.url, template, args.questions))
    else:
        read = args.name.split()[1]
        result = asyncio.run(sdk_pass(args.url, read, args.questions))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
