"""Per-question latency: the SDK's exact top-K read vs the earlier system's whole-vocabulary read.

Same server, same prompts, same conditions (no prompt cache, one read at a time), interleaved
so drift hits both sides alike. (a) is `session.judge` with one question; (b) is
`POST /completion` with ``n_probs`` = the whole vocabulary, parsed with the standard ``json``
module, which is what the earlier typevet did.

    python -m benchmarks.client_cost.bench_llama_cpp_read            # starts the embedded server
    python -m benchmarks.client_cost.bench_llama_cpp_read --url URL  # or uses a running one
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import aiohttp
import anyio

import typevet_async as tv

TICKETS = [
    "I was charged twice for my order and need a refund today.",
    "My parcel has been stuck in transit for three weeks. Where is it?",
    "The app crashes every time I open the settings page on Android.",
    "Thanks, the replacement arrived and works perfectly!",
    "Please send a VAT invoice for order 1182, our accountant needs it by Friday.",
    "I cannot log in since the password reset; the link says it expired.",
]
QUESTION = {
    "route": tv.Choice(
        {"billing": "Money matters", "shipping": "Parcels", "technical": "Bugs"},
        instructions="Which team should handle this?",
    )
}


async def sdk_read(session: tv.Session, ticket: str) -> tuple[float, tv.Diagnostics]:
    started = time.perf_counter()
    judgment = await session.judge(ticket, QUESTION)
    return time.perf_counter() - started, judgment.diagnostics["route"]


async def whole_vocabulary_read(
    http: aiohttp.ClientSession, url: str, prompt: str, token_ids: tuple[int, ...]
) -> tuple[float, list[float], int]:
    started = time.perf_counter()
    body = {"prompt": prompt, "n_predict": 0, "n_probs": 262_144, "cache_prompt": False}
    async with http.post(f"{url}/completion", json=body) as response:
        raw = await response.read()
    payload = json.loads(raw)
    top = {e["id"]: e["logprob"] for e in payload["completion_probabilities"][0]["top_logprobs"]}
    elapsed = time.perf_counter() - started
    return elapsed, [top[t] for t in token_ids], len(raw)


async def run(url: str, rounds: int) -> None:
    sdk_times: list[float] = []
    full_times: list[float] = []
    max_diff = 0.0
    top_k = 0
    async with (
        tv.Session.llama_cpp(url, reproducible=True) as session,
        aiohttp.ClientSession() as http,
    ):
        await sdk_read(session, "warm-up")
        for _ in range(rounds):
            for ticket in TICKETS:
                sdk_time, diagnostics = await sdk_read(session, ticket)
                full_time, logprobs, size = await whole_vocabulary_read(
                    http, url, diagnostics.prompt, diagnostics.token_ids
                )
                top_k = diagnostics.top_k
                sdk_times.append(sdk_time)
                full_times.append(full_time)
                diffs = (abs(a - b) for a, b in zip(diagnostics.logprobs, logprobs, strict=True))
                max_diff = max(max_diff, *diffs)
    sdk, full = statistics.median(sdk_times), statistics.median(full_times)
    print(f"reads per side: {len(sdk_times)} ({rounds} rounds x {len(TICKETS)} prompts)")
    print(f"(a) SDK exact read (top-{top_k}): median {sdk * 1000:.0f} ms per question")
    print(
        f"(b) whole vocabulary + json.loads ({size / 1e6:.1f} MB):"
        f" median {full * 1000:.0f} ms per question"
    )
    print(f"ratio (b)/(a): {full / sdk:.1f}x")
    print(f"largest candidate logprob difference between (a) and (b): {max_diff:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--url", help="a running llama.cpp server (default: start the embedded one)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.url:
        anyio.run(run, args.url, args.rounds)
        return
    with tv.EmbeddedServer() as server:
        anyio.run(run, server.url, args.rounds)


if __name__ == "__main__":
    main()
