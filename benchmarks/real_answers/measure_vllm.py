"""vLLM figures for the README: batching noise, and agreement with llama.cpp on the same model.

Noise: the largest gap in a candidate's probability between a reference read and the same
messages read (1) alone again, right after (vLLM's prefix cache is always on), (2) while 11
other reads are in flight. Agreement: the largest gap between the two backends' answers for
the same judgments, llama.cpp in reproducible mode and vLLM one read at a time.

    python -m benchmarks.real_answers.measure_vllm --vllm-url URL [--llama-url URL]
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import anyio

import typevet_async as tv
from benchmarks.client_cost.bench_llama_cpp_read import TICKETS

from .measure_noise import QUESTIONS, largest_gap, softmax

MODEL = "gemma3-270m"
STATES: list[Any] = [
    *TICKETS,
    {"subject": "Invoice", "body": "Please send a VAT invoice for order 1182.", "plan": "pro"},
    "Your courier left my parcel in the rain and the book inside is ruined.",
]


async def read(
    http: aiohttp.ClientSession, url: str, content: str, ids: tuple[int, ...]
) -> tuple[float, ...]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "logprobs": True,
        "logprob_token_ids": list(ids),
        "return_tokens_as_token_ids": True,
    }
    async with http.post(f"{url}/v1/chat/completions", json=body) as response:
        payload = await response.json()
    top = {
        int(e["token"].split(":")[1]): e["logprob"]
        for e in payload["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    }
    return softmax([top[i] for i in ids])


async def noise(url: str) -> None:
    async with tv.Session.vllm(url, model=MODEL, max_concurrency=1) as session:
        plans = []
        for state in STATES[:6]:
            plans.extend((await session.judge(state, QUESTIONS)).diagnostics.values())
    alone = batched = 0.0
    async with aiohttp.ClientSession() as http:
        for plan in plans:
            reference = await read(http, url, plan.prompt, plan.token_ids)
            alone = max(
                alone, largest_gap(reference, await read(http, url, plan.prompt, plan.token_ids))
            )
            results: dict[str, tuple[float, ...]] = {}

            async def one(
                key: str, d: tv.Diagnostics, results: dict[str, tuple[float, ...]] = results
            ) -> None:
                results[key] = await read(http, url, d.prompt, d.token_ids)

            async with anyio.create_task_group() as group:
                for n, other in enumerate([p for p in plans if p is not plan][:11]):
                    group.start_soon(one, f"other{n}", other)
                group.start_soon(one, "target", plan)
            batched = max(batched, largest_gap(reference, results["target"]))
    print(f"vLLM prompts: {len(plans)}")
    print(f"vLLM read alone twice (prefix cache on): largest gap {alone:.2e}")
    print(f"vLLM read among 11 in flight:            largest gap {batched:.2e}")


async def agreement(vllm_url: str, llama_url: str) -> None:
    gaps: list[float] = []
    async with (
        tv.Session.llama_cpp(llama_url, reproducible=True) as llama,
        tv.Session.vllm(vllm_url, model=MODEL, max_concurrency=1) as vllm,
    ):
        for state in STATES:
            on_llama = await llama.judge(state, QUESTIONS)
            on_vllm = await vllm.judge(state, QUESTIONS)
            for qid in on_llama:
                a = on_llama[qid].probabilities.values()
                b = on_vllm[qid].probabilities.values()
                gaps.append(max(abs(x - y) for x, y in zip(a, b, strict=True)))
    gaps.sort()
    print(f"cross-backend answers: {len(gaps)}")
    print(f"cross-backend gap: median {gaps[len(gaps) // 2]:.4f}, largest {gaps[-1]:.4f}")


async def run(vllm_url: str, llama_url: str) -> None:
    await noise(vllm_url)
    await agreement(vllm_url, llama_url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--vllm-url", required=True)
    parser.add_argument("--llama-url")
    args = parser.parse_args()
    if args.llama_url:
        anyio.run(run, args.vllm_url, args.llama_url)
        return
    with tv.EmbeddedServer() as server:
        anyio.run(run, args.vllm_url, server.url)


if __name__ == "__main__":
    main()
