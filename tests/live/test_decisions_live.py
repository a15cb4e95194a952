"""OpenAI's Decisions API on the gateway (``POST /v1/decisions``), asked by the official
``openai`` client (sync and async ``decisions.create``) and by ``Session.openai_decisions``,
over the real llama.cpp server (Gemma 3 270M, reproducible reads) and the real vLLM server:
the answers equal ``session.judge`` of the same questions on the same server; errors are the
client's own typed exceptions; hostile bodies get a typed 4xx, never a hang."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig

from .faults import VisionRecordingProxy
from .helpers import PNG_HEADER, ready_gateway
from .servers import VLLM_MODEL_ID

pytestmark = pytest.mark.live

KEY = "live-decisions-key"
TIMEOUT = 120.0
STATE = "Subject: Duplicate charge. I was charged twice for my order, please refund me."
#: The questions as the Decisions API sends them, and the same questions typed by hand.
WIRE_QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "name": "refund", "instructions": "Is a refund requested?"},
    {
        "type": "choice",
        "name": "angry",
        "instructions": "Is the customer angry?",
        "choices": [
            {"value": True},
            {"value": False},
            {"value": "unsure", "description": "can't tell"},
        ],
    },
    {
        "type": "score",
        "instructions": "How urgent is it?",
        "levels": [{"label": "low"}, {"label": "high", "description": "answer today"}],
    },
]
TYPED: dict[str, tv.Question] = {
    "refund": tv.Noul("Is a refund requested?"),
    "angry": tv.Choice(
        {"true": None, "false": None, "unsure": "can't tell"}, instructions="Is the customer angry?"
    ),
    "urgency": tv.Score(["low", "high: answer today"], instructions="How urgent is it?"),
}


def gemma_session(url: str, **settings: Any) -> tv.Session:
    return tv.Session.llama_cpp(url, reproducible=True, **settings)


async def direct(session: tv.Session) -> tv.Judgment:
    async with session:
        return await session.judge(STATE, TYPED)


def gaps(decision: Any, judgment: tv.Judgment) -> list[float]:
    """Every probability and expected score of the Decision against the direct judgment's
    (the typed choice values checked on the way)."""
    refund, angry, urgency = decision.answers
    assert (refund.type, angry.type, urgency.type) == ("predicate", "choice", "score")
    assert [p.value for p in angry.probabilities] == [True, False, "unsure"]
    direct_angry = judgment["angry"]
    assert isinstance(direct_angry, tv.ChoiceAnswer)
    assert angry.choice == {"true": True, "false": False}.get(direct_angry.choice, "unsure")
    assert [p.label for p in urgency.probabilities] == ["low", "high"]
    direct_urgency = judgment["urgency"]
    assert isinstance(direct_urgency, tv.ScoreAnswer)
    angry_pairs = zip(angry.probabilities, direct_angry.probabilities.values(), strict=True)
    return [
        abs(refund.probability - judgment["refund"].probabilities["true"]),
        *(abs(p.probability - q) for p, q in angry_pairs),
        *(
            abs(p.probability - direct_urgency.probabilities[p.value])
            for p in urgency.probabilities
        ),
        abs(urgency.score - direct_urgency.score),
        abs(angry.confidence - direct_angry.confidence),
    ]


@pytest_asyncio.fixture
async def gateway_url(gemma3_url: str) -> AsyncIterator[str]:
    async with ready_gateway(gemma_session(gemma3_url), GatewayConfig(keys=(KEY,))) as url:
        yield url


def async_client(url: str, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=key, base_url=f"{url}/v1", max_retries=0, timeout=TIMEOUT)


async def ask_async(url: str, questions: Any = WIRE_QUESTIONS, **kwargs: Any) -> Any:
    async with async_client(url, kwargs.pop("key", KEY)) as client:
        return await client.decisions.create(
            model="gemma-3-270m", input=kwargs.pop("input", STATE), questions=questions, **kwargs
        )


@pytest.mark.asyncio
async def test_the_async_client_gets_the_direct_answers(gateway_url: str, gemma3_url: str) -> None:
    decision = await ask_async(gateway_url)
    found = gaps(decision, await direct(gemma_session(gemma3_url)))
    print(f"Decisions (async openai) vs session.judge on llama.cpp: largest gap {max(found):.1e}")
    assert max(found) == 0.0  # reproducible reads, JSON floats round-trip exactly
    assert decision.usage.input_tokens > 0
    assert decision.usage.input_tokens_details.cached_tokens >= 0
    assert [a.name for a in decision.answers] == ["refund", "angry", None]


@pytest.mark.asyncio
async def test_the_sync_client_gets_the_direct_answers(gateway_url: str, gemma3_url: str) -> None:
    def ask() -> Any:
        with openai.OpenAI(
            api_key=KEY, base_url=f"{gateway_url}/v1", max_retries=0, timeout=TIMEOUT
        ) as client:
            return client.decisions.create(
                model="gemma-3-270m", input=STATE, questions=WIRE_QUESTIONS
            )

    decision = await asyncio.to_thread(ask)
    found = gaps(decision, await direct(gemma_session(gemma3_url)))
    print(f"Decisions (sync openai) vs session.judge on llama.cpp: largest gap {max(found):.1e}")
    assert max(found) == 0.0


@pytest.mark.asyncio
async def test_a_choice_past_the_single_controls_is_read_through_two_token_codes(
    gateway_url: str, gemma3_url: str
) -> None:
    # 100 values: past Gemma's 62 single-token controls, so each gets a two-token code (read
    # as P(first) x P(second | first)); the answers equal the direct session's exactly.
    values = [f"queue {n}" for n in range(100)]
    wire = [{"type": "choice", "name": "queue", "instructions": "Which queue?",
             "choices": [{"value": value} for value in values]}]  # fmt: skip
    decision = await ask_async(gateway_url, wire)
    async with gemma_session(gemma3_url) as session:
        judgment = await session.judge(
            STATE, {"queue": tv.Choice(values, instructions="Which queue?")}
        )
    direct_queue, [answer] = judgment["queue"], decision.answers
    assert isinstance(direct_queue, tv.ChoiceAnswer)
    assert judgment.diagnostics["queue"].controls[:2] == ("0A", "0B")
    assert len(judgment.diagnostics["queue"].codes) == 100
    assert [p.value for p in answer.probabilities] == values
    assert [p.probability for p in answer.probabilities] == list(
        direct_queue.probabilities.values()
    )
    assert answer.choice == direct_queue.choice


@pytest.mark.asyncio
async def test_messages_and_json_input_judge_as_the_state_they_hold(
    gateway_url: str, gemma3_url: str
) -> None:
    ticket = {"subject": "Duplicate charge", "message": "I was charged twice."}
    as_json = [{"role": "user", "content": [{"type": "input_json", "data": ticket}]}]
    as_text = [{"role": "user", "content": STATE}]
    by_json = await ask_async(gateway_url, WIRE_QUESTIONS[:1], input=as_json)
    by_text = await ask_async(gateway_url, WIRE_QUESTIONS[:1], input=as_text)
    async with gemma_session(gemma3_url) as session:
        json_judged = await session.judge(ticket, {"refund": TYPED["refund"]})
        text_judged = await session.judge(STATE, {"refund": TYPED["refund"]})
    assert by_json.answers[0].probability == json_judged["refund"].probabilities["true"]
    assert by_text.answers[0].probability == text_judged["refund"].probabilities["true"]


@pytest.mark.asyncio
async def test_session_openai_decisions_equals_the_direct_session(
    gateway_url: str, gemma3_url: str
) -> None:
    async with tv.Session.openai_decisions(
        gateway_url, http=tv.HttpSettings(api_key=KEY)
    ) as remote:
        judged = await remote.judge(STATE, TYPED)
        many = [item async for item in remote.judge_many([STATE, STATE + " Now."], TYPED)]
    expected = await direct(gemma_session(gemma3_url))
    assert list(judged) == list(TYPED)
    gap = max(
        abs(judged[qid].probabilities[k] - p)
        for qid in TYPED
        for k, p in expected[qid].probabilities.items()
    )
    print(f"Session.openai_decisions vs the direct session: largest gap {gap:.1e}")
    # P(true) crosses the wire as sent; P(false) is rebuilt as 1 - P(true): one rounding
    assert gap <= 1e-15
    assert all(judged[qid].confidence == expected[qid].confidence for qid in ("angry", "urgency"))
    assert judged.usage.prompt_tokens == expected.usage.prompt_tokens
    assert [item.error for item in many] == [None, None]
    first = many[0].judgment
    assert first is not None
    assert first["angry"].probabilities == expected["angry"].probabilities


@pytest.mark.asyncio
async def test_the_off_menu_guard_refuses_exactly_the_flagged_questions(gemma3_url: str) -> None:
    # Gemma 3 270M is a base model: most next-token mass goes off the menu. The threshold is
    # set between the questions' off-menu masses, so some are refused and some answered.
    probe = await direct(gemma_session(gemma3_url))
    masses = sorted(d.off_menu_mass or 0.0 for d in probe.diagnostics.values())
    threshold = (masses[0] + masses[-1]) / 2
    assert masses[0] < threshold < masses[-1]
    flagged = {qid for qid, d in probe.diagnostics.items() if (d.off_menu_mass or 0) > threshold}
    session = gemma_session(gemma3_url, off_menu_threshold=threshold, raise_off_menu=True)
    async with ready_gateway(session, GatewayConfig(keys=(KEY,))) as url:
        decision = await ask_async(url)
        async with tv.Session.openai_decisions(url, http=tv.HttpSettings(api_key=KEY)) as remote:
            with pytest.raises(tv.RefusalError) as caught:
                await remote.judge(STATE, TYPED)
    refused = {qid for qid, a in zip(TYPED, decision.answers, strict=True) if a.type == "refusal"}
    print(f"threshold {threshold:.3f}, masses {masses}, refused {sorted(refused)}")
    assert refused == flagged
    assert set(caught.value.refused) == flagged
    answered = caught.value.answers
    assert set(answered) == set(TYPED) - flagged
    for qid in answered:
        for key, p in probe[qid].probabilities.items():
            assert abs(answered[qid].probabilities[key] - p) <= 1e-15


@pytest.mark.asyncio
async def test_errors_are_the_clients_typed_exceptions(gateway_url: str) -> None:
    with pytest.raises(openai.AuthenticationError) as denied:
        await ask_async(gateway_url, key="wrong-key")
    assert denied.value.type == "authentication_error"
    many = [WIRE_QUESTIONS[0]] * 401
    with pytest.raises(openai.UnprocessableEntityError) as too_many:
        await ask_async(gateway_url, many)
    assert too_many.value.param == "questions"
    assert too_many.value.type == "invalid_request_error"
    wide = [{**WIRE_QUESTIONS[1], "choices": [{"value": f"v{n}"} for n in range(256)]}]
    with pytest.raises(openai.UnprocessableEntityError) as too_wide:
        await ask_async(gateway_url, wide)
    assert too_wide.value.param == "questions[0].choices"
    wrong = [{"type": "choice", "instructions": 7, "choices": [{"value": 1}, {"value": None}]}]
    with pytest.raises(openai.UnprocessableEntityError) as typed:
        await ask_async(gateway_url, wrong)
    assert typed.value.param == "questions[0].instructions"
    image = f"data:image/png;base64,{base64.b64encode(PNG_HEADER).decode()}"
    parts = [{"type": "input_text", "text": "Look:"}, {"type": "input_image", "image_url": image}]
    pictured = [{"role": "user", "content": parts}]
    with pytest.raises(openai.UnprocessableEntityError) as blind:
        await ask_async(gateway_url, WIRE_QUESTIONS[:1], input=pictured)
    print("images on a text-only model:", blind.value.message)


def png_url(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


#: Issue 43.7's request: an input with one picture, a question with two of its own, one with
#: none.
PICTURES = tuple(PNG_HEADER + bytes([n]) * 8 for n in (1, 2, 3))
PICTURED_TICKET = [{"role": "user", "content": [
    {"type": "input_text", "text": STATE},
    {"type": "input_image", "image_url": png_url(PICTURES[0])},
]}]  # fmt: skip
PICTURED_QUESTIONS = [WIRE_QUESTIONS[0], {"type": "predicate", "name": "pictured", "instructions": [
    {"type": "input_text", "text": "Does this photo show the parcel"},
    {"type": "input_image", "image_url": png_url(PICTURES[1])},
    {"type": "input_text", "text": "or this one?"},
    {"type": "input_image", "image_url": png_url(PICTURES[2])},
]}]  # fmt: skip


@pytest.mark.asyncio
async def test_a_questions_images_go_with_its_own_read_only_after_the_state(
    gemma3_url: str,
) -> None:
    # Issue 43.7. No server here reads images; the proxy in front of the real llama.cpp server
    # (its stubs named in faults.py: /props declares vision, a multimodal read is recorded,
    # then read as text) shows which read body carries which image, and where.
    state_image, first, second = PICTURES
    async with (
        VisionRecordingProxy(gemma3_url) as proxy,
        ready_gateway(gemma_session(proxy.url), GatewayConfig(keys=(KEY,))) as url,
    ):
        decision = await ask_async(url, PICTURED_QUESTIONS, input=PICTURED_TICKET)
    assert [answer.type for answer in decision.answers] == ["predicate", "predicate"]
    marker = proxy.media_marker
    reads: dict[str, tuple[str, list[bytes]]] = {}
    for body in proxy.completions:
        prompt = body["prompt"]
        assert isinstance(prompt, dict), "a read with images is multimodal"
        text = prompt["prompt_string"]
        which = "pictured" if "Does this photo" in text else "refund"
        reads[which] = (text, [base64.b64decode(data) for data in prompt["multimodal_data"]])
    assert set(reads) == {"refund", "pictured"}
    refund_text, refund_images = reads["refund"]
    assert refund_images == [state_image]  # was all three
    assert refund_text.count(marker) == 1
    assert refund_text.index(marker) < refund_text.index(STATE)
    text, images = reads["pictured"]
    assert images == [state_image, first, second]
    markers = [n for n in range(len(text)) if text.startswith(marker, n)]
    print(f"pictured read: markers at {markers}, state at {text.index(STATE)}, instructions "
          f"at {text.index('Does this photo')}")  # fmt: skip
    assert len(markers) == 3
    # the state's image before the state; the question's own after it, in request order, just
    # before its instructions, whose text numbers them as the read shows them
    assert markers[0] < text.index(STATE) < markers[1] < markers[2] < text.index("Does this")
    assert "Does this photo show the parcel [image 2] or this one? [image 3]" in text
    assert "[image 1]" in text[: markers[1]]


async def refusals(url: str) -> float:
    """The gateway's 422 answers on ``/v1/decisions`` so far (its Prometheus counter)."""
    line = 'typevet_gateway_requests_total{route="/v1/decisions",status="422"} '
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        rows = (await response.text()).splitlines()
    return sum(float(row[len(line) :]) for row in rows if row.startswith(line))


