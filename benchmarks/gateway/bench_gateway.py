"""The System One gateway's overhead over a direct session, side by side in one run on the real
llama.cpp server.

Each client sends one Noul question per fresh ticket, ``--requests`` per pass, at concurrency 32
(``asyncio.Semaphore(32)``):

(a) ``direct``: ``await session.judge(ticket, {"refund": Noul})`` on one long-lived
    ``tv.Session.llama_cpp(url, max_concurrency=32)``;
(b) ``gateway aiohttp``: ``POST /v1/systemone`` with a plain aiohttp client (orjson bodies) to
    ``typevet-async serve --base-url URL --max-concurrency 32 --max-active-requests 32 --max-queue
    32``, run as a child process (as it is deployed: its CPU is not the client's);
(c) ``gateway official``: the official async client (``typesafe_sdk.AsyncTypeSafeClient``,
    retries off) to the same gateway;
(d) ``gateway in-process``: the aiohttp client of (b) to the same gateway app run inside the
    benchmark's own process and event loop (``gateway.running`` on a third session of the same
    settings): the gateway's code without the process hop, to tell the two costs apart.

The gateway's session has the direct session's settings, so what (b) adds over (a) is the
gateway: HTTP in and out, the System One wire both ways, a second process. A request's latency
runs from its turn under the semaphore to its answer; p50 and p99 are a pass's, requests/s is
the pass's count over its wall time. ``gateway CPU`` is the child's CPU time (``/proc``) over
the pass, per request. Every pass gets tickets no other pass sent (no prompt-cache advantage);
an untimed batch first fills every server slot. Rounds rotate the clients' order; a cell is the
median over rounds (min-max).

llama.cpp: the embedded server (Gemma 3 270M, 16 slots, as ``bench_clients``) unless ``--url``.

    python -m benchmarks.gateway.bench_gateway [--requests 192] [--rounds 3] [--warm-up 64]
        [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import orjson
import typesafe_sdk as ts

import typevet_async as tv
from benchmarks._shared import (
    ROOT,
    fmt,
    markdown_table,
    percentile,
    spread,
    write_results,
)
from benchmarks.client_cost.bench_clients import Tickets
from typevet_async._apps import gateway
from typevet_async._apps.gateway import GatewayConfig

NAME = "bench_gateway"
CONCURRENCY = 32
CLIENTS = ("direct", "gateway aiohttp", "gateway official", "gateway in-process")
KEY = "bench-gateway-key"
QUESTIONS: dict[str, tv.Question] = {"refund": tv.Noul(instructions="Is a refund requested?")}
WIRE_QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Is a refund requested?"}
}
TIMES = "\u00d7"


@attrs.define
class Pass:
    seconds: float
    latencies: list[float]
    gateway_cpu_s: float | None = None
    errors: list[str] = attrs.Factory(list)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    def latency(self, share: float) -> float:
        return percentile(sorted(self.latencies), share)


class Gateway:
    """``typevet-async serve`` in a child process, over ``url``; ``self.url`` once it listens.

    Its log goes to a file, not a pipe: a thread here reading a pipe line by line would take
    the GIL from the client's event loop on every request it logs.
    """

    def __init__(
        self, url: str, auth: Sequence[str] = ("--keys-env", "BENCH_GATEWAY_KEYS")
    ) -> None:
        command = [
            sys.executable, "-m", "typevet_async._apps.cli", "serve", "--base-url", url,
            "--port", "0", *auth,
            "--max-concurrency", str(CONCURRENCY), "--max-active-requests", str(CONCURRENCY),
            "--max-queue", str(CONCURRENCY), "--request-deadline", "600",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("TYPEVET_")}
        self.log = Path(tempfile.mkdtemp(prefix="bench-gateway-")) / "gateway.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env={**env, "BENCH_GATEWAY_KEYS": KEY},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        self.url = ""
        deadline = time.monotonic() + 120
        while not self.url and self.process.poll() is None and time.monotonic() < deadline:
            found = re.search(r"serving System One on (http://\S+)", self.log.read_text())
            self.url = found[1] if found else ""
            time.sleep(0.1)
        if not self.url:
            self.stop()
            raise SystemExit(f"the gateway did not start; see {self.log}")

    def cpu_seconds(self) -> float:
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def stop(self) -> int:
        """SIGTERM (a graceful shutdown), then its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return code


