"""The gateway's overhead over a direct session per request, System One (``POST
/v1/systemone``) and Decisions (``POST /v1/decisions``), at concurrency 1 and 32, measured side
by side in one run, as ratios over the direct session of the same round.

Three clients send one Noul question per fresh ticket (a predicate on the Decisions wire):

(a) ``direct``: ``await session.judge(ticket, {"refund": Noul})`` on one long-lived
    ``tv.Session.llama_cpp(url, max_concurrency=32)``;
(b) ``systemone``: ``POST /v1/systemone`` with a plain aiohttp client (orjson bodies) to
    ``typevet-async serve`` over the same upstream with the same session settings, run as a
    child process (as deployed: its CPU is not the client's; `bench_gateway.Gateway`);
(c) ``decisions``: ``POST /v1/decisions``, the same client, the same gateway.

Both wires go through the same client code, so (b) and (c) differ only in the wire. At
concurrency 1 the clients run side by side, request by request: each of ``--requests`` fresh
tickets is asked by all three in turn (the order alternating), so a burst of load on the
shared machine falls on all three alike (pass after pass, such bursts once made one wire look
twice as slow as the other; interleaved, the two wires measured the same). At concurrency 32
each client sends ``4 x --requests`` tickets in a pass of its own (32 at once cannot be
interleaved without sharing the upstream). Per pass: the time per request (the requests'
summed latency at 1, the pass's wall time over its requests at 32), p50, and the gateway's
CPU per request (the child's ``/proc`` times; at concurrency 1 shared between the two wires by
their request counts). A ratio pairs each gateway pass with the direct pass of the same round
and concurrency; a cell is the median over rounds (min-max); rounds rotate the clients' order.

Two upstreams, one after the other in the same run:

- ``replay``: `benchmarks.client_cost.replay_server` with ``--derive`` in a child process (real
  recorded llama.cpp bodies, answered at once, each read marked by its prompt): no model time, so
  the ratio is the gateway's own cost against the SDK's own cost (an upper bound of the overhead);
- ``gemma``: the real llama.cpp server (the embedded one, Gemma 3 270M, 4 slots as the live
  tests start it): what the overhead is next to a real model's time on this machine.

    python -m benchmarks.gateway.bench_gateway_overhead [--requests 40] [--rounds 3]
        [--upstreams replay,gemma]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import aiohttp
import orjson

import typevet_async as tv
from benchmarks._shared import fmt, markdown_table, spread, write_results
from benchmarks.client_cost.bench_clients import Tickets
from benchmarks.client_cost.replay_server import ReplayServerProcess
from benchmarks.gateway.bench_gateway import KEY, Gateway, Pass, timed_pass, wait_ready

NAME = "bench_gateway_overhead"
CLIENTS = ("direct", "systemone", "decisions")
CONCURRENCIES = (1, 32)
QUESTIONS: dict[str, tv.Question] = {"refund": tv.Noul(instructions="Is a refund requested?")}
SYSTEM_ONE = {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}
DECISIONS = [{"type": "predicate", "name": "refund", "instructions": "Is a refund requested?"}]
TIMES = "\u00d7"


class Clients:
    """The three clients, opened once for the whole run (as a service would hold them)."""

    def __init__(self, session: tv.Session, http: aiohttp.ClientSession, url: str) -> None:
        self.session, self.http, self.url = session, http, url
        self.headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}

    async def direct(self, state: str) -> None:
        answer = (await self.session.judge(state, QUESTIONS))["refund"]
        assert isinstance(answer, tv.NoulAnswer)

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        async with self.http.post(
            f"{self.url}{path}", data=orjson.dumps(body), headers=self.headers
        ) as response:
            raw = await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {raw[:200]!r}")
        return orjson.loads(raw)

    async def systemone(self, state: str) -> None:
        body = {"model": "gemma-3-270m", "state": state, "questions": SYSTEM_ONE}
        assert 0.0 <= (await self._post("/v1/systemone", body))["answers"]["refund"]["noul"] <= 1
        return None

    async def decisions(self, state: str) -> None:
        body = {"model": "gemma-3-270m", "input": state, "questions": DECISIONS}
        answer = (await self._post("/v1/decisions", body))["answers"][0]
        assert answer["type"] == "predicate"
        assert 0.0 <= answer["probability"] <= 1.0

    def of(self, name: str) -> Callable[[str], Awaitable[None]]:
        return {"direct": self.direct, "systemone": self.systemone, "decisions": self.decisions}[
            name
        ]


async def interleaved_pass(
    states: Sequence[str], clients: Clients, order: Sequence[str], gateway: Gateway
) -> dict[str, Pass]:
    """Concurrency 1, side by side: each state asked by every client in turn (the order
    alternating from one state to the next), so a burst of load on the shared machine falls on
    all three alike. Each client's latencies; its pass time is their sum; the gateway's CPU
    is shared out between the two gateway clients by their request counts."""
    passes = {name: Pass(0.0, []) for name in order}
    cpu = gateway.cpu_seconds()
    for n, state in enumerate(states):
        for name in order if n % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            try:
                await clients.of(name)(state)
            except Exception as error:
                passes[name].errors.append(repr(error)[:300])
                continue
            elapsed = time.perf_counter() - started
            passes[name].latencies.append(elapsed)
            passes[name].seconds += elapsed
    used = gateway.cpu_seconds() - cpu
    gateway_requests = sum(len(passes[name].latencies) for name in order if name != "direct")
    for name in order:
        if name != "direct" and gateway_requests:
            passes[name].gateway_cpu_s = used * len(passes[name].latencies) / gateway_requests
    return passes


Cells = dict[tuple[str, int], list[Pass]]


async def run_upstream(url: str, args: argparse.Namespace) -> tuple[Cells, int]:
    """Every round's passes over the upstream at ``url``, and the gateway's exit status."""
    fresh = Tickets(int(time.time()) // 60)
    cells: Cells = {(name, c): [] for name in CLIENTS for c in CONCURRENCIES}
    gateway = Gateway(url)
    try:
        connector = aiohttp.TCPConnector(limit=64)
        async with (
            tv.Session.llama_cpp(url, max_concurrency=32) as session,
            aiohttp.ClientSession(connector=connector) as http,
        ):
            await wait_ready(http, gateway.url)
            clients = Clients(session, http, gateway.url)
            for name in CLIENTS:  # untimed: connections open, server slots warm
                await timed_pass(fresh.take(32), clients.of(name), None, 32)
            for round_index in range(args.rounds):
                shift = round_index % len(CLIENTS)
                order = CLIENTS[shift:] + CLIENTS[:shift]
                single = await interleaved_pass(fresh.take(args.requests), clients, order, gateway)
                for name in order:
                    cells[(name, 1)].append(single[name])
                    report(round_index, name, 1, single[name])
                for name in order:
                    watched = None if name == "direct" else gateway
                    result = await timed_pass(
                        fresh.take(4 * args.requests), clients.of(name), watched, 32
                    )
                    cells[(name, 32)].append(result)
                    report(round_index, name, 32, result)
    finally:
        code = gateway.stop()
    return cells, code


def report(round_index: int, name: str, concurrency: int, result: Pass) -> None:
    print(
        f"round {round_index + 1} {name:10} c={concurrency:<2} "
        f"{_per_request(result) * 1000:7.2f} ms/request  p50 {result.latency(0.5) * 1000:7.2f} "
        f"ms  errors {len(result.errors)}",
        flush=True,
    )


def _per_request(p: Pass) -> float:
    return p.seconds / max(1, len(p.latencies))


def summarise(cells: Cells) -> tuple[dict[str, Any], str]:
    """Each cell's figures and ratios over direct (paired by round), and the table."""
    figures: dict[str, Any] = {}
    rows = []
    for concurrency in CONCURRENCIES:
        direct = cells[("direct", concurrency)]
        for name in CLIENTS:
            passes = cells[(name, concurrency)]
            paired = list(zip(passes, direct, strict=True))
            per_request = spread([_per_request(p) * 1000 for p in passes])
            p50 = spread([p.latency(0.5) * 1000 for p in passes])
            ratio = spread([_per_request(p) / _per_request(d) for p, d in paired])
            p50_ratio = spread([p.latency(0.5) / d.latency(0.5) for p, d in paired])
            cpu = [p.gateway_cpu_s / len(p.latencies) * 1000 for p in passes if p.gateway_cpu_s]
            figures[f"{name} c{concurrency}"] = {
                "ms_per_request": per_request, "p50_ms": p50,
                "time_per_request_over_direct": ratio, "p50_over_direct": p50_ratio,
                "gateway_cpu_ms_per_request": spread(cpu) if cpu else None,
                "errors": sum(len(p.errors) for p in passes),
                "first_errors": [e for p in passes for e in p.errors][:5],
            }  # fmt: skip
            rows.append([
                f"`{name}`", str(concurrency), fmt(per_request, 2), fmt(p50, 2),
                "1" if name == "direct" else f"**{ratio['median']:.2f}{TIMES}** "
                f"({ratio['min']:.2f}-{ratio['max']:.2f})",
                "1" if name == "direct" else f"{p50_ratio['median']:.2f}{TIMES}",
                fmt(spread(cpu), 2) if cpu else "-",
            ])  # fmt: skip
    header = [
        "client", "concurrency", "ms per request", "p50 ms", "time per request over direct",
        "p50 over direct", "gateway CPU ms/request",
    ]  # fmt: skip
    return figures, markdown_table(header, rows)