@pytest.mark.asyncio
async def test_a_question_refused_while_judging_is_named_once_and_the_sdk_stops_once(
    gemma3_url: str,
) -> None:
    # Issue 43.8. Under the Jev "fused" layout (letters A to P) a 17-value choice passes the
    # route's validation (2 to 255 values) and is refused while its reads are planned.
    values = [f"queue {n}" for n in range(17)]
    wide = {"type": "choice", "name": "queue", "instructions": "Which queue?",
            "choices": [{"value": value} for value in values]}  # fmt: skip
    typed = {"refund": TYPED["refund"], "queue": tv.Choice(values, instructions="Which queue?")}
    async with ready_gateway(
        gemma_session(gemma3_url, layout="fused"), GatewayConfig(keys=(KEY,))
    ) as url:
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            await ask_async(url, [WIRE_QUESTIONS[0], wide])
        print("refused while judging:", refused.value.param, refused.value.message)
        assert refused.value.param == "questions[1]"  # the route's own spelling; was questions.1
        assert refused.value.type == "invalid_request_error"
        assert "17 options" in refused.value.message
        with pytest.raises(openai.UnprocessableEntityError) as validated:
            await ask_async(url, [WIRE_QUESTIONS[0], {**wide, "choices": wide["choices"][:1]}])
        assert validated.value.param == "questions[1].choices"
        before = await refusals(url)
        async with tv.Session.openai_decisions(url, http=tv.HttpSettings(api_key=KEY)) as remote:
            with pytest.raises(tv.QuestionError) as alone:
                await remote.judge(STATE, typed)
            records = [f"{STATE} ({n})" for n in range(6)]
            with pytest.raises(tv.QuestionError) as batch:
                async for _ in remote.judge_many(records, typed, max_in_flight=1):
                    pass
        sent = await refusals(url) - before
    print(f"Session.openai_decisions: judge and a judge_many of 6 sent {sent:.0f} requests")
    assert alone.value.question_id == batch.value.question_id == "queue"
    assert sent == 2  # one for the judge, one for the batch; was 1 + 6, each record's error


