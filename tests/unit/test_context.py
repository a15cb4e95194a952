"""A prompt that certainly cannot fit the served context is refused before anything is sent
(`typevet_async._core.reading.probe.check_context`): the pure bound, and the planner applying it to
the whole prompt (state, examples, instructions, options) with `InMemoryStubBackend`, a
hand-written stub that records every call (the real server: tests/live/test_limits_live.py).
"""

from __future__ import annotations

import attrs
import pytest

import typevet_async as tv
from typevet_async._core.reading.probe import MAX_TOKEN_BYTES, check_context, fewest_tokens

from .stubs import InMemoryStubBackend

CONTEXT = 2048
#: The most bytes a prompt may hold before it certainly takes the whole context.
MOST = MAX_TOKEN_BYTES * (CONTEXT - 1)


def test_the_fewest_tokens_are_the_bytes_over_the_longest_token_rounded_up() -> None:
    assert [fewest_tokens(size) for size in (0, 1, 256, 257, 512, 513)] == [0, 1, 1, 2, 2, 3]


def test_a_prompt_is_refused_only_once_its_bytes_leave_no_room_for_the_answer() -> None:
    check_context("q", ["x" * MOST], CONTEXT)  # at least 2,047 tokens: may fit
    with pytest.raises(tv.PromptTooLongError) as raised:
        check_context("q", ["x" * (MOST - 10), "y" * 11], CONTEXT)  # every text counts
    error = raised.value
    assert (error.prompt_bytes, error.min_tokens, error.context_tokens) == (MOST + 1, 2048, 2048)
    assert error.question_id == "q"
    assert isinstance(error, tv.InvalidInputError)
    assert f"{MOST + 1:,} bytes" in str(error)
    assert "at least 2,048 tokens" in str(error)
    assert "2,048 tokens per request" in str(error)
    assert str(error).startswith("question 'q': ")


def test_bytes_not_characters_are_counted_and_trimmable_whitespace_is_not() -> None:
    euro = MOST // 3 + 1  # three bytes each: past the limit in far fewer characters
    with pytest.raises(tv.PromptTooLongError):
        check_context("q", ["€" * euro], CONTEXT)
    check_context("q", ["€" * (MOST // 3)], CONTEXT)
    check_context("q", [" " * MOST + "x" + "\n" * MOST], CONTEXT)  # a template may trim it
    check_context("q", ["\ud800" * (MOST // 3)], CONTEXT)  # a lone surrogate never raises


def test_an_unknown_context_refuses_nothing() -> None:
    check_context("q", ["x" * (10 * MOST)], None)


class _ContextStub(InMemoryStubBackend):
    """The stub, its probe declaring a context of `CONTEXT` tokens."""

    async def probe(self) -> tv.Probe:
        return attrs.evolve(await super().probe(), context_tokens=CONTEXT)


def _choice(labels: int = 2, description: str = "", examples: int = 0) -> tv.Choice:
    options = {f"label{n}": description or None for n in range(labels)}
    return tv.Choice(
        options,
        instructions="Which one?",
        examples=[("an example", "label0")] * examples if examples else None,
    )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("state", "question", "where"),
    [
        ("x" * (MOST + 1), _choice(), "the state alone"),
        ("x" * (MOST // 2), _choice(description="y" * (MOST // 4)), "state and descriptions"),
        ("short", _choice(labels=3, description="y" * (MOST // 3 + 10)), "the options"),
    ],
)
async def test_the_whole_prompt_past_the_context_is_refused_unsent(
    state: str, question: tv.Choice, where: str
) -> None:
    backend = _ContextStub()
    async with tv.Session(backend) as session:
        with pytest.raises(tv.PromptTooLongError) as raised:
            await session.judge(state, {"route": question, "other": _choice()})
    assert raised.value.question_id == "route", where
    assert backend.read_requests == [], where
    assert backend.special_queries == [], where


@pytest.mark.asyncio
async def test_examples_count_in_every_prompt_of_their_question() -> None:
    backend = _ContextStub()
    big = "e" * (MOST // 3)
    question = tv.Choice(
        ["a", "b"], instructions="Which?", examples=[(big, "a"), (big, "b"), (big, "a"), ("x", "b")]
    )
    async with tv.Session(backend) as session:
        with pytest.raises(tv.PromptTooLongError) as raised:
            await session.judge("state", {"route": question})
    assert raised.value.question_id == "route"
    assert backend.read_requests == []
    assert backend.special_queries == []


@pytest.mark.asyncio
async def test_a_prompt_that_may_fit_is_sent() -> None:
    backend = _ContextStub()
    async with tv.Session(backend) as session:
        judgment = await session.judge("x" * (MOST // 2), {"route": _choice()})
    assert judgment["route"] is not None
    assert backend.reads == ["route"]