def upstreams(names: Sequence[str]) -> Iterator[tuple[str, str, Any]]:
    """Each upstream's name, description and a context manager yielding its URL."""
    for name in names:
        if name == "replay":
            yield (
                name,
                "benchmarks.client_cost.replay_server --derive (recorded bodies, no model time)",
                (ReplayServerProcess(derive=True)),
            )
        elif name == "gemma":
            options = tv.ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=4)
            yield (
                name,
                "embedded llama.cpp (xllamacpp), Gemma 3 270M Q4_K_M, 4 slots",
                (tv.EmbeddedServer(options)),
            )
        else:
            raise SystemExit(f"unknown upstream {name!r}: replay or gemma")


def run(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    results: dict[str, Any] = {}
    tables: dict[str, str] = {}
    failed = False
    for name, described, server in upstreams(args.upstreams.split(",")):
        with server as running:
            cells, code = asyncio.run(run_upstream(running.url, args))
        figures, table = summarise(cells)
        results[name] = {"server": described, "cells": figures, "gateway_exit_status": code}
        tables[f"{name}_upstream"] = f"{described}.\n\n{table}"
        failed |= code != 0 or any(cell["errors"] for cell in figures.values())
        print(f"\n{described}\n\n{table}\n", flush=True)
    path = write_results(
        NAME,
        {
            "rounds": args.rounds,
            "concurrency": "1 and 32",
            "requests_per_pass": {"1": args.requests, "32": 4 * args.requests},
            "upstreams": results,
            "tables": tables,
            "elapsed_s": round(time.perf_counter() - started, 1),
            "load_average_at_end": os.getloadavg(),
            "note": "gateway in a child process (typevet-async serve), one Noul per request, "
            "plain aiohttp client for both wires; concurrency 1 interleaved request by "
            "request; ratios paired by round",
        },
    )
    print(f"(figures in {path})")
    if failed:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=40, help="per pass at concurrency 1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--upstreams", default="replay,gemma", help="replay, gemma or both")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