@pytest.mark.asyncio
async def test_a_full_gateway_sheds_with_the_clients_rate_limit_error(gemma3_url: str) -> None:
    config = GatewayConfig(keys=(KEY,), max_active_requests=1, max_queue=0)
    async with ready_gateway(gemma_session(gemma3_url), config) as url:
        outcomes = await asyncio.gather(
            *(ask_async(url, WIRE_QUESTIONS) for _ in range(4)), return_exceptions=True
        )
    kinds = sorted(type(outcome).__name__ for outcome in outcomes)
    print("4 at once on 1 slot, no queue:", kinds)
    assert "RateLimitError" in kinds
    assert "Decision" in kinds
    limited = next(o for o in outcomes if isinstance(o, openai.RateLimitError))
    assert limited.response.headers["retry-after-ms"]


async def _post(url: str, body: bytes, **headers: str) -> tuple[int, Mapping[str, Any]]:
    async with (
        aiohttp.ClientSession() as http,
        asyncio.timeout(30),  # a typed answer, never a hang
        http.post(
            f"{url}/v1/decisions",
            data=body,
            headers={
                "Authorization": f"Bearer {KEY}",
                "Content-Type": "application/json",
                **headers,
            },
        ) as response,  # fmt: skip
    ):
        return response.status, await response.json()


