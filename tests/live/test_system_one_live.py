"""`Session.system_one` against a real System One server: our own gateway (``typevet-async
serve``, in-process) in front of the real llama.cpp server (Gemma 3 270M).

The same judgments read directly (`Session.llama_cpp`, reproducible mode on both sides) are the
reference: through the gateway they must come back equal, with the server-side diagnostics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import typesafe_sdk as ts

import typevet_async as tv
from typevet_async._apps import gateway
from typevet_async._apps.gateway import GatewayConfig
from typevet_async._core.wires.system_one import request_to_system_one

from .helpers import wait_until_ready

pytestmark = pytest.mark.live

KEY = "live-system-one-key"
QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul("Is a refund requested?"),
    "route": tv.Choice(
        {"billing": "money matters", "shipping": None, "technical": None},
        instructions="Which team should handle it?",
    ),
    "urgency": tv.Score(["can wait", "today", "now"], instructions="How urgent is it?"),
}
TICKETS = [
    {"subject": f"Ticket {n}", "message": text}
    for n, text in enumerate(
        [
            "I was charged twice, please refund me.",
            "My parcel never arrived.",
            "The app crashes when I log in.",
            "Can I change my delivery address?",
            "Please cancel my subscription and return my money.",
            "The invoice shows the wrong amount.",
        ]
    )
]


@pytest_asyncio.fixture
async def gateway_url(gemma3_url: str) -> AsyncIterator[str]:
    session = tv.Session.llama_cpp(gemma3_url, reproducible=True)
    async with gateway.running(session, GatewayConfig(keys=(KEY,), request_deadline=120)) as url:
        await wait_until_ready(url)
        yield url


def assert_same_judgment(remote: tv.Judgment, direct: tv.Judgment) -> None:
    assert list(remote) == list(direct)
    for question_id, answer in direct.items():
        got = remote[question_id]
        assert type(got) is type(answer)
        assert dict(got.probabilities) == pytest.approx(dict(answer.probabilities), abs=1e-6)
        assert got.confidence == pytest.approx(answer.confidence, abs=1e-6)
    assert remote.usage == direct.usage
    # The gateway's extension carries the server-side reads: the same prompts and token ids.
    for question_id, diagnostics in direct.diagnostics.items():
        assert remote.diagnostics[question_id].prompt == diagnostics.prompt
        assert remote.diagnostics[question_id].token_ids == diagnostics.token_ids


@pytest.mark.asyncio
async def test_judge_gives_the_direct_answers(gateway_url: str, gemma3_url: str) -> None:
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as direct_session:
        direct = await direct_session.judge(TICKETS[0], QUESTIONS)
    async with tv.Session.system_one(gateway_url, http=tv.HttpSettings(api_key=KEY)) as session:
        probe = await session.probe()
        remote = await session.judge(TICKETS[0], QUESTIONS)
    assert probe.family is tv.TemplateFamily.REMOTE
    assert probe.model_ids  # the gateway's one listed model
    assert_same_judgment(remote, direct)
    route = remote["route"]
    assert isinstance(route, tv.ChoiceAnswer)
    assert route.choice == max(route.probabilities, key=route.probabilities.__getitem__)


@pytest.mark.asyncio
async def test_examples_ride_to_the_gateway_and_read_as_directly(
    gateway_url: str, gemma3_url: str
) -> None:
    questions: dict[str, tv.Question] = {
        "refund": tv.Noul(
            "Is a refund requested?",
            examples=[("Please refund my order.", True), ("Where is my parcel?", False)],
        ),
        "route": tv.Choice(
            {"billing": "money matters", "shipping": None, "technical": None},
            instructions="Which team should handle it?",
            examples=[("I was billed twice.", "billing"), ("The app froze.", "technical")],
        ),
        "urgency": tv.Score(
            ["can wait", "today", "now"],
            instructions="How urgent is it?",
            examples=[("No rush at all.", 0), ("My account is being hacked!", 2)],
        ),
    }
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as direct_session:
        direct = await direct_session.judge(TICKETS[0], questions)
    async with tv.Session.system_one(gateway_url, http=tv.HttpSettings(api_key=KEY)) as session:
        remote = await session.judge(TICKETS[0], questions)
    assert_same_judgment(remote, direct)  # the same prompts: the examples were read there
    for question_id, question in questions.items():
        prompt = remote.diagnostics[question_id].prompt
        for state, _ in question.examples:
            assert prompt.index(state) < prompt.index("Ticket 0")


@pytest.mark.asyncio
async def test_judge_many_answers_every_record_in_order(gateway_url: str, gemma3_url: str) -> None:
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as direct_session:
        direct = [await direct_session.judge(ticket, QUESTIONS) for ticket in TICKETS]
    async with tv.Session.system_one(
        gateway_url, http=tv.HttpSettings(api_key=KEY), max_concurrency=4
    ) as session:
        items = [item async for item in session.judge_many(TICKETS, QUESTIONS)]
    assert [item.index for item in items] == list(range(len(TICKETS)))
    for item, expected in zip(items, direct, strict=True):
        assert item.judgment is not None, item.error
        assert_same_judgment(item.judgment, expected)


@pytest.mark.asyncio
async def test_one_record_the_server_refuses_fails_only_that_record(gateway_url: str) -> None:
    # A ticket past the model's context: llama.cpp refuses its prompt, the gateway answers 422
    # upstream_refused naming the body (not a question). A direct session fails only that
    # record; so must a remote one (it ended the batch after 1-2 of 5 records).
    long_ticket = {"subject": "Log", "message": "word " * 9_000}
    records = [TICKETS[0], TICKETS[1], long_ticket, TICKETS[2], TICKETS[3]]
    async with tv.Session.system_one(
        gateway_url, http=tv.HttpSettings(api_key=KEY), max_concurrency=2
    ) as session:
        items = [item async for item in session.judge_many(records, QUESTIONS)]
    assert [item.index for item in items] == [0, 1, 2, 3, 4]
    assert [item.judgment is not None for item in items] == [True, True, False, True, True]
    error = items[2].error
    assert isinstance(error, tv.InvalidInputError)
    assert not isinstance(error, tv.QuestionError)
    assert "refused this record (HTTP 422)" in str(error)
    assert "context" in str(error)


@pytest.mark.asyncio
async def test_the_official_client_and_ours_read_the_same_answers(gateway_url: str) -> None:
    async with tv.Session.system_one(gateway_url, http=tv.HttpSettings(api_key=KEY)) as session:
        ours = await session.judge(TICKETS[1], QUESTIONS)
    body = request_to_system_one("gemma", TICKETS[1], QUESTIONS)
    async with ts.AsyncTypeSafeClient(
        api_key=KEY, base_url=gateway_url, retry=ts.RetryPolicy(max_retries=0)
    ) as client:
        theirs = await client.system_one(state=body["state"], questions=body["questions"])
    refund = ours["refund"]
    assert isinstance(refund, tv.NoulAnswer)
    assert theirs.nouls["refund"].noul == pytest.approx(refund.noul, abs=1e-12)
    assert theirs.choices["route"].probabilities == pytest.approx(
        dict(ours["route"].probabilities), abs=1e-12
    )


@pytest.mark.asyncio
async def test_questions_the_server_refuses_are_a_question_error(gateway_url: str) -> None:
    # 521 options: our client cannot know the server's controls, the gateway has 62 single
    # ones and 520 two-token codes, and refuses the question with a 422 naming it.
    many = tv.Choice([f"label {n}" for n in range(521)], instructions="Which one?")
    async with tv.Session.system_one(gateway_url, http=tv.HttpSettings(api_key=KEY)) as session:
        with pytest.raises(tv.QuestionError, match="refused the questions") as raised:
            await session.judge(TICKETS[0], {"refund": QUESTIONS["refund"], "many": many})
    assert raised.value.question_id == "many"
    assert "521 options" in str(raised.value)


@pytest.mark.asyncio
async def test_a_wrong_key_is_a_401_not_retried(gateway_url: str) -> None:
    async with tv.Session.system_one(
        gateway_url,
        http=tv.HttpSettings(api_key="wrong-key-123", retry=tv.RetryPolicy(max_retries=3)),
    ) as s:
        with pytest.raises(tv.ServerError) as raised:
            await s.probe()
    assert raised.value.status == 401
    assert "wrong-key-123" not in str(raised.value)


@pytest.mark.asyncio
async def test_a_pinned_model_the_server_does_not_list_is_refused(gateway_url: str) -> None:
    async with tv.Session.system_one(
        gateway_url, http=tv.HttpSettings(api_key=KEY), model="no-such-model"
    ) as s:
        with pytest.raises(tv.ConfigurationError, match="no-such-model"):
            await s.judge(TICKETS[0], QUESTIONS)


@pytest.mark.asyncio
async def test_generation_and_images_are_refused_unsent(gateway_url: str) -> None:
    image = tv.Image.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png")
    async with tv.Session.system_one(gateway_url, http=tv.HttpSettings(api_key=KEY)) as session:
        with pytest.raises(tv.InvalidInputError, match="no schema-bound generation"):
            await session.generate("Say hi", schema={"type": "string"})
        with pytest.raises(tv.InvalidInputError, match="does not send images"):
            await session.judge(TICKETS[0], QUESTIONS, images=[image])
