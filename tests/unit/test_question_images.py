"""A question's own images (issue 43.7): ``session.judge(question_images=...)`` shows them in
that question's reads only, after the state, just before its instructions, in the order given;
the Decisions route gives each question the images of its own instructions. Over the
in-memory stub backend (it records every read's request); the real server's read bodies are
tests/live/test_decisions_live.py's."""

from __future__ import annotations

import base64
from typing import Any

import pytest

import typevet_async as tv
from typevet_async._backends import vllm_wire
from typevet_async._core.prompts.layouts import Message
from typevet_async._core.prompts.scoring import plan_question
from typevet_async._core.reading.read_keys import read_key
from typevet_async._core.wires.decisions import request_from_decisions

from .stubs import InMemoryStubBackend
from .test_gateway import AUTH, start

STATE_IMAGE, FIRST, SECOND = (
    tv.Image.from_bytes(b"\x89PNG\r\n\x1a\n" + bytes([n]) * 8, "image/png") for n in (1, 2, 3)
)
STATE = "My parcel arrived broken."
QUESTIONS: dict[str, tv.Question] = {
    "broken": tv.Noul(instructions="Is the item in [image 2] broken?"),
    "refund": tv.Noul(instructions="Is a refund requested?"),
}


def by_question(stub: InMemoryStubBackend) -> dict[str, Message]:
    """Each question's one message, as its read was asked."""
    messages = {}
    for request in stub.read_requests:
        [message] = request.messages
        messages[request.question_id] = message
    return messages


@pytest.mark.asyncio
async def test_a_questions_images_go_with_its_reads_only_after_the_state() -> None:
    stub = InMemoryStubBackend(vision=True)
    async with tv.Session(stub) as session:
        judgment = await session.judge(
            STATE, QUESTIONS, images=[STATE_IMAGE], question_images={"broken": [FIRST, SECOND]}
        )
    assert list(judgment) == ["broken", "refund"]
    messages = by_question(stub)
    refund, broken = messages["refund"], messages["broken"]
    assert refund.all_images() == (STATE_IMAGE,)
    assert refund.inline == ()
    assert broken.all_images() == (STATE_IMAGE, FIRST, SECOND)
    # the state's image before the text; the question's own at its instructions, in order
    pieces = broken.segments()
    assert pieces[0] is STATE_IMAGE
    assert isinstance(pieces[1], str)
    assert pieces[1].startswith(STATE)
    assert pieces[2:4] == (FIRST, SECOND)
    assert isinstance(pieces[4], str)
    assert pieces[4].startswith("Is the item in [image 2] broken?")
    # both questions still share the state as their prompt's prefix
    assert broken.content.startswith(pieces[1])
    assert refund.content.startswith(pieces[1])


@pytest.mark.parametrize(
    ("question_images", "message"),
    [
        ({"nope": [FIRST]}, "question_images names 'nope', which this judgment does not ask"),
        ([FIRST], "question_images must map question ids to a tv.Image or a sequence"),
        ({"broken": b"raw"}, r"question_images\['broken'\]: images must be a tv.Image or a"),
        ({"broken": [FIRST] * 8}, "9 images in this judgment .*at most 8"),
    ],
)
@pytest.mark.asyncio
async def test_bad_question_images_are_refused_before_anything_is_sent(
    question_images: Any, message: str
) -> None:
    stub = InMemoryStubBackend(vision=True)
    async with tv.Session(stub) as session:
        with pytest.raises(tv.InvalidInputError, match=message):
            await session.judge(
                STATE, QUESTIONS, images=[STATE_IMAGE], question_images=question_images
            )
    assert (stub.probes, stub.read_requests) == (0, [])


@pytest.mark.asyncio
async def test_a_server_without_vision_refuses_them_unread() -> None:
    stub = InMemoryStubBackend()
    async with tv.Session(stub) as session:
        with pytest.raises(tv.InvalidInputError, match="does not declare vision"):
            await session.judge(STATE, QUESTIONS, question_images={"broken": FIRST})
    assert stub.read_requests == []


LETTERS = {letter: 10 + n for n, letter in enumerate("ABCDEFGHIJKLMNOP")}


def test_the_split_layout_shows_them_on_the_questions_message_and_fused_refuses() -> None:
    def plan(layout: tv.Layout) -> tv.ScoringRequest:
        return plan_question(
            "broken", QUESTIONS["broken"], STATE, family=None, control_ids=LETTERS,
            layout=layout, images=[STATE_IMAGE], question_images=[FIRST],
        )  # fmt: skip

    system, evidence, question = plan(tv.Layout.SPLIT).messages
    assert (system.images, evidence.images, question.images) == ((), (STATE_IMAGE,), (FIRST,))
    # one JSON message holds the state and the question: nowhere to show them after the state
    with pytest.raises(tv.QuestionError, match="fused layout") as refused:
        plan(tv.Layout.FUSED)
    assert refused.value.question_id == "broken"