@pytest.mark.asyncio
async def test_hostile_bodies_get_a_typed_4xx(gemma3_url: str) -> None:
    config = GatewayConfig(keys=(KEY,), max_body_bytes=256 * 1024, max_depth=64)
    base = {"model": "m", "input": STATE, "questions": WIRE_QUESTIONS[:1]}
    deep: Any = {}
    for _ in range(200):
        deep = {"a": deep}
    cases = {
        "oversize": (json.dumps({**base, "input": "x" * 300_000}).encode(), {}),
        "bomb": (gzip.compress(json.dumps({**base, "input": "x" * 5_000_000}).encode()),
                 {"Content-Encoding": "gzip"}),
        "deep": (json.dumps({**base, "input": [{"role": "user", "content": [
            {"type": "input_json", "data": deep}]}]}).encode(), {}),
        "not json": (b"{", {}),
        "too many": (json.dumps({**base, "questions": WIRE_QUESTIONS[:1] * 401}).encode(), {}),
        "wrong types": (json.dumps({**base, "questions": "all"}).encode(), {}),
    }  # fmt: skip
    async with ready_gateway(gemma_session(gemma3_url), config) as url:
        seen = {name: await _post(url, body, **headers) for name, (body, headers) in cases.items()}
    statuses = {name: status for name, (status, _) in seen.items()}
    print("hostile bodies:", statuses)
    assert statuses == {"oversize": 413, "bomb": 413, "deep": 422, "not json": 422,
                        "too many": 422, "wrong types": 422}  # fmt: skip
    for _, body in seen.values():
        assert set(body["error"]) == {"message", "type", "param", "code"}


