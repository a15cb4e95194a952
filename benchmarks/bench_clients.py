"""Scoring-read throughput of three clients against one real llama.cpp server, side by side.

Same server, same prompts (short support tickets, one Noul question each), at concurrency 1, 4
and 16, in one run:

(a) the SDK: ``session.judge_many(tickets, ..., max_in_flight=c)`` with ``max_concurrency=c``;
(b) a minimal hand-written aiohttp loop under ``asyncio.Semaphore(c)`` that POSTs the very
    ``/completion`` bodies the SDK sends (prefixes taken from a first SDK pass), parses the
    JSON with orjson and picks the two candidates' logprobs: the floor for any client;
(c) the ``openai`` package: ``chat.completions.create(max_tokens=1, logprobs=True,
    top_logprobs=20)`` on llama.cpp's ``/v1/chat/completions`` with the same user content,
    under ``asyncio.Semaphore(c)``: what users write today.

Every pass builds its client, warms it up (the SDK's probe and one judgment; one request for
the others) and only then times its requests. Rounds rotate the clients' order so drift hits
all of them alike; a cell is the median over rounds. ``cached`` is the share of prompt tokens
the server took from its prompt cache, as each response reported it.

    python -m benchmarks.bench_clients [--url URL] [--questions 96] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import attrs
import orjson
from openai import AsyncOpenAI

import typevet_async as tv
from typevet_async._core.scoring import plan_question

CONCURRENCIES = (1, 4, 16)
CLIENTS = ("(a) SDK judge_many", "(b) raw aiohttp", "(c) openai chat")
QUESTION_ID = "refund"
QUESTIONS: dict[str, tv.Question] = {QUESTION_ID: tv.Noul(instructions="Is a refund requested?")}
OPENINGS = (
    "Hi,",
    "Hello team,",
    "Urgent:",
    "Quick question:",
    "Dear support,",
    "Hey,",
    "Good morning,",
    "Sorry to bother you,",
)
ISSUES = (
    "I was charged twice for order {n} and want my money back.",
    "my parcel {n} has been stuck in transit for three weeks.",
    "the app crashes when I open settings (build {n}).",
    "the replacement for order {n} arrived and works perfectly, thanks!",
    "please send a VAT invoice for order {n} by Friday.",
    "I cannot log in since the password reset; ticket {n}.",
    "the jacket from order {n} is the wrong size, can I return it?",
    "my subscription renewed although I cancelled it; account {n}.",
    "the discount code {n} was not applied at checkout.",
    "order {n} arrived with a cracked screen.",
    "how do I change the delivery address of order {n}?",
    "the tracking page for parcel {n} shows an error.",
)


def tickets(count: int) -> list[str]:
    """``count`` distinct short support tickets."""
    pairs = itertools.cycle(itertools.product(OPENINGS, ISSUES))
    return [
        f"{opening} {issue.format(n=1000 + i)}"
        for i, (opening, issue) in zip(range(count), pairs, strict=False)
    ]


@attrs.frozen
class Prompt:
    """What every client sends for one ticket: the SDK's prefix, its user content, candidates."""

    prefix: str
    user_content: str
    controls: tuple[str, str]
    token_ids: tuple[int, int]


@attrs.define
class Pass:
    """One timed pass of one client over every prompt."""

    seconds: float
    requests: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: list[str] = attrs.Factory(list)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


async def build_prompts(url: str, states: Sequence[str]) -> list[Prompt]:
    """One untimed SDK pass: the exact prefixes the SDK sends, checked against plan_question."""
    async with tv.Session.llama_cpp(url, max_concurrency=16) as session:
        probe = await session.probe()
        prompts: list[Prompt] = []
        async for item in session.judge_many(states, QUESTIONS, ordered=True, max_in_flight=16):
            if item.judgment is None:
                raise RuntimeError(f"the priming pass failed on ticket {item.index}: {item.error}")
            diagnostics = item.judgment.diagnostics[QUESTION_ID]
            request = plan_question(
                QUESTION_ID,
                QUESTIONS[QUESTION_ID],
                states[item.index],
                family=probe.family,
                control_ids=probe.control_ids,
            )
            if request.prompt != diagnostics.prompt:
                raise RuntimeError("plan_question's prefix differs from the one the SDK sent")
            first, second = diagnostics.controls
            prompts.append(
                Prompt(
                    diagnostics.prompt,
                    request.user_text,
                    (first, second),
                    (request.token_ids[0], request.token_ids[1]),
                )
            )
    return prompts


async def sdk_pass(url: str, states: Sequence[str], concurrency: int) -> Pass:
    async with tv.Session.llama_cpp(url, max_concurrency=concurrency) as session:
        await session.probe()
        await session.judge(states[0], QUESTIONS)  # warm-up: pool and code paths
        result = Pass(0.0, len(states))
        started = time.perf_counter()
        async for item in session.judge_many(
            states, QUESTIONS, ordered=True, max_in_flight=concurrency
        ):
            if item.judgment is None:
                result.errors.append(f"ticket {item.index}: {item.error!r}")
                continue
            result.prompt_tokens += item.judgment.usage.prompt_tokens
            result.cached_tokens += item.judgment.usage.cached_tokens
        result.seconds = time.perf_counter() - started
    return result


def completion_body(prefix: str) -> dict[str, Any]:
    """The body the SDK sends for a scoring read (its default top-K of 4096)."""
    return {
        "prompt": prefix,
        "n_predict": 0,
        "n_probs": 4096,
        "post_sampling_probs": False,
        "cache_prompt": True,
        "return_tokens": False,
    }


