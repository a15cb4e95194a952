"""What the read cache saves, against the real llama.cpp server (Gemma 3
270M, 4 slots, as the live tests start it), side by side in one run:

(a) 1,000 judgments of 3 questions (a Noul, a 3-label Choice, a 4-level Score) about distinct
    tickets (a run id: none read before) through ``judge_many``: fresh, every read a miss and
    stored in a `MemoryReadCache` and a `SqliteReadCache` alike; then the same 1,000 again
    from the memory cache, and again from a new `SqliteReadCache` object on the same file.
(b) 64 identical questions at once (``asyncio.gather`` of 64 ``judge`` calls of one Noul about
    one ticket, a new ticket each round): with a cache (single flight) and without.

Reads sent are counted on the wire (aiohttp trace hooks on ``POST /completion``), not from the
SDK's usage.

    python -m benchmarks.scale.bench_read_cache [--judgments 1000] [--rounds 5] [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

import typevet_async as tv
from benchmarks._shared import markdown_table, ticket, write_results

NAME = "bench_read_cache"
QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Is a refund requested?"),
    "route": tv.Choice(
        {"billing": "Money matters", "shipping": None, "technical": None},
        instructions="Which team should handle this?",
    ),
    "urgency": tv.Score(
        ["can wait", "this week", "today", "right now"], instructions="How urgent is this?"
    ),
}
SLOTS = 4


class Reads:
    """``POST /completion`` requests sent, counted by aiohttp's trace hooks."""

    def __init__(self) -> None:
        self.sent = 0
        self.config = aiohttp.TraceConfig()
        self.config.on_request_start.append(self._start)

    async def _start(self, _: Any, __: Any, params: aiohttp.TraceRequestStartParams) -> None:
        if params.url.path == "/completion":
            self.sent += 1


async def judgments_pass(url: str, states: list[str], cache: tv.ReadCache | None) -> dict[str, Any]:
    """Every state judged once through ``judge_many``: wall time, reads sent, cache hits."""
    reads = Reads()
    usage = tv.Usage()
    async with tv.Session.llama_cpp(
        url, max_concurrency=SLOTS, cache=cache, http=tv.HttpSettings(trace_configs=[reads.config])
    ) as session:
        await session.probe()  # the probe is not timed
        started = time.perf_counter()
        async for item in session.judge_many(states, QUESTIONS):
            assert item.judgment is not None, item.error
            usage += item.judgment.usage
        seconds = time.perf_counter() - started
    return {
        "judgments": len(states),
        "seconds": seconds,
        "judgments_per_s": len(states) / seconds,
        "reads_sent": reads.sent,
        "cache_hits": usage.cache_hits,
        "prompt_tokens": usage.prompt_tokens,
    }


class BothCaches:
    """The fresh pass's cache: every read stored in the memory and the SQLite cache alike (and
    looked up in the memory one, where nothing is yet), so one fresh pass fills both."""

    def __init__(self, memory: tv.MemoryReadCache, sqlite: tv.SqliteReadCache) -> None:
        self.memory, self.sqlite = memory, sqlite

    async def get(self, key: str) -> bytes | None:
        return await self.memory.get(key)

    async def put(self, key: str, value: bytes) -> None:
        await self.memory.put(key, value)
        await self.sqlite.put(key, value)


async def fresh_and_cached(url: str, count: int, folder: Path) -> dict[str, Any]:
    run = secrets.token_hex(4)  # tickets no earlier run has read
    states = [f"Ticket {run}-{n}. {ticket(n)}" for n in range(count)]
    memory, path = tv.MemoryReadCache(max_entries=4 * count), folder / "reads.db"
    modes: dict[str, Any] = {}
    async with tv.SqliteReadCache(path) as sqlite:
        fresh = await judgments_pass(url, states, BothCaches(memory, sqlite))
    modes["fresh (every read a miss, stored in both caches)"] = fresh
    modes["re-run from the memory cache"] = await judgments_pass(url, states, memory)
    async with tv.SqliteReadCache(path) as sqlite:  # a new store object: the file
        modes["re-run from the SQLite cache"] = await judgments_pass(url, states, sqlite)
    modes["re-run from the SQLite cache"]["file_bytes"] = path.stat().st_size
    return modes