# -- vLLM --------------------------------------------------------------------------------------


def vllm_session(url: str) -> tv.Session:
    # One read at a time, as test_vllm_live.py reads when it compares two reads.
    return tv.Session.vllm(url, model=VLLM_MODEL_ID, max_concurrency=1)


@pytest.mark.asyncio
async def test_over_vllm_both_clients_get_the_direct_answers(vllm_url: str) -> None:
    await direct(vllm_session(vllm_url))  # warm: the first read after start-up differs
    async with ready_gateway(vllm_session(vllm_url), GatewayConfig(keys=(KEY,))) as url:
        by_async = await ask_async(url)

        def ask() -> Any:
            with openai.OpenAI(
                api_key=KEY, base_url=f"{url}/v1", max_retries=0, timeout=TIMEOUT
            ) as client:
                return client.decisions.create(
                    model=VLLM_MODEL_ID, input=STATE, questions=WIRE_QUESTIONS
                )

        by_sync = await asyncio.to_thread(ask)
        async with tv.Session.openai_decisions(url, http=tv.HttpSettings(api_key=KEY)) as remote:
            by_session = await remote.judge(STATE, TYPED)
    expected = await direct(vllm_session(vllm_url))
    found = gaps(by_async, expected) + gaps(by_sync, expected)
    found += [abs(by_session[q].probabilities[k] - p) for q in TYPED
              for k, p in expected[q].probabilities.items()]  # fmt: skip
    print(f"Decisions vs session.judge on vLLM: largest gap {max(found):.1e}")
    assert max(found) <= 1e-9  # one read at a time, fp32 on CPU: seen 0.0


