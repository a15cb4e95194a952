"""Where a concurrency-1 pass's time goes on the real llama.cpp server: the server's requests,
or the client's time between them.

`bench_clients` compares throughputs whose rounds vary by ±15%. This tells the two parts
apart. Alternating in one run, at concurrency 1, one Noul per fresh ticket:

- ``judge_many``: ``session.judge_many(tickets, {"refund": Noul}, max_in_flight=1)``, after
  the probe and one judgment;
- ``aiohttp``: `bench_clients`' minimal aiohttp loop (the SDK's own top-64 body).

Both time each ``/completion`` request with the same aiohttp trace hooks (from sending it to
its reply's headers, with which a 5 KB body arrives). A pass's client time per question is its
wall time over its questions less the mean request time: what the client spent between
replies and the next request (decoding, answering, building the next prompt).

    python -m benchmarks.measure_request_gaps [--rounds 6] [--questions 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson

import typevet_async as tv
from benchmarks import bench_clients
from benchmarks._shared import fmt, markdown_table, spread, write_results

NAME = "measure_request_gaps"
CLIENTS = ("judge_many", "aiohttp")


def request_timer(seconds: list[float]) -> aiohttp.TraceConfig:
    """Appends each ``/completion`` request's time, sending to reply headers."""
    trace = aiohttp.TraceConfig()

    async def started(_: Any, context: SimpleNamespace, __: Any) -> None:
        context.started = time.perf_counter()

    async def ended(_: Any, context: SimpleNamespace, params: Any) -> None:
        if str(params.url).endswith("/completion"):
            seconds.append(time.perf_counter() - context.started)

    trace.on_request_start.append(started)
    trace.on_request_end.append(ended)
    return trace


async def sdk_pass(url: str, states: list[str], warm: str, seconds: list[float]) -> float:
    trace = request_timer(seconds)
    async with tv.Session.llama_cpp(url, max_concurrency=1, trace_configs=[trace]) as session:
        await session.probe()
        await session.judge(warm, bench_clients.QUESTIONS)
        seconds.clear()
        started = time.perf_counter()
        async for item in session.judge_many(states, bench_clients.QUESTIONS, max_in_flight=1):
            if item.judgment is None:
                raise RuntimeError(f"ticket {item.index}: {item.error!r}")
        return time.perf_counter() - started


async def aiohttp_pass(url: str, bodies: list[bytes], warm: bytes, seconds: list[float]) -> float:
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=5, keepalive_timeout=2.0)
    trace = request_timer(seconds)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as http:

        async def one(body: bytes) -> None:
            async with http.post(f"{url}/completion", data=body, headers=headers) as response:
                response.raise_for_status()
                payload = orjson.loads(await response.read())
                payload["completion_probabilities"][0]["top_logprobs"]

        await one(warm)
        seconds.clear()
        started = time.perf_counter()
        for body in bodies:
            await one(body)
        return time.perf_counter() - started


async def measure(url: str, rounds: int, questions: int) -> dict[str, Any]:
    model = await bench_clients.served_model(url)
    backend = bench_clients.llama_cpp_backend(url, model)
    fresh = bench_clients.Tickets((int(time.time()) % 100_000) * 10_000)
    await bench_clients.check_prompts(backend, fresh)  # the loop sends what the SDK sends
    async with backend.session(16, None) as session:  # every slot holds the prefix
        async for _ in session.judge_many(
            fresh.take(64), bench_clients.QUESTIONS, max_in_flight=16
        ):
            pass
    passes: dict[str, list[dict[str, float]]] = {client: [] for client in CLIENTS}
    for round_index in range(rounds):
        order = CLIENTS if round_index % 2 == 0 else CLIENTS[::-1]
        for client in order:
            states, warm = fresh.take(questions), fresh.take(1)[0]
            seconds: list[float] = []
            if client == "judge_many":
                wall = await sdk_pass(url, states, warm, seconds)
            else:

                def body(state: str) -> bytes:
                    return orjson.dumps(bench_clients._llama_cpp_body(backend.prompt(state)))

                wall = await aiohttp_pass(url, [body(s) for s in states], body(warm), seconds)
            if len(seconds) != questions:
                raise RuntimeError(f"{client}: {len(seconds)} requests for {questions} questions")
            request_ms = statistics.mean(seconds) * 1e3
            figures = {
                "questions_per_s": questions / wall,
                "request_ms": request_ms,
                "client_ms_per_question": wall / questions * 1e3 - request_ms,
            }
            passes[client].append(figures)
            print(
                f"round {round_index + 1} {client:10} {figures['questions_per_s']:5.2f} q/s, "
                f"request {request_ms:6.1f} ms, client {figures['client_ms_per_question']:.2f} "
                "ms per question",
                flush=True,
            )
    return {"passes": passes}


def report(args: argparse.Namespace, passes: dict[str, list[dict[str, float]]]) -> None:
    cells = {
        client: {key: spread([p[key] for p in runs]) for key in runs[0]}
        for client, runs in passes.items()
    }
    rows = [
        [
            f"`{client}`" if client == "judge_many" else "minimal aiohttp loop",
            fmt(cells[client]["questions_per_s"], 2),
            fmt(cells[client]["request_ms"], 1),
            fmt(cells[client]["client_ms_per_question"], 2),
        ]
        for client in CLIENTS
    ]
    ratios = [
        a["questions_per_s"] / b["questions_per_s"]
        for a, b in zip(passes["judge_many"], passes["aiohttp"], strict=True)
    ]
    table = markdown_table(
        ["client (c=1)", "q/s", "request ms (mean per pass)", "client ms per question"], rows
    )
    path = write_results(
        NAME,
        {
            "settings": {"rounds": args.rounds, "questions": args.questions},
            "server": "embedded: Gemma 3 270M Q4_K_M, xllamacpp, n_parallel 16, n_ctx 16384",
            "cells": cells,
            "paired_ratios": ratios,
            "passes": passes,
            "table": table,
        },
    )
    print()
    print(table)
    print()
    print(
        "judge_many / aiohttp per round: "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + f" (median {statistics.median(ratios):.3f})"
    )
    print(f"(figures in {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--questions", type=int, default=32)
    args = parser.parse_args()
    options = tv.ServerOptions(n_parallel=16, n_ctx=16 * 1024)
    with tv.EmbeddedServer(options) as embedded:
        figures = asyncio.run(measure(embedded.url, args.rounds, args.questions))
    report(args, figures["passes"])


if __name__ == "__main__":
    main()
