"""Load through the System One gateway over the real llama.cpp server: 1,000 requests at
concurrency 32 (Gemma 3 270M), one Noul question each, sent with a plain aiohttp client, every
answer tied to its request. The full-size run of what ``tests/live/test_gateway_load_live.py``
proves over a replaying upstream (the gateway); here the upstream is the real server, so the
run also shows the model's server under that load (the test it was took 391 s on this shared
2-core machine, 2026-12-04).

Every request is told apart three ways, so that an answer matched to the wrong request counts:

- its question id is its own (``r{n}``): the response must answer exactly that id;
- its state is its own (``Request {n}: ...``): the prompt the answer was read from (the
  ``x_typevet`` diagnostics of the response) must hold it;
- its state's length is its own among the requests in flight (``n % 64`` filler words): the
  prompt tokens the server reported for the read (``usage.input_tokens``) must equal the
  server's own tokenization of that prompt, asked for separately after the run (``POST
  /tokenize``), once per read. A logprob moves with the batch, a token count does not.

Then nothing is left: no connection the gateway still holds once the client closed, no request
still counted, and, once the gateway stopped, no asyncio task and no file descriptor more than
before it started. Exits 1 if any of it fails. The gateway runs in this process (its tasks and
descriptors are counted here); the server is the embedded one as the live tests start it (4
slots) unless ``--url``.

    python -m benchmarks.gateway.bench_gateway_load [--requests 1000] [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

import typevet_async as tv
from benchmarks._shared import percentile, run_on_gemma
from typevet_async._apps.gateway import STATE, GatewayConfig, build_app, runner_options

NAME = "bench_gateway_load"
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


async def load(
    url: str, numbers: Iterable[int], state_of: Callable[[int], str], concurrency: int
) -> dict[int, Outcome]:
    """``POST /v1/systemone`` once per number (question ``r{n}``, state ``state_of(n)``),
    ``concurrency`` at a time, from one aiohttp client: each request's outcome."""
    outcomes: dict[int, Outcome] = {}
    slots = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(n: int) -> None:
            body = {"model": "gemma-3-270m", "state": state_of(n), "questions": {f"r{n}": NOUL}}
            async with slots:
                started = time.perf_counter()
                async with http.post(
                    f"{url}/v1/systemone", data=orjson.dumps(body), headers=headers
                ) as response:
                    raw = await response.read()
                outcomes[n] = Outcome(
                    response.status, orjson.loads(raw), time.perf_counter() - started
                )

        await asyncio.gather(*(one(n) for n in numbers))
    return outcomes


class Leftovers:
    """What the gateway left once the client closed and once it stopped."""

    connections = counted = judging = tasks = fds = 0


async def through_gateway(
    session: tv.Session,
    numbers: Iterable[int],
    state_of: Callable[[int], str],
    open_fds: Callable[[], int],
) -> tuple[dict[int, Outcome], float, Leftovers]:
    """The gateway over ``session`` in this process (16 judged, 16 waiting: exactly the
    client's 32, so none may be refused with a 429), loaded by `load`: the outcomes, the
    seconds the load took, and what was left."""
    left = Leftovers()
    gc.collect()
    tasks_before, fds_before = len(asyncio.all_tasks()), open_fds()
    config = GatewayConfig(keys=(KEY,), max_active_requests=16, max_queue=16, request_deadline=300)
    app = build_app(session, config)
    runner = web.AppRunner(app, **runner_options(config))
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        started = time.monotonic()
        outcomes = await load(f"http://{host}:{port}", numbers, state_of, CONCURRENCY)
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.2)  # the client closed: the gateway sees each connection end
        assert runner.server is not None
        left.connections = len(runner.server.connections)
        gateway = app[STATE]
        left.counted, left.judging = gateway.admitted, len(gateway.judging)
    finally:
        await runner.cleanup()
    await asyncio.sleep(0.2)  # closed transports release their sockets on the next turns
    gc.collect()
    left.tasks = len(asyncio.all_tasks()) - tasks_before
    left.fds = open_fds() - fds_before
    return outcomes, elapsed, left


