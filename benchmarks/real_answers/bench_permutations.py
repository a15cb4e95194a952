"""The cost of option-order debiasing on llama.cpp: a judgment of three questions (a Noul, a
four-label Choice, a three-level Score) about a state of a few hundred tokens, read once per
question against ``permutations=k`` (k rotations per question, at most one per option: 2 + 4 +
3 = 9 reads at k=4), with and without prefix reuse, side by side in one run on the embedded
server. The rotations share the state prefix, so with prefix reuse the server takes it from
its slot cache: the figures show how much of the k-fold read count that saves.

Each judgment is about a fresh state (a run id and a ticket number first), and rounds
interleave the modes, so drift hits all of them alike.

    python -m benchmarks.real_answers.bench_permutations [--url URL] [--rounds 6]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from typing import Any

import anyio

import typevet_async as tv
from benchmarks._shared import markdown_table, write_results

BODY = " ".join(
    f"Update {n}: the customer wrote again about order 1182, a parcel that left the warehouse "
    f"late, was charged twice, and arrived with a cracked screen."
    for n in range(10)
)
QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Is a refund requested?"),
    "route": tv.Choice({"billing": None, "shipping": None, "technical": None, "account": None},
                       instructions="Which team should handle this?"),
    "urgency": tv.Score(["can wait", "this week", "today"], instructions="How urgent is this?"),
}  # fmt: skip
MODES: dict[str, dict[str, Any]] = {
    "k=1, prefix reuse off": {"prefix_reuse": "off", "permutations": 1},
    "k=1, prefix reuse auto": {"prefix_reuse": "auto", "permutations": 1},
    "k=4, prefix reuse off": {"prefix_reuse": "off", "permutations": 4},
    "k=4, prefix reuse auto": {"prefix_reuse": "auto", "permutations": 4},
}


async def run(url: str, rounds: int) -> dict[str, Any]:
    timings: dict[str, list[float]] = {mode: [] for mode in MODES}
    usage: dict[str, list[tv.Usage]] = {mode: [] for mode in MODES}
    sessions = {
        mode: tv.Session.llama_cpp(url, max_concurrency=4, **s) for mode, s in MODES.items()
    }
    for session in sessions.values():
        await session.open()
    try:
        run_id, ticket = secrets.token_hex(4), 0
        for round_number in range(rounds + 1):  # the first round warms up and is not counted
            modes = list(sessions.items())
            modes = modes[round_number % len(modes) :] + modes[: round_number % len(modes)]
            for mode, session in modes:
                ticket += 1
                started = time.perf_counter()
                judgment = await session.judge(f"Ticket {run_id}-{ticket}. {BODY}", QUESTIONS)
                if round_number:
                    timings[mode].append(time.perf_counter() - started)
                    usage[mode].append(judgment.usage)
    finally:
        for session in sessions.values():
            await session.aclose()
    base = statistics.median(timings["k=1, prefix reuse auto"])
    rows, figures = [], {}
    for mode, values in timings.items():
        median = statistics.median(values)
        last = usage[mode][-1]
        figures[mode] = {
            "median_ms": median * 1000,
            "min_ms": min(values) * 1000,
            "max_ms": max(values) * 1000,
            "reads": last.reads,
            "prompt_tokens": last.prompt_tokens,
            "cached_tokens": last.cached_tokens,
        }
        rows.append([mode, f"{median * 1000:.0f}", f"{median / base:.2f}", str(last.reads),
                     str(last.prompt_tokens), str(last.cached_tokens)])  # fmt: skip
    print(f"judgments per mode: {rounds}; questions per judgment: {len(QUESTIONS)}")
    header = ["mode", "median ms", "vs k=1 auto", "reads", "prompt tokens", "from cache"]
    print(markdown_table(header, rows))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if args.url:
        figures = anyio.run(run, args.url, args.rounds)
    else:
        with tv.EmbeddedServer(tv.ServerOptions(n_parallel=4, n_ctx=4 * 4096)) as server:
            figures = anyio.run(run, server.url, args.rounds)
    print(write_results("bench_permutations", {"rounds": args.rounds, "modes": figures}))


if __name__ == "__main__":
    main()
