"""Load through the System One gateway: 1,000 requests at concurrency 32 over the real llama.cpp
server (Gemma 3 270M), one Noul question each, sent with a plain aiohttp client.

Every request is told apart three ways, so that an answer matched to the wrong request fails:

- its question id is its own (``r{n}``): the response must answer exactly that id;
- its state is its own (``Request {n}: ...``): the prompt the answer was read from (the
  ``typevet`` diagnostics of the response) must hold it;
- its state's length is its own among the requests in flight (``n % 64`` filler words): the
  prompt tokens the server reported for the read (``usage.input_tokens``) must equal the
  server's own tokenization of that prompt, asked for separately after the run (``POST
  /tokenize``). This ties the read, not only the request, to its answer, with no noise: a
  logprob moves with the batch, a token count does not.

Then nothing is left: no connection the gateway still holds once the client closed, no request
still counted, and, once the gateway stopped, no asyncio task and no file descriptor more than
before it started. The figures go to ``~/.cache/typevet_async/test-logs/gateway_load.json``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import statistics
import time
from collections import Counter
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

import typevet_async as tv
from typevet_async._gateway import STATE, GatewayConfig, build_app, runner_options

from .faults import open_fds

pytestmark = [pytest.mark.live, pytest.mark.asyncio, pytest.mark.timeout(1800)]

REQUESTS = 1000
CONCURRENCY = 32
KEY = "load-key"
NOUL = {"type": "noul", "instructions": "Is a refund requested?"}


def state(n: int) -> str:
    """Request ``n``'s state: its number, then ``n % 64`` filler words, so any 32 requests
    started one after another differ in length."""
    return f"Request {n}: I was charged twice." + " please" * (n % 64)


class Outcome:
    """One request's status, body and client-side latency."""

    def __init__(self, status: int, body: Any, seconds: float) -> None:
        self.status, self.body, self.seconds = status, body, seconds


async def load(url: str) -> dict[int, Outcome]:
    outcomes: dict[int, Outcome] = {}
    slots = asyncio.Semaphore(CONCURRENCY)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(n: int) -> None:
            body = {"model": "gemma-3-270m", "state": state(n), "questions": {f"r{n}": NOUL}}
            async with slots:
                started = time.perf_counter()
                async with http.post(
                    f"{url}/v1/systemone", data=orjson.dumps(body), headers=headers
                ) as response:
                    raw = await response.read()
                outcomes[n] = Outcome(
                    response.status, orjson.loads(raw), time.perf_counter() - started
                )

        await asyncio.gather(*(one(n) for n in range(REQUESTS)))
    return outcomes


async def server_token_counts(server_url: str, prompts: dict[int, str]) -> dict[int, int]:
    """The llama.cpp server's own token count of each prompt (BOS included, as it evaluates
    one), asked outside the gateway and the SDK."""
    counts: dict[int, int] = {}
    slots = asyncio.Semaphore(4)
    async with aiohttp.ClientSession() as http:

        async def one(n: int, prompt: str) -> None:
            async with (
                slots,
                http.post(
                    f"{server_url}/tokenize", json={"content": prompt, "add_special": True}
                ) as response,
            ):
                counts[n] = len((await response.json())["tokens"])

        await asyncio.gather(*(one(n, prompt) for n, prompt in prompts.items()))
    return counts


def mismatches(outcomes: dict[int, Outcome]) -> tuple[dict[int, str], dict[int, str]]:
    """The requests whose answer is not their own (by id or by prompt), and each request's
    prompt as its answer's diagnostics report it."""
    wrong: dict[int, str] = {}
    prompts: dict[int, str] = {}
    for n, outcome in outcomes.items():
        body = outcome.body
        if outcome.status != 200:
            continue
        question = f"r{n}"
        if list(body["answers"]) != [question]:
            wrong[n] = f"answers {list(body['answers'])}"
            continue
        diagnostics = body["typevet"]["diagnostics"][question]
        if state(n) not in diagnostics["prompt"]:
            wrong[n] = "its prompt holds another state"
            continue
        # The answer is the softmax of the logprobs its own read returned.
        lp_false, lp_true = diagnostics["logprobs"]
        expected = 1 / (1 + math.exp(lp_false - lp_true))
        if abs(body["answers"][question]["noul"] - expected) > 1e-12:
            wrong[n] = "its noul is not the softmax of its own read"
            continue
        prompts[n] = diagnostics["prompt"]
    return wrong, prompts