@pytest.mark.asyncio
async def test_over_vllm_a_questions_images_go_with_its_own_read_only_after_the_state(
    vllm_url: str,
) -> None:
    # Issue 43.7 on vLLM's chat body, through the same recording proxy (text-only model: the
    # proxy reads each body without its image parts).
    async with (
        VisionRecordingProxy(vllm_url) as proxy,
        ready_gateway(vllm_session(proxy.url), GatewayConfig(keys=(KEY,))) as url,
    ):
        decision = await ask_async(url, PICTURED_QUESTIONS, input=PICTURED_TICKET)
    assert [answer.type for answer in decision.answers] == ["predicate", "predicate"]
    reads: dict[str, list[Any]] = {}
    for body in proxy.chats:
        [message] = [m for m in body["messages"] if m["role"] == "user"]
        parts = message["content"]
        text = "".join(part.get("text", "") for part in parts)
        reads["pictured" if "Does this photo" in text else "refund"] = [
            base64.b64decode(part["image_url"]["url"].partition(",")[2])
            if part["type"] == "image_url"
            else part["text"]
            for part in parts
        ]
    state_image, first, second = PICTURES
    refund, pictured = reads["refund"], reads["pictured"]
    assert refund[0] == state_image  # was all three
    assert [piece for piece in refund if isinstance(piece, bytes)] == [state_image]
    print("pictured read's parts:", [p if isinstance(p, bytes) else p[:30] for p in pictured])
    assert pictured[0] == state_image
    assert isinstance(pictured[1], str)
    assert pictured[1].startswith(STATE)
    assert pictured[2:4] == [first, second]
    assert pictured[4].startswith("Does this photo show the parcel [image 2] or this one?")
