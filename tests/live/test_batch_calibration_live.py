"""Batch calibration with real parts: the real llama.cpp server (Gemma 3 270M, reproducible
reads), `judge_many` with ``batch_calibration`` on twelve tickets held to the hand division of
the same session's uncalibrated answers (the second run's reads come from the session's read
cache: the very same logprobs, no read sent), and our gateway's batch route over the same
server held to the hand division of its single route's answers, through `Session.system_one`
too. The model proves nothing about accuracy here (a base model near chance): the arithmetic
and the plumbing are what is checked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig, running
from typevet_async._core.wires.system_one import BATCH_PATH, question_to_system_one

from .helpers import wait_until_ready

pytestmark = pytest.mark.live

KEY = "live-calibration-key-0123456789"
ROUTE = tv.Choice(
    {"billing": "money matters", "shipping": None, "technical": None},
    instructions="Which team should handle it?",
)
QUESTIONS: dict[str, tv.Question] = {"route": ROUTE}
TICKETS = [
    "I was charged twice, please refund me.",
    "My parcel never arrived.",
    "The app crashes when I log in.",
    "Can I change my delivery address?",
    "Please cancel my subscription and return my money.",
    "The invoice shows the wrong amount.",
    "The tracking number does not work.",
    "I cannot reset my password.",
    "Why was my card declined?",
    "The box came damaged.",
    "Error 500 when I open the settings page.",
    "Do you ship to Canada?",
    "I returned the item but got no refund yet.",
    "The courier left my package at the wrong door.",
    "The page keeps loading forever.",
    "You billed me for a plan I never ordered.",
    "How long does delivery to Spain take?",
    "The app logs me out every few minutes.",
    "I want my money back for the late order.",
    "My order shows delivered but nothing came.",
    "The search button does nothing.",
    "Please send me a copy of my receipt.",
    "Can I pick up my order at a store?",
    "Two-factor codes never reach my phone.",
]


def probabilities(judgment: tv.Judgment | None) -> tuple[float, ...]:
    assert judgment is not None
    return tuple(judgment["route"].probabilities.values())


def mean(answers: Sequence[Sequence[float]]) -> list[float]:
    return [sum(column) / len(answers) for column in zip(*answers, strict=True)]


def divided(answer: Sequence[float], prior: Sequence[float]) -> list[float]:
    """One answer divided by ``prior`` option by option, renormalised: by hand."""
    weights = [p / q for p, q in zip(answer, prior, strict=True)]
    return [w / sum(weights) for w in weights]


def assert_close(
    got: Sequence[Sequence[float]], want: Sequence[Sequence[float]], tol: float
) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a == pytest.approx(b, abs=tol), (a, b)


async def stream(states: Sequence[str]) -> AsyncIterator[str]:
    """The tickets as a stream: no length, so a warm-up and then the running prior."""
    for state in states:
        yield state


@pytest.mark.asyncio
async def test_judge_many_divides_the_same_sessions_answers_as_by_hand(gemma3_url: str) -> None:
    cache = tv.MemoryReadCache()
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True, cache=cache) as session:
        raw = [
            item async for item in session.judge_many(TICKETS, QUESTIONS, batch_calibration="off")
        ]
        whole = [
            item async for item in session.judge_many(TICKETS, QUESTIONS, batch_calibration="on")
        ]
        running_prior = [
            item
            async for item in session.judge_many(
                stream(TICKETS), QUESTIONS, batch_calibration="on", ordered=False
            )
        ]
    read = [probabilities(item.judgment) for item in raw]
    prior = mean(read)
    # the real model's answers vary over the tickets: the floor does not apply
    assert max(max(r[i] for r in read) - min(r[i] for r in read) for i in range(3)) > 0.02
    assert_close(
        [probabilities(item.judgment) for item in whole], [divided(r, prior) for r in read], 1e-12
    )
    for item, as_read in zip(whole, read, strict=True):
        assert item.judgment is not None
        diagnostics = item.judgment.diagnostics["route"]
        assert diagnostics.cache == "hit"  # no read sent: the arithmetic on the reads made
        assert diagnostics.raw_probabilities == pytest.approx(as_read, abs=1e-15)
        assert diagnostics.batch_prior == pytest.approx(prior, abs=1e-15)
        assert (diagnostics.batch_prior_items, diagnostics.batch_prior_skipped) == (
            len(TICKETS),
            None,
        )
    assert sum(item.judgment.usage.reads for item in whole if item.judgment) == 0
    # a stream shorter than its warm-up (32) is divided as the whole batch it was
    by_index = {item.index: probabilities(item.judgment) for item in running_prior}
    assert_close(
        [by_index[n] for n in range(len(TICKETS))], [divided(r, prior) for r in read], 1e-12
    )


@pytest.mark.asyncio
async def test_a_stream_past_its_warm_up_divides_by_the_running_prior(gemma3_url: str) -> None:
    cache = tv.MemoryReadCache()
    settings: dict[str, Any] = {"reproducible": True, "cache": cache}
    async with tv.Session.llama_cpp(
        gemma3_url, batch_calibration="on", batch_calibration_window=16, **settings
    ) as session:
        raw = [
            item async for item in session.judge_many(TICKETS, QUESTIONS, batch_calibration="off")
        ]
        items = [item async for item in session.judge_many(stream(TICKETS), QUESTIONS)]
    read = [probabilities(item.judgment) for item in raw]
    expected = [divided(r, mean(read[:16])) for r in read[:16]]
    expected += [divided(read[n], mean(read[: n + 1])) for n in range(16, len(read))]
    # the running prior is kept as plain sums: equal to the mean within float rounding
    assert_close([probabilities(item.judgment) for item in items], expected, 1e-12)
    counts = [
        item.judgment.diagnostics["route"].batch_prior_items for item in items if item.judgment
    ]
    assert counts == [16] * 16 + list(range(17, len(TICKETS) + 1))


@pytest_asyncio.fixture
async def calibrating_gateway(gemma3_url: str) -> AsyncIterator[str]:
    session = tv.Session.llama_cpp(gemma3_url, reproducible=True, batch_calibration="on")
    async with running(session, GatewayConfig(keys=(KEY,), request_deadline=300)) as url:
        await wait_until_ready(url)
        yield url


async def post(url: str, path: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}{path}", data=orjson.dumps(body), headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.json()


@pytest.mark.asyncio
async def test_the_gateways_batch_route_divides_as_by_hand(calibrating_gateway: str) -> None:
    url = calibrating_gateway
    wire = {"route": question_to_system_one(ROUTE)}
    batch = await post(url, BATCH_PATH, {"states": TICKETS, "questions": wire})
    singles = [await post(url, "/v1/systemone", {"state": t, "questions": wire}) for t in TICKETS]
    read = [tuple(single["answers"]["route"]["probabilities"].values()) for single in singles]
    for single in singles:  # each a batch of one, left as read
        assert single["x_typevet"]["diagnostics"]["route"]["batch_prior_items"] == 1
    prior = mean(read)
    got = [
        tuple(result["answers"]["route"]["probabilities"].values()) for result in batch["results"]
    ]
    # reproducible reads on both routes: the same logprobs, within float printing
    assert_close(got, [divided(r, prior) for r in read], 1e-9)
    for result, as_read in zip(batch["results"], read, strict=True):
        diagnostics = result["x_typevet"]["diagnostics"]["route"]
        assert diagnostics["raw_probabilities"] == pytest.approx(as_read, abs=1e-9)
        assert diagnostics["batch_prior"] == pytest.approx(prior, abs=1e-9)
        assert (diagnostics["batch_prior_items"], diagnostics["batch_prior_skipped"]) == (
            len(TICKETS),
            None,
        )
    async with aiohttp.ClientSession() as http:
        listing = await (
            await http.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        ).json()
    assert listing["x_batch_calibration"] == {
        "mode": "on",
        "min_states": 16,
        "min_states_per_option": 2,
    }
    # a System One session sends judge_many through the batch route and reads it all back
    async with tv.Session.system_one(url, http=tv.HttpSettings(api_key=KEY)) as client:
        items = [item async for item in client.judge_many(TICKETS, QUESTIONS)]
    assert_close([probabilities(item.judgment) for item in items], got, 1e-9)
    assert all(
        item.judgment is not None
        and item.judgment.diagnostics["route"].batch_prior_items == len(TICKETS)
        for item in items
    )