async def run_bounded(
    count: int, concurrency: int, one: Callable[[int], Awaitable[tuple[int, int]]], result: Pass
) -> None:
    """``one(i)`` for every prompt, at most ``concurrency`` at once; errors are recorded."""
    semaphore = asyncio.Semaphore(concurrency)

    async def guarded(index: int) -> None:
        async with semaphore:
            try:
                prompt_tokens, cached = await one(index)
            except Exception as error:
                result.errors.append(f"prompt {index}: {error!r}\n{traceback.format_exc()}")
                return
        result.prompt_tokens += prompt_tokens
        result.cached_tokens += cached

    await asyncio.gather(*(guarded(index) for index in range(count)))


async def raw_pass(url: str, prompts: Sequence[Prompt], concurrency: int) -> Pass:
    headers = {"Content-Type": "application/json"}
    # A short keep-alive, below llama.cpp's own idle close, so no pooled connection goes stale.
    connector = aiohttp.TCPConnector(limit=concurrency + 4, keepalive_timeout=2.0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(index: int) -> tuple[int, int]:
            prompt = prompts[index]
            body = orjson.dumps(completion_body(prompt.prefix))
            async with http.post(f"{url}/completion", data=body, headers=headers) as response:
                response.raise_for_status()
                raw = await response.read()
            payload = orjson.loads(raw)
            wanted = prompt.token_ids
            found = {
                entry["id"]: entry["logprob"]
                for entry in payload["completion_probabilities"][0]["top_logprobs"]
                if entry["id"] in wanted
            }
            _false, _true = found[wanted[0]], found[wanted[1]]
            return payload.get("tokens_evaluated", 0), payload.get("timings", {}).get("cache_n", 0)

        await one(0)  # warm-up
        result = Pass(0.0, len(prompts))
        started = time.perf_counter()
        await run_bounded(len(prompts), concurrency, one, result)
        result.seconds = time.perf_counter() - started
    return result


async def openai_pass(url: str, model: str, prompts: Sequence[Prompt], concurrency: int) -> Pass:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none")
    try:

        async def one(index: int) -> tuple[int, int]:
            prompt = prompts[index]
            completion = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt.user_content}],
                max_tokens=1,
                logprobs=True,
                top_logprobs=20,
            )
            logprobs = completion.choices[0].logprobs
            content = logprobs.content if logprobs is not None else None
            top = content[0].top_logprobs if content else []
            by_token = {entry.token: entry.logprob for entry in top}
            # What users do: a control outside the top 20 has no logprob (None here).
            _false, _true = (by_token.get(control) for control in prompt.controls)
            usage = completion.usage
            details = usage.prompt_tokens_details if usage is not None else None
            cached = (details.cached_tokens or 0) if details is not None else 0
            return (usage.prompt_tokens if usage is not None else 0), cached

        await one(0)  # warm-up
        result = Pass(0.0, len(prompts))
        started = time.perf_counter()
        await run_bounded(len(prompts), concurrency, one, result)
        result.seconds = time.perf_counter() - started
    finally:
        await client.close()
    return result


async def served_model(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/models") as response:
        response.raise_for_status()
        payload = await response.json()
    return str(payload["data"][0]["id"])


async def run(url: str, questions: int, rounds: int) -> None:
    states = tickets(questions)
    prompts = await build_prompts(url, states)
    model = await served_model(url)
    passes: dict[tuple[int, str], list[Pass]] = {
        (c, client): [] for c in CONCURRENCIES for client in CLIENTS
    }
    runners: dict[str, Callable[[int], Awaitable[Pass]]] = {
        CLIENTS[0]: lambda c: sdk_pass(url, states, c),
        CLIENTS[1]: lambda c: raw_pass(url, prompts, c),
        CLIENTS[2]: lambda c: openai_pass(url, model, prompts, c),
    }
    started = time.perf_counter()
    for round_index in range(rounds):
        shift = round_index % len(CLIENTS)
        order = CLIENTS[shift:] + CLIENTS[:shift]
        for concurrency in CONCURRENCIES:
            for client in order:
                passes[concurrency, client].append(await runners[client](concurrency))
    elapsed = time.perf_counter() - started

    print(
        f"{questions} questions per pass (one Noul each), {rounds} rounds, clients rotated "
        f"each round; {elapsed:.0f} s in all"
    )
    print(f"{'c':>3}  {'client':20} {'req/s median':>12} {'(min-max)':>14} {'vs (b)':>7} cached")
    failures: list[str] = []
    for concurrency in CONCURRENCIES:
        floor = statistics.median(p.rate for p in passes[concurrency, CLIENTS[1]])
        for client in CLIENTS:
            cell = passes[concurrency, client]
            rates = [p.rate for p in cell]
            prompt_tokens = sum(p.prompt_tokens for p in cell)
            cached = sum(p.cached_tokens for p in cell) / prompt_tokens if prompt_tokens else 0.0
            median = statistics.median(rates)
            spread = f"({min(rates):.1f}-{max(rates):.1f})"
            print(
                f"{concurrency:>3}  {client:20} {median:12.1f} {spread:>14} "
                f"{median / floor:6.2f}x {cached:6.0%}"
            )
            failures += [f"c={concurrency} {client}: {e}" for p in cell for e in p.errors]
    if failures:
        print(f"{len(failures)} failed requests; the first:")
        print(failures[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--url", help="a running llama.cpp server (default: start the embedded one)"
    )
    parser.add_argument("--questions", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.url:
        asyncio.run(run(args.url, args.questions, args.rounds))
        return
    with tv.EmbeddedServer(tv.ServerOptions(n_parallel=16, n_ctx=16 * 1024)) as server:
        asyncio.run(run(server.url, args.questions, args.rounds))


if __name__ == "__main__":
    main()