def mismatches(
    outcomes: dict[int, Outcome], state_of: Callable[[int], str]
) -> tuple[dict[int, str], dict[int, str]]:
    """The requests whose answer is not their own (by id, by prompt, or a noul that is not the
    softmax of its own read's logprobs), and each answered request's prompt as its answer's
    diagnostics report it."""
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
        diagnostics = body["x_typevet"]["diagnostics"][question]
        if state_of(n) not in diagnostics["prompt"]:
            wrong[n] = "its prompt holds another state"
            continue
        lp_false, lp_true = diagnostics["logprobs"]
        expected = 1 / (1 + math.exp(lp_false - lp_true))
        if abs(body["answers"][question]["noul"] - expected) > 1e-12:
            wrong[n] = "its noul is not the softmax of its own read"
            continue
        prompts[n] = diagnostics["prompt"]
    return wrong, prompts


def reads_of(outcomes: dict[int, Outcome], n: int) -> int:
    """The reads request ``n``'s question took (one more for each wider re-read)."""
    reads: int = outcomes[n].body["x_typevet"]["diagnostics"][f"r{n}"]["reads"]
    return reads


def latency_figures(outcomes: dict[int, Outcome], elapsed: float) -> dict[str, Any]:
    latencies = sorted(outcome.seconds for outcome in outcomes.values())
    return {
        "seconds": round(elapsed, 1),
        "requests_per_second": round(len(outcomes) / elapsed, 1),
        "latency_p50_s": round(statistics.median(latencies), 3),
        "latency_p99_s": round(percentile(latencies, 0.99), 3),
    }


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


def open_fds() -> int:
    """File descriptors this process holds (sockets included), for leak checks."""
    return len(os.listdir("/proc/self/fd"))


async def run(url: str, requests: int) -> dict[str, Any]:
    session = tv.Session.llama_cpp(url, max_concurrency=16)
    outcomes, elapsed, left = await through_gateway(session, range(requests), state, open_fds)
    statuses = Counter(outcome.status for outcome in outcomes.values())
    wrong, prompts = mismatches(outcomes, state)
    counts = await server_token_counts(url, prompts)
    # Each read evaluates the whole prompt: the tokens billed are the prompt's, once per read.
    wrong_reads = {
        n: f"input_tokens {outcomes[n].body['usage']['input_tokens']}, its prompt {count}"
        for n, count in counts.items()
        if outcomes[n].body["usage"]["input_tokens"] != count * reads_of(outcomes, n)
    }
    figures: dict[str, Any] = {
        "requests": requests,
        "concurrency": CONCURRENCY,
        **latency_figures(outcomes, elapsed),
        "statuses": {str(status): count for status, count in statuses.items()},
        "lost": requests - len(outcomes),
        "answers_not_their_requests": len(wrong),
        "reads_not_their_prompts": len(wrong_reads),
        "questions_read_twice": sum(reads_of(outcomes, n) > 1 for n in counts),
        "distinct_prompt_lengths": len(set(counts.values())),
        "connections_left": left.connections,
        "requests_still_counted": left.counted + left.judging,
        "tasks_left": left.tasks,
        "fds_left": left.fds,
        "examples_wrong": [*list(wrong.items())[:3], *list(wrong_reads.items())[:3]],
    }
    figures["passed"] = (
        figures["lost"] == 0
        and statuses == {200: requests}
        and not wrong
        and len(counts) == requests
        and not wrong_reads
        and left.connections == left.counted == left.judging == left.tasks == 0
        and left.fds <= 0
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--url", help="a running llama.cpp server (default: the embedded one)")
    args = parser.parse_args()
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    run_on_gemma(NAME, run, args.requests, args.url)


if __name__ == "__main__":
    main()
