"""Peak RSS of the client while 1e4, 1e5 and 1e6 questions stream through ``judge_many``.

Against the replay server (`benchmarks.client_cost.replay_server`: real recorded llama.cpp bodies at
the
``n_probs`` asked for, in a CHILD process). Each size runs in a fresh client process: open
``tv.Session.llama_cpp(url, max_concurrency=64)`` (default read), probe, warm up with a
2,000-question batch, then stream N tickets from a generator (never a list) through
``session.judge_many(..., max_in_flight=64)`` and count the answers. Measured in that process:
the peak RSS (``ru_maxrss``) and the current RSS (``VmRSS``) after the warm-up and after the N
questions, the current RSS at every tenth of the run, and the client CPU per question.

Flat means: the peak after N questions is the same whatever N (within a few MiB).

    python -m benchmarks.client_cost.bench_memory [--sizes 10000 100000 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import typevet_async as tv
from benchmarks._shared import (
    current_rss_kib,
    markdown_table,
    peak_rss_kib,
    run_json_subprocess,
    ticket_stream,
    write_results,
)
from benchmarks.client_cost.replay_server import QUESTIONS, RECORDED_SETTINGS, ReplayServerProcess

NAME = "bench_memory"
IN_FLIGHT = 64
WARM_UP = 2000
FLAT_MIB = 8.0


async def measure(url: str, count: int) -> dict[str, Any]:
    """Client process: stream ``count`` questions and report memory."""
    async with tv.Session.llama_cpp(url, max_concurrency=IN_FLIGHT, **RECORDED_SETTINGS) as session:
        await session.probe()
        async for item in session.judge_many(
            ticket_stream(WARM_UP, start=10**9), QUESTIONS, max_in_flight=IN_FLIGHT
        ):
            if item.judgment is None:
                raise RuntimeError(f"warm-up record {item.index} failed: {item.error!r}")
        peak_before, rss_before = peak_rss_kib(), current_rss_kib()
        samples: list[int] = []
        step = max(count // 10, 1)
        done = failed = 0
        first_error = ""
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        async for item in session.judge_many(
            ticket_stream(count), QUESTIONS, max_in_flight=IN_FLIGHT
        ):
            done += 1
            if item.judgment is None or not isinstance(item.judgment["refund"], tv.NoulAnswer):
                failed += 1
                first_error = first_error or repr(item.error)
            if done % step == 0:
                samples.append(current_rss_kib())
        cpu = time.process_time() - cpu_started
        wall = time.perf_counter() - wall_started
        rss_after = current_rss_kib()
    return {
        "count": count,
        "done": done,
        "failed": failed,
        "first_error": first_error,
        "cpu_us_per_question": cpu / count * 1e6,
        "wall_s": wall,
        "questions_per_s": count / wall,
        "peak_before_kib": peak_before,
        "rss_before_kib": rss_before,
        "peak_after_kib": peak_rss_kib(),
        "rss_after_kib": rss_after,
        "rss_samples_kib": samples,
    }


def run(sizes: list[int]) -> None:
    started = time.perf_counter()
    results = []
    with ReplayServerProcess() as server:
        for count in sizes:
            before = server.stats()["n_probs"]
            result = run_json_subprocess(
                [
                    "benchmarks.client_cost.bench_memory",
                    "--measure",
                    str(count),
                    "--url",
                    server.url,
                ],
                timeout=4 * 3600,
            )
            after = server.stats()["n_probs"]
            result["n_probs_seen"] = {k: v - before.get(k, 0) for k, v in after.items()}
            results.append(result)
            print(
                f"{count:>9}: peak {result['peak_before_kib'] / 1024:.1f} -> "
                f"{result['peak_after_kib'] / 1024:.1f} MiB, {result['wall_s']:.0f} s",
                flush=True,
            )
        stats = server.stats()
    elapsed = time.perf_counter() - started
    mib = 1024
    rows = []
    for r in results:
        growth = (r["peak_after_kib"] - r["peak_before_kib"]) / mib
        tenths = " ".join(f"{s / mib:.0f}" for s in r["rss_samples_kib"])
        k = ", ".join(f"K={k}: {v:,}" for k, v in r["n_probs_seen"].items() if v)
        rows.append(
            [
                f"{r['count']:,}",
                f"{r['wall_s']:,.0f}",
                f"{r['questions_per_s']:,.0f}",
                f"{r['cpu_us_per_question']:,.0f}",
                f"{r['rss_before_kib'] / mib:.1f} / {r['peak_before_kib'] / mib:.1f}",
                f"{r['rss_after_kib'] / mib:.1f} / {r['peak_after_kib'] / mib:.1f}",
                f"{growth:+.1f}",
                tenths,
                k,
            ]
        )
    table = markdown_table(
        [
            "questions", "wall s", "q/s", "CPU µs/q",
            "RSS / peak after warm-up, MiB", "RSS / peak after N, MiB", "peak growth, MiB",
            "RSS at each tenth, MiB", "reads",
        ],
        rows,
    )  # fmt: skip
    verdicts = []
    if len(results) >= 2:
        first, last = results[0], results[-1]
        delta = (last["peak_after_kib"] - first["peak_after_kib"]) / mib
        verdicts.append(
            f"- peak RSS after {last['count']:,} vs after {first['count']:,} questions: "
            f"{delta:+.1f} MiB ({last['count'] // first['count']}x the questions): "
            f"{'flat' if abs(delta) <= FLAT_MIB else 'NOT flat'} (within {FLAT_MIB:.0f} MiB)"
        )
    failed = sum(r["failed"] for r in results)
    path = write_results(
        NAME,
        {
            "settings": {"sizes": sizes, "in_flight": IN_FLIGHT, "warm_up": WARM_UP},
            "results": results,
            "replay_server": stats,
            "elapsed_s": elapsed,
            "table": table,
            "verdicts": verdicts,
        },
    )
    print()
    print(
        f"Replay server in a child process; judge_many, max_in_flight {IN_FLIGHT}, default "
        f"read, one Noul per ticket, tickets from a generator; warm-up {WARM_UP:,} questions "
        f"per client process; {elapsed:.0f} s in all"
    )
    print()
    print(table)
    print()
    print("\n".join(verdicts))
    if failed:
        print(f"FAILED questions: {failed}; the first: {results[0]['first_error']}")
    print(f"(figures in {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--measure", type=int, help="(internal) one size, in this process")
    parser.add_argument("--url", help="(internal)")
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(asyncio.run(measure(args.url, args.measure))), flush=True)
    else:
        run(args.sizes)


if __name__ == "__main__":
    main()
