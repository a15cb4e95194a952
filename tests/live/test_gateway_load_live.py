"""Load through the System One gateway: 1,000 requests at concurrency 32, one Noul question
each, sent with a plain aiohttp client, over a REPLAYING upstream (a stub, named as such).

The upstream is `benchmarks.client_cost.replay_server` run with ``--derive`` in a child process: a
llama.cpp server that answers every read at once with a body recorded from the real server, two
values in it derived from the prompt the read carried (its size: UTF-8 bytes): ``tokens_evaluated``
is that size, and each logprob is lowered by an amount proportional to it (`derived_logprob`),
so each request's answer is its own. What it proves is the
gateway's, not the model's: the model's server is proven elsewhere (``test_gateway_live``: the
gateway's answers equal a direct session's over real llama.cpp and vLLM, 96 requests at
concurrency 32 lost none after the client's retries; ``test_qwen_live``: the prompt tokens a
judgment reports are the server's tokenization of its prompt). The same load over the real
llama.cpp server is
``benchmarks/gateway/bench_gateway_load.py``.

Every request is told apart, so that an answer matched to the wrong request fails:

- its question id is its own (``r{n}``): the response must answer exactly that id;
- its state is its own (``Request {n}: ...`` and ``n`` filler marks, so every state has its
  own length): the prompt the answer was read from (the ``x_typevet`` diagnostics) must hold it;
- the reads behind the answer are its own: the prompt tokens billed (``usage.input_tokens``)
  must be the upstream's mark of that prompt once per read, and that mark less the state's
  length must be one constant across all requests (the question around the state is the
  same), so each of the 1,000 answers carries the one size its own request's state gives;
- the logprobs the answer was read from are its own read's: each lowered by its own prompt's
  size (one recorded value per control across all requests once the shift is undone), the noul
  is their softmax, and no two requests got the same noul.

Every read the upstream served is one a request asked for (reads counted both sides, none
unanswered). Then nothing is left: no connection the gateway still holds once the client
closed, no request still counted, and, once the gateway stopped, no asyncio task and no file
descriptor more than before it started. The figures go to
``~/.cache/typevet_async/test-logs/gateway_load.json``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

import typevet_async as tv
from benchmarks.client_cost.replay_server import (
    RECORDED_SETTINGS,
    ReplayServerProcess,
    derived_logprob,
    prompt_size,
)
from benchmarks.gateway.bench_gateway_load import (
    CONCURRENCY,
    latency_figures,
    mismatches,
    reads_of,
    through_gateway,
)

from .faults import open_fds

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

REQUESTS = 1000


def state(n: int) -> str:
    """Request ``n``'s state: its number, then ``n`` filler marks: no two states are as long."""
    return f"Request {n}: I was charged twice." + "!" * n


async def test_1000_requests_at_concurrency_32_through_the_gateway() -> None:
    with ReplayServerProcess(derive=True) as upstream:
        # The recorded bodies' controls (digits): a question is read once, at the first K.
        session = tv.Session.llama_cpp(upstream.url, max_concurrency=16, **RECORDED_SETTINGS)
        outcomes, elapsed, left = await through_gateway(session, range(REQUESTS), state, open_fds)
        served = upstream.stats()

    statuses = Counter(outcome.status for outcome in outcomes.values())
    wrong, prompts = mismatches(outcomes, state)
    reads = {n: reads_of(outcomes, n) for n in prompts}
    billed = {n: outcomes[n].body["usage"]["input_tokens"] for n in prompts}
    # Billed: the upstream's mark of the answer's own prompt, once per read.
    wrong_reads = {
        n: f"input_tokens {billed[n]}, its prompt's size {prompt_size(prompt)} x {reads[n]}"
        for n, prompt in prompts.items()
        if billed[n] != prompt_size(prompt) * reads[n]
    }
    # ... and that size is the request's own state's, around one rendering of the question.
    around_state = {billed[n] // reads[n] - len(state(n).encode()) for n in prompts}
    # The logprobs: each lowered by its own prompt's size; undone, one value per control.
    restored = set()
    for n, prompt in prompts.items():
        diagnostics = outcomes[n].body["x_typevet"]["diagnostics"][f"r{n}"]
        size = prompt_size(prompt)
        pairs = zip(diagnostics["token_ids"], diagnostics["logprobs"], strict=True)
        restored.add(tuple(round(lp - derived_logprob(0.0, token, size), 9) for token, lp in pairs))
    nouls = {outcomes[n].body["answers"][f"r{n}"]["noul"] for n in prompts}
    figures: dict[str, Any] = {
        "requests": REQUESTS,
        "concurrency": CONCURRENCY,
        "upstream": "benchmarks.client_cost.replay_server --derive (replaying, not a model)",
        **latency_figures(outcomes, elapsed),
        "statuses": dict(statuses),
        "lost": REQUESTS - len(outcomes),
        "answers_not_their_requests": len(wrong),
        "reads_not_their_prompts": len(wrong_reads),
        "distinct_billed_sizes": len(set(billed.values())),
        "distinct_nouls": len(nouls),
        "reads": sum(reads.values()),
        "reads_served": served["requests"].get("/completion", 0),
        "connections_left": left.connections,
        "requests_still_counted": left.counted + left.judging,
        "tasks_left": left.tasks,
        "fds_left": left.fds,
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
    assert len(prompts) == REQUESTS
    assert wrong_reads == {}, list(wrong_reads.items())[:5]
    assert len(around_state) == 1, sorted(around_state)[:5]
    assert len(set(billed.values())) == REQUESTS  # every answer's size names one request
    assert len(restored) == 1, sorted(restored)[:5]
    assert len(nouls) == REQUESTS  # every answer is its own request's
    assert served["unanswered"] == []
    assert figures["reads_served"] == figures["reads"]  # no read lost, none sent twice
    assert left.connections == 0
    assert left.counted == left.judging == 0
    assert left.tasks == 0
    assert left.fds <= 0
