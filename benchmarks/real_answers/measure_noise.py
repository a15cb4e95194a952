"""How much llama.cpp's answers move with batching and prompt-cache reuse, and what the
reproducible mode costs. Figures for the README's "Reproducibility" section.

Noise is reported as the largest difference in a candidate's probability (softmax over the
candidates, which is what an answer reports) between a reference read and the same prompt read
(1) alone again, (2) while 11 other reads are in flight, (3) after its prefix was cached.

    python -m benchmarks.real_answers.measure_noise [--url URL]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import anyio

import typevet_async as tv
from benchmarks.client_cost.bench_llama_cpp_read import QUESTION, TICKETS

QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Is a refund requested?"),
    **QUESTION,
    "urgency": tv.Score(["can wait", "this week", "today", "right now"], instructions="Urgency?"),
}


async def candidate_probabilities(
    http: aiohttp.ClientSession, url: str, prompt: str, ids: tuple[int, ...], *, cache: bool
) -> tuple[float, ...]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": 0,
        "n_probs": 4096,
        "cache_prompt": cache,
    }
    async with http.post(f"{url}/completion", json=body) as response:
        payload = await response.json()
    top = {e["id"]: e["logprob"] for e in payload["completion_probabilities"][0]["top_logprobs"]}
    return softmax([top[i] for i in ids])


def softmax(logprobs: Sequence[float]) -> tuple[float, ...]:
    """Softmax over the candidates (what an answer reports), computed here."""
    top = max(logprobs)
    weights = [math.exp(value - top) for value in logprobs]
    total = math.fsum(weights)
    return tuple(weight / total for weight in weights)


def largest_gap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


async def noise(url: str) -> None:
    async with tv.Session.llama_cpp(url, reproducible=True) as session:
        plans = []
        for ticket in TICKETS:
            judgment = await session.judge(ticket, QUESTIONS)
            plans.extend(judgment.diagnostics.values())
    alone = batched = cached = 0.0
    async with aiohttp.ClientSession() as http:
        for plan in plans:
            reference = await candidate_probabilities(
                http, url, plan.prompt, plan.token_ids, cache=False
            )
            again = await candidate_probabilities(
                http, url, plan.prompt, plan.token_ids, cache=False
            )
            alone = max(alone, largest_gap(reference, again))
            others = [p for p in plans if p is not plan][:11]
            results: dict[str, tuple[float, ...]] = {}

            async def read(
                key: str, d: tv.Diagnostics, results: dict[str, tuple[float, ...]] = results
            ) -> None:
                results[key] = await candidate_probabilities(
                    http, url, d.prompt, d.token_ids, cache=False
                )

            async with anyio.create_task_group() as group:
                for n, other in enumerate(others):
                    group.start_soon(read, f"other{n}", other)
                group.start_soon(read, "target", plan)
            batched = max(batched, largest_gap(reference, results["target"]))
            await candidate_probabilities(http, url, plan.prompt, plan.token_ids, cache=True)
            warm = await candidate_probabilities(http, url, plan.prompt, plan.token_ids, cache=True)
            cached = max(cached, largest_gap(reference, warm))
    print(f"prompts: {len(plans)}")
    print(f"read alone twice:             largest gap {alone:.2e}")
    print(f"read among 11 in flight:      largest gap {batched:.2e}")
    print(f"read after its prefix cached: largest gap {cached:.2e}")


async def cost(url: str, rounds: int) -> None:
    timings: dict[str, list[float]] = {"default": [], "reproducible": []}
    async with (
        tv.Session.llama_cpp(url, max_concurrency=4) as default,
        tv.Session.llama_cpp(url, reproducible=True) as reproducible,
    ):
        for _ in range(rounds):
            for n, ticket in enumerate(TICKETS):
                for name, session in (("default", default), ("reproducible", reproducible)):
                    started = time.perf_counter()
                    await session.judge(f"{ticket} (round {n})", QUESTIONS)
                    timings[name].append(time.perf_counter() - started)
    default_ms = statistics.median(timings["default"]) * 1000
    reproducible_ms = statistics.median(timings["reproducible"]) * 1000
    print(f"judgment of 3 questions, default (cap 4, prompt cache): median {default_ms:.0f} ms")
    print(
        f"judgment of 3 questions, reproducible:                  median {reproducible_ms:.0f} ms"
    )
    print(f"reproducible / default: {reproducible_ms / default_ms:.2f}x")


async def run(url: str) -> None:
    await noise(url)
    await cost(url, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url")
    args = parser.parse_args()
    if args.url:
        anyio.run(run, args.url)
        return
    with tv.EmbeddedServer(tv.ServerOptions(n_parallel=12, n_ctx=12 * 1024)) as server:
        anyio.run(run, server.url)


if __name__ == "__main__":
    main()
