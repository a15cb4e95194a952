"""Two endpoints against one, where the servers are the bottleneck: a SIMULATION.

Two llama.cpp servers on this machine's 2 cores share the same CPUs, so they cannot show what
a second replica buys. The servers here are `benchmarks.client_cost.replay_server`'s simulation
instead: each answers every endpoint the SDK reads with real recorded llama.cpp bodies, but holds
each
``/completion`` for a fixed service time in one of a fixed number of slots (reads beyond them
queue, as llama.cpp's do). So a server of S slots and service time T serves at most S / T reads
a second, whatever the client, and a second endpoint can double that.

Side by side in one run, rounds rotated: ``judge_many`` of the same records with one Noul each,
``max_in_flight`` = ``max_concurrency`` = twice the slots of both servers together, on
``tv.Session.llama_cpp(url)`` (one endpoint) and ``tv.Session.llama_cpp([url1, url2])`` (two).
Cells are medians over rounds (min-max); the answers of both must be equal record by record.

    python -m benchmarks.scale.bench_fleet [--rounds 3] [--records 600] [--service-time 0.05]
        [--slots 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import typevet_async as tv
from benchmarks._shared import fmt, markdown_table, spread, ticket_stream, write_results
from benchmarks.client_cost.replay_server import QUESTIONS, replay_servers

NAME = "bench_fleet"
TARGET_RATIO = 1.9


async def one_pass(urls: list[str], records: int, in_flight: int) -> dict[str, Any]:
    base_url: str | list[str] = urls[0] if len(urls) == 1 else urls
    answers: list[float] = []
    async with tv.Session.llama_cpp(base_url, max_concurrency=in_flight) as session:
        await session.probe()
        started = time.perf_counter()
        async for item in session.judge_many(
            ticket_stream(records), QUESTIONS, max_in_flight=in_flight
        ):
            if item.judgment is None:
                raise RuntimeError(f"record {item.index} failed: {item.error!r}")
            answer = item.judgment["refund"]
            assert isinstance(answer, tv.NoulAnswer)
            answers.append(answer.noul)
        elapsed = time.perf_counter() - started
    return {"records_per_s": records / elapsed, "wall_s": elapsed, "answers": answers}


async def run(args: argparse.Namespace) -> None:
    in_flight = 2 * 2 * args.slots
    passes = {"one endpoint": 1, "two endpoints": 2}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in passes}
    with replay_servers(2, service_time=args.service_time, slots=args.slots) as servers:
        urls = [server.url for server in servers]
        for round_number in range(args.rounds):
            order = list(passes) if round_number % 2 == 0 else list(passes)[::-1]
            for name in order:
                result = await one_pass(urls[: passes[name]], args.records, in_flight)
                results[name].append(result)
                print(f"round {round_number + 1} {name:14s} {result['records_per_s']:7.1f} rec/s")
        stats = [server.stats() for server in servers]
    one, two = results["one endpoint"], results["two endpoints"]
    same = all(a["answers"] == b["answers"] for a, b in zip(one, two, strict=True))
    ratios = [b["records_per_s"] / a["records_per_s"] for a, b in zip(one, two, strict=True)]
    ceiling = args.slots / args.service_time
    rows = [
        [name, str(passes[name]), fmt(spread([r["records_per_s"] for r in results[name]]), 1),
         f"{passes[name] * ceiling:,.0f}"]
        for name in passes
    ]  # fmt: skip
    table = markdown_table(["session", "endpoints", "records/s", "servers' ceiling"], rows)
    ratio = statistics.median(ratios)
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    print(
        f"\nSimulated servers: {args.slots} slots, {args.service_time * 1000:.0f} ms per read; "
        f"{args.records} records x 1 Noul, {in_flight} in flight; {args.rounds} rounds, "
        "median (min-max)\n"
    )
    print(table)
    print(
        f"\n- two endpoints / one: {ratio:.2f}x (per round {', '.join(f'{r:.2f}' for r in ratios)};"
        f" target >= {TARGET_RATIO}x): {verdict}\n- answers equal record by record: {same}"
    )
    path = write_results(
        NAME,
        {
            "settings": vars(args) | {"in_flight": in_flight},
            "rounds": {
                name: [{k: v for k, v in r.items() if k != "answers"} for r in rs]
                for name, rs in results.items()
            },
            "ratio_median": ratio,
            "ratios": ratios,
            "answers_equal": same,
            "servers": stats,
            "table": table,
        },
    )
    print(f"(figures in {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=600)
    parser.add_argument("--service-time", type=float, default=0.05)
    parser.add_argument("--slots", type=int, default=4)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