async def wait_ready(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(600):
        try:
            async with http.get(f"{url}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("the gateway never became ready")


async def timed_pass(
    states: Sequence[str],
    one: Callable[[str], Awaitable[None]],
    gateway: Gateway | None,
    concurrency: int = CONCURRENCY,
) -> Pass:
    """``one`` for every state, ``concurrency`` at a time (32 unless given): each request's
    latency, and the pass's wall time and the gateway's CPU time over it."""
    slots = asyncio.Semaphore(concurrency)
    result = Pass(0.0, [])

    async def guarded(state: str) -> None:
        async with slots:
            started = time.perf_counter()
            try:
                await one(state)
            except Exception as error:
                result.errors.append(repr(error)[:300])
                return
            result.latencies.append(time.perf_counter() - started)

    cpu = gateway.cpu_seconds() if gateway is not None else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(guarded(state) for state in states))
    result.seconds = time.perf_counter() - started
    if gateway is not None:
        result.gateway_cpu_s = gateway.cpu_seconds() - cpu
    return result


class Clients:
    """The three clients, opened once for the whole run (as a service would hold them)."""

    def __init__(
        self, session: tv.Session, http: aiohttp.ClientSession, url: str, in_process_url: str
    ) -> None:
        self.session, self.http, self.url = session, http, url
        self.in_process_url = in_process_url
        self.official = ts.AsyncTypeSafeClient(
            api_key=KEY, base_url=url, retry=ts.RetryPolicy(max_retries=0), timeout=600
        )
        self.headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}

    async def direct(self, state: str) -> None:
        answer = (await self.session.judge(state, QUESTIONS))["refund"]
        assert isinstance(answer, tv.NoulAnswer)
        assert 0.0 <= answer.noul <= 1.0

    async def gateway_aiohttp(self, state: str, url: str | None = None) -> None:
        body = orjson.dumps({"model": "gemma-3-270m", "state": state, "questions": WIRE_QUESTIONS})
        async with self.http.post(
            f"{url or self.url}/v1/systemone", data=body, headers=self.headers
        ) as response:
            raw = await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {raw[:200]!r}")
        assert 0.0 <= orjson.loads(raw)["answers"]["refund"]["noul"] <= 1.0

    async def gateway_in_process(self, state: str) -> None:
        await self.gateway_aiohttp(state, self.in_process_url)

    async def gateway_official(self, state: str) -> None:
        response = await self.official.system_one(state=state, questions=WIRE_QUESTIONS)
        assert 0.0 <= response.nouls["refund"].noul <= 1.0

    def of(self, name: str) -> Callable[[str], Awaitable[None]]:
        return {
            "direct": self.direct,
            "gateway aiohttp": self.gateway_aiohttp,
            "gateway official": self.gateway_official,
            "gateway in-process": self.gateway_in_process,
        }[name]


@contextlib.asynccontextmanager
async def in_process_gateway(url: str) -> AsyncIterator[str]:
    """The gateway app in this process, over its own session of the same settings: its URL."""
    config = GatewayConfig(
        keys=(KEY,), max_active_requests=CONCURRENCY, max_queue=CONCURRENCY, request_deadline=600
    )
    async with gateway.running(
        tv.Session.llama_cpp(url, max_concurrency=CONCURRENCY), config
    ) as at:
        yield at