def percentile(sorted_values: list[float], share: float) -> float:
    rank = max(0, min(len(sorted_values) - 1, math.ceil(share * len(sorted_values)) - 1))
    return sorted_values[rank]


async def test_1000_requests_at_concurrency_32_through_the_gateway(gemma3_url: str) -> None:
    gc.collect()
    tasks_before, fds_before = len(asyncio.all_tasks()), open_fds()
    # 16 judged and 16 waiting: exactly the client's 32, so none may be refused with a 429.
    config = GatewayConfig(keys=(KEY,), max_in_flight=16, max_queue=16, timeout=300)
    app = build_app(tv.Session.llama_cpp(gemma3_url, max_concurrency=16), config)
    runner = web.AppRunner(app, **runner_options(config))
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        started = time.monotonic()
        outcomes = await load(f"http://{host}:{port}")
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.2)  # the client closed: the gateway sees each connection end
        assert runner.server is not None
        connections_left = len(runner.server.connections)
        gateway = app[STATE]
        counted_left, judging_left = gateway.admitted, len(gateway.judging)
    finally:
        await runner.cleanup()
    await asyncio.sleep(0.2)  # closed transports release their sockets on the next turns
    gc.collect()
    tasks_left = len(asyncio.all_tasks()) - tasks_before
    fds_left = open_fds() - fds_before

    statuses = Counter(outcome.status for outcome in outcomes.values())
    wrong, prompts = mismatches(outcomes)
    counts = await server_token_counts(gemma3_url, prompts)
    # Each read of a question evaluates its whole prompt (a question whose controls were
    # outside the first read's top K is read again, wider): the tokens billed are the
    # prompt's, once per read.
    reads = {n: outcomes[n].body["typevet"]["diagnostics"][f"r{n}"]["reads"] for n in counts}
    wrong_reads = {
        n: f"input_tokens {outcomes[n].body['usage']['input_tokens']}, its prompt {count}"
        f" x {reads[n]} reads"
        for n, count in counts.items()
        if outcomes[n].body["usage"]["input_tokens"] != count * reads[n]
    }
    latencies = sorted(outcome.seconds for outcome in outcomes.values())
    figures: dict[str, Any] = {
        "requests": REQUESTS,
        "concurrency": CONCURRENCY,
        "seconds": round(elapsed, 1),
        "requests_per_second": round(REQUESTS / elapsed, 1),
        "latency_p50_s": round(statistics.median(latencies), 3),
        "latency_p99_s": round(percentile(latencies, 0.99), 3),
        "statuses": dict(statuses),
        "lost": REQUESTS - len(outcomes),
        "answers_not_their_requests": len(wrong),
        "reads_not_their_prompts": len(wrong_reads),
        "questions_read_twice": sum(r > 1 for r in reads.values()),
        "distinct_prompt_lengths": len(set(counts.values())),
        "connections_left": connections_left,
        "requests_still_counted": counted_left + judging_left,
        "tasks_left": tasks_left,
        "fds_left": fds_left,
    }
    path = tv.cache_dir() / "test-logs" / "gateway_load.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))

    assert figures["lost"] == 0
    assert statuses == {200: REQUESTS}, [
        (n, o.status, o.body) for n, o in outcomes.items() if o.status != 200
    ][:3]
    assert wrong == {}, list(wrong.items())[:5]
    assert len(counts) == REQUESTS
    assert wrong_reads == {}, list(wrong_reads.items())[:5]
    assert len(set(counts.values())) >= 64  # the token check tells them apart
    assert connections_left == 0
    assert counted_left == judging_left == 0
    assert tasks_left == 0
    assert fds_left <= 0
