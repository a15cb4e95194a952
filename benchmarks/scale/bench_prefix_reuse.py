"""Prefix reuse on llama.cpp: a judgment of 8 questions about a long state (several hundred
tokens), per-judgment latency in the default layout without prefix reuse, with each strategy,
and in Jev's ``split`` layout, side by side in one run (the embedded server, which runs with
a full-size sliding-window cache so that llama.cpp can reuse a prefix at all).

Each judgment is about a fresh state (a new ticket id first, unique to the run), so no
judgment finds an earlier one's state cached. Rounds interleave the modes so drift hits
all of them alike.

    python -m benchmarks.scale.bench_prefix_reuse [--url URL] [--rounds 4]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time

import anyio

import typevet_async as tv

BODY = " ".join(
    f"Update {n}: the customer wrote again about order 1182, a parcel that left the warehouse "
    f"late, was charged twice, and arrived with a cracked screen."
    for n in range(14)
)
QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Is a refund requested?"),
    "angry": tv.Noul(instructions="Is the customer angry?"),
    "damaged": tv.Noul(instructions="Did something arrive damaged?"),
    "repeat": tv.Noul(instructions="Has the customer written before?"),
    "route": tv.Choice({"billing": None, "shipping": None, "technical": None},
                       instructions="Which team should handle this?"),
    "channel": tv.Choice({"email": None, "phone": None, "chat": None},
                         instructions="How should we reply?"),
    "urgency": tv.Score(["can wait", "this week", "today", "right now"],
                        instructions="How urgent is this?"),
    "severity": tv.Score(["minor", "moderate", "major"], instructions="How severe is it?"),
}  # fmt: skip
MODES: dict[str, dict[str, str]] = {
    "default, no prefix reuse": {"prefix_reuse": "off"},
    "default, first then rest": {"prefix_reuse": "first"},
    "default, sequential": {"prefix_reuse": "sequential"},
    "default, auto (default)": {"prefix_reuse": "auto"},
    "split, auto": {"prefix_reuse": "auto", "layout": "split"},
}


async def run(url: str, rounds: int) -> None:
    timings: dict[str, list[float]] = {mode: [] for mode in MODES}
    tokens: dict[str, list[tuple[int, int]]] = {mode: [] for mode in MODES}
    sessions = {
        mode: tv.Session.llama_cpp(url, max_concurrency=4, **s) for mode, s in MODES.items()
    }
    for session in sessions.values():
        await session.open()
    try:
        ticket = 0
        run_id = secrets.token_hex(4)  # no state of an earlier run can be in the server's cache
        for _ in range(rounds):
            for mode, session in sessions.items():
                ticket += 1
                started = time.perf_counter()
                judgment = await session.judge(f"Ticket {run_id}-{ticket}. {BODY}", QUESTIONS)
                timings[mode].append(time.perf_counter() - started)
                tokens[mode].append((judgment.usage.prompt_tokens, judgment.usage.cached_tokens))
    finally:
        for session in sessions.values():
            await session.aclose()
    base = statistics.median(timings["default, no prefix reuse"])
    print(f"judgments per mode: {rounds}; questions per judgment: {len(QUESTIONS)}")
    for mode, values in timings.items():
        median = statistics.median(values)
        prompt, cached = tokens[mode][-1]
        print(
            f"{mode:26} median {median * 1000:6.0f} ms  ratio {median / base:4.2f}  "
            f"(last: {prompt} prompt tokens, {cached} from cache)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.url:
        anyio.run(run, args.url, args.rounds)
        return
    with tv.EmbeddedServer(tv.ServerOptions(n_parallel=4, n_ctx=4 * 4096)) as server:
        anyio.run(run, server.url, args.rounds)


if __name__ == "__main__":
    main()