async def run_rounds(url: str, args: argparse.Namespace) -> tuple[dict[str, list[Pass]], int]:
    fresh = Tickets(int(time.time()) // 60)  # fresh numbers on every run, too
    passes: dict[str, list[Pass]] = {name: [] for name in CLIENTS}
    gateway = Gateway(url)
    try:
        connector = aiohttp.TCPConnector(limit=2 * CONCURRENCY)
        async with (
            tv.Session.llama_cpp(url, max_concurrency=CONCURRENCY) as session,
            aiohttp.ClientSession(connector=connector) as http,
            in_process_gateway(url) as in_process_url,
        ):
            await wait_ready(http, gateway.url)
            await wait_ready(http, in_process_url)
            clients = Clients(session, http, gateway.url, in_process_url)
            try:
                await rounds(clients, gateway, fresh, passes, args)
            finally:
                await clients.official.aclose()
    finally:
        code = gateway.stop()
    return passes, code


async def rounds(
    clients: Clients,
    gateway: Gateway,
    fresh: Tickets,
    passes: dict[str, list[Pass]],
    args: argparse.Namespace,
) -> None:
    # Untimed: every server slot holds a prompt, every client its connections.
    async for _ in clients.session.judge_many(
        fresh.take(args.warm_up), QUESTIONS, max_in_flight=CONCURRENCY
    ):
        pass
    for name in CLIENTS:
        await timed_pass(fresh.take(CONCURRENCY), clients.of(name), None)
    for round_index in range(args.rounds):
        shift = round_index % len(CLIENTS)
        for name in CLIENTS[shift:] + CLIENTS[:shift]:
            watched = gateway if name in ("gateway aiohttp", "gateway official") else None
            result = await timed_pass(fresh.take(args.requests), clients.of(name), watched)
            passes[name].append(result)
            print(
                f"round {round_index + 1} {name:18} {result.rate:5.1f} req/s  p50 "
                f"{result.latency(0.5) * 1000:6.0f} ms  p99 "
                f"{result.latency(0.99) * 1000:6.0f} ms  errors {len(result.errors)}",
                flush=True,
            )


def summarise(passes: dict[str, list[Pass]], args: argparse.Namespace) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    rows = []
    direct = passes["direct"]
    for name in CLIENTS:
        cell = passes[name]
        rate = spread([p.rate for p in cell])
        p50 = spread([p.latency(0.5) * 1000 for p in cell])
        p99 = spread([p.latency(0.99) * 1000 for p in cell])
        # Paired by round: each gateway pass against the direct pass of the same round.
        rate_ratio = spread([p.rate / d.rate for p, d in zip(cell, direct, strict=True)])
        p50_added = spread(
            [(p.latency(0.5) - d.latency(0.5)) * 1000 for p, d in zip(cell, direct, strict=True)]
        )
        cpu = [p.gateway_cpu_s / len(p.latencies) * 1000 for p in cell if p.gateway_cpu_s]
        cells[name] = {
            "requests_per_s": rate,
            "p50_ms": p50,
            "p99_ms": p99,
            "requests_per_s_over_direct": rate_ratio,
            "p50_ms_added_over_direct": p50_added,
            "gateway_cpu_ms_per_request": spread(cpu) if cpu else None,
            "errors": sum(len(p.errors) for p in cell),
            "first_errors": [e for p in cell for e in p.errors][:5],
            "passes": [
                {
                    "seconds": p.seconds,
                    "requests": len(p.latencies),
                    "p50_ms": p.latency(0.5) * 1000,
                    "p99_ms": p.latency(0.99) * 1000,
                    "gateway_cpu_s": p.gateway_cpu_s,
                }
                for p in cell
            ],
        }
        rows.append(
            [
                f"`{name}`",
                fmt(rate, 1),
                fmt(p50),
                fmt(p99),
                "1" if name == "direct" else f"**{rate_ratio['median']:.2f}{TIMES}**",
                "0" if name == "direct" else f"{p50_added['median']:+,.0f}",
                fmt(spread(cpu), 1) if cpu else "-",
            ]
        )
    header = [
        "client", "requests/s", "p50 ms", "p99 ms", "req/s over direct",
        "p50 added, ms", "gateway CPU ms/request",
    ]  # fmt: skip
    return {
        "concurrency": CONCURRENCY,
        "requests_per_pass": args.requests,
        "rounds": args.rounds,
        "cells": cells,
        "table": markdown_table(header, rows),
    }


def run(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    if args.url:
        passes, code = asyncio.run(run_rounds(args.url, args))
        server = args.url
    else:
        options = tv.ServerOptions(n_parallel=16, n_ctx=16 * 1024)
        with tv.EmbeddedServer(options) as embedded:
            passes, code = asyncio.run(run_rounds(embedded.url, args))
        server = "embedded: Gemma 3 270M Q4_K_M, xllamacpp, n_parallel 16, n_ctx 16384"
    summary = summarise(passes, args)
    summary.update(
        server=server,
        gateway_exit_status_after_sigterm=code,
        elapsed_s=round(time.perf_counter() - started, 1),
        load_average_at_end=os.getloadavg(),
    )
    path = write_results(NAME, summary)
    print()
    print(
        f"{args.requests} fresh tickets per pass (one Noul each), concurrency {CONCURRENCY}, "
        f"{args.rounds} rounds, clients rotated; median (min-max); {summary['elapsed_s']:.0f} s; "
        f"gateway exit after SIGTERM: {code}"
    )
    print()
    print(summary["table"])
    failures = {name: cell["errors"] for name, cell in summary["cells"].items() if cell["errors"]}
    if failures:
        print(f"failed requests: {failures}")
    print(f"(figures in {path})")
    if failures or code != 0:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=192, help="per pass")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-up", type=int, default=64, help="untimed first questions")
    parser.add_argument("--url", help="a running llama.cpp server (default: the embedded one)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