def test_llama_cpp_markers_stand_where_each_image_goes() -> None:
    marker = "<__media__>"
    request = plan_question(
        "broken", QUESTIONS["broken"], STATE, family=tv.TemplateFamily.GEMMA3,
        control_ids=LETTERS, images=[STATE_IMAGE], question_images=[FIRST, SECOND],
        media_marker=marker,
    )  # fmt: skip
    assert request.prompt is not None
    [message] = request.messages
    text = message.content
    markers = [n for n in range(len(text)) if text.startswith(marker, n)]
    assert len(markers) == 3
    assert markers[0] < text.index(STATE) < markers[1] < markers[2] < text.index("Is the item")
    assert [offset for offset, _ in message.inline] == markers[1:]  # each image at its marker
    assert message.all_images() == (STATE_IMAGE, FIRST, SECOND)  # the markers' order
    assert text in request.prompt


def test_vllm_sends_them_between_the_text_parts() -> None:
    message = Message("user", "STATE\n\nQUESTION", (STATE_IMAGE,), ((7, FIRST), (7, SECOND)))
    [sent] = vllm_wire.chat_messages([message])
    kinds = [(part["type"], part.get("text")) for part in sent["content"]]
    assert kinds == [
        ("image_url", None), ("text", "STATE\n\n"), ("image_url", None), ("image_url", None),
        ("text", "QUESTION"),
    ]  # fmt: skip
    urls = [part["image_url"]["url"] for part in sent["content"] if part["type"] == "image_url"]
    assert urls == [image.data_uri() for image in (STATE_IMAGE, FIRST, SECOND)]
    assert sent["role"] == "user"


def test_an_inline_image_is_in_the_read_key_and_a_key_without_one_is_unchanged() -> None:
    def request(message: Message) -> tv.ScoringRequest:
        return tv.ScoringRequest("q", QUESTIONS["refund"], (message,), "P", ("A",), (1,))

    plain = Message("user", "text", (STATE_IMAGE,))
    keys = {
        read_key("id", "probe", request(message))
        for message in (
            plain,
            Message("user", "text", (STATE_IMAGE,), ((2, FIRST),)),
            Message("user", "text", (STATE_IMAGE,), ((3, FIRST),)),
            Message("user", "text", (STATE_IMAGE, FIRST)),
        )
    }
    assert len(keys) == 4
    # a message without inline images keys as before the change (caches stay warm)
    assert read_key("id", "probe", request(plain)) == read_key(
        "id", "probe", request(Message("user", "text", (STATE_IMAGE,), ()))
    )


def data_url(image: tv.Image) -> str:
    return f"data:image/png;base64,{base64.b64encode(image.data).decode()}"


def decisions_body() -> dict[str, Any]:
    """A ticket with a photo, a question with two photos of its own, one with none."""
    return {
        "model": "m",
        "input": [{"role": "user", "content": [
            {"type": "input_text", "text": STATE},
            {"type": "input_image", "image_url": data_url(STATE_IMAGE)},
        ]}],
        "questions": [
            {"type": "predicate", "instructions": "Is a refund requested?"},
            {"type": "predicate", "instructions": [
                {"type": "input_text", "text": "Is this"},
                {"type": "input_image", "image_url": data_url(FIRST)},
                {"type": "input_text", "text": "the same as this?"},
                {"type": "input_image", "image_url": data_url(SECOND)},
            ]},
        ],
    }  # fmt: skip


def test_the_decisions_request_gives_each_question_its_own_images() -> None:
    call = request_from_decisions(decisions_body())
    assert call.state == f"{STATE}\n[image 1]"
    assert call.images == (("image/png", STATE_IMAGE.data),)
    assert call.question_images == {"1": (("image/png", FIRST.data), ("image/png", SECOND.data))}
    # numbered as the question's read shows them: the input's first
    assert call.questions["1"].instructions == "Is this\n[image 2]\nthe same as this?\n[image 3]"


@pytest.mark.asyncio
async def test_the_decisions_route_sends_each_questions_images_with_its_read_only() -> None:
    client, stub = await start(InMemoryStubBackend(vision=True))
    try:
        response = await client.post("/v1/decisions", json=decisions_body(), headers=AUTH)
        assert response.status == 200, await response.text()
    finally:
        await client.close()
    messages = by_question(stub)
    # before: all three images in both reads, before the state
    assert [image.data for image in messages["0"].images] == [STATE_IMAGE.data]
    assert [image.data for image in messages["1"].images] == [STATE_IMAGE.data]
    assert [image.data for image in messages["0"].all_images()] == [STATE_IMAGE.data]
    assert [image.data for image in messages["1"].all_images()] == [
        STATE_IMAGE.data, FIRST.data, SECOND.data,
    ]  # fmt: skip