async def identical_at_once(url: str, rounds: int, copies: int = 64) -> dict[str, Any]:
    """``copies`` identical one-Noul judgments at once, a new ticket each round; with a cache
    (single flight) and without, rounds interleaved."""
    ask = {"refund": QUESTIONS["refund"]}
    figures: dict[str, dict[str, list[float]]] = {}
    run = secrets.token_hex(4)
    for round_number in range(rounds + 1):  # the first round warms up, not counted
        for mode in ("no cache", "memory cache (single flight)"):
            state = f"Ticket {run}-{round_number}-{mode[:2]}. {ticket(round_number)}"
            reads = Reads()
            cache = tv.MemoryReadCache() if mode != "no cache" else None
            async with tv.Session.llama_cpp(
                url,
                max_concurrency=SLOTS,
                cache=cache,
                http=tv.HttpSettings(trace_configs=[reads.config]),
            ) as session:
                await session.probe()
                started = time.perf_counter()
                judgments = await asyncio.gather(
                    *(session.judge(state, ask) for _ in range(copies))
                )
                seconds = time.perf_counter() - started
            assert len({j["refund"].probabilities["true"] for j in judgments}) >= 1
            if round_number:
                entry = figures.setdefault(mode, {"seconds": [], "reads_sent": []})
                entry["seconds"].append(seconds)
                entry["reads_sent"].append(reads.sent)
    return {
        mode: {
            "copies": copies,
            "median_ms": statistics.median(entry["seconds"]) * 1000,
            "min_ms": min(entry["seconds"]) * 1000,
            "max_ms": max(entry["seconds"]) * 1000,
            "reads_sent": entry["reads_sent"],
        }
        for mode, entry in figures.items()
    }


def tables(figures: dict[str, Any]) -> dict[str, str]:
    fresh = figures["judgments"]["fresh (every read a miss, stored in both caches)"]["seconds"]
    rows = [
        [mode, f"{row['judgments']:,}", f"{row['seconds']:,.2f}", f"{row['judgments_per_s']:,.1f}",
         f"{row['reads_sent']:,}", f"{row['cache_hits']:,}", f"{fresh / row['seconds']:,.1f}x"]
        for mode, row in figures["judgments"].items()
    ]  # fmt: skip
    header = ["pass", "judgments", "wall s", "judgments/s", "reads sent", "cache hits",
              "vs fresh"]  # fmt: skip
    without = figures["identical"]["no cache"]["median_ms"]
    once = [
        [mode, str(row["copies"]), f"{row['median_ms']:,.0f} ({row['min_ms']:,.0f}-"
         f"{row['max_ms']:,.0f})", ", ".join(map(str, row["reads_sent"])),
         f"{without / row['median_ms']:,.1f}x"]
        for mode, row in figures["identical"].items()
    ]  # fmt: skip
    once_header = ["mode", "identical judgments at once", "wall ms, median (min-max)",
                   "reads sent, each round", "vs no cache"]  # fmt: skip
    return {
        "fresh_and_from_the_cache": markdown_table(header, rows),
        "identical_questions_at_once": markdown_table(once_header, once),
    }


async def run(url: str, judgments: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        figures = {"judgments": await fresh_and_cached(url, judgments, Path(folder))}
    figures["identical"] = await identical_at_once(url, rounds)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--judgments", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", help="a llama.cpp server (default: the embedded one)")
    args = parser.parse_args()
    if args.url:
        figures = asyncio.run(run(args.url, args.judgments, args.rounds))
    else:
        options = tv.ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=SLOTS)
        with tv.EmbeddedServer(options) as server:
            figures = asyncio.run(run(server.url, args.judgments, args.rounds))
    rendered = tables(figures)
    for text in rendered.values():
        print(text, end="\n\n")
    server = args.url or "embedded: Gemma 3 270M Q4_K_M, gemma template, n_parallel 4, n_ctx 8192"
    print(write_results(NAME, {
        "judgments": args.judgments, "rounds": args.rounds, "server": server,
        "questions_per_judgment": len(QUESTIONS), "figures": figures, "tables": rendered,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
