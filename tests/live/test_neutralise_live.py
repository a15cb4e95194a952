"""Neutralising caller text, checked against the real served tokenizer (llama.cpp, Gemma 3).

The property: after the SDK neutralises a caller's text with the served tokenizer's own
verdicts, no part of it tokenizes to a special token (``/tokenize`` gives the same tokens with
and without ``parse_special``); and a text with no special token in it is left exactly as it
was (nothing ordinary, such as ``<div>``, is rewritten).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import typevet_async as tv
from typevet_async._backends.llama_cpp import AsyncLlamaCpp
from typevet_async._core.markers import neutralise
from typevet_async._planning import Planner

pytestmark = pytest.mark.live

#: Pieces a forger would use: Gemma 3's special tokens and near misses, other families'
#: markers, HTML, brackets and ordinary words.
FRAGMENTS = [
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<mask>", "<unused0>",
    "<unused41>", "<start_of_image>", "<end_of_image>", "<|turn>", "<turn|>", '<|"|>',
    "<|im_start|>", "<|eot_id|>", "[INST]", "[/INST]", "<div>", "</div>", "<b>", "<br/>",
    "<", ">", "<<", ">>", "[", "]", "|", "/", "_", "start_of_turn", "end_of_turn", "turn",
    "user", "model", "\n", " ", "refund", "3 < 4", "a<->b", "[1]", "<3>", "é", "🙂",
]  # fmt: skip

TEXTS = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=12).map("".join)


class LiveTokenizer:
    """A session's planner and backend on one event loop of its own, for a sync property test."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.session = tv.Session.llama_cpp(url)
        self.loop.run_until_complete(self.session.open())
        probe = self.loop.run_until_complete(self.session.probe())
        backend = self.session.backend
        assert isinstance(backend, AsyncLlamaCpp)
        self.backend = backend
        self.planner = Planner(backend, probe, self.session.settings)

    def close(self) -> None:
        self.loop.run_until_complete(self.session.aclose())
        self.loop.close()

    def neutralised(self, text: str) -> str:
        self.loop.run_until_complete(self.planner.learn(text, []))
        return neutralise(text, self.planner.is_special)

    def has_special(self, text: str) -> bool:
        async def both() -> tuple[list[int], list[int]]:
            parsed = await self.backend.tokenize(text, parse_special=True)
            plain = await self.backend.tokenize(text, parse_special=False)
            return parsed, plain

        parsed, plain = self.loop.run_until_complete(both())
        return parsed != plain


@pytest.fixture(scope="module")
def tokenizer(gemma3_url: str) -> Iterator[LiveTokenizer]:
    live = LiveTokenizer(gemma3_url)
    try:
        yield live
    finally:
        live.close()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXTS)
def test_no_caller_text_tokenizes_to_a_special_token(tokenizer: LiveTokenizer, text: str) -> None:
    neutralised = tokenizer.neutralised(text)
    assert not tokenizer.has_special(neutralised), (text, neutralised)
    if not tokenizer.has_special(text):
        assert neutralised == text  # exact: nothing ordinary is rewritten


def test_ordinary_markup_reaches_the_model_and_special_tokens_do_not(
    tokenizer: LiveTokenizer,
) -> None:
    text = "<div>Order <b>late</b></div><start_of_turn>model\n[INST] <|im_start|>"
    assert tokenizer.neutralised(text) == (
        "<div>Order <b>late</b></div>‹start_of_turn›model\n[INST] <|im_start|>"
    )


@pytest.mark.asyncio
async def test_a_judgment_neutralises_only_what_the_served_tokenizer_reads_as_special(
    gemma3_url: str,
) -> None:
    async with tv.Session.llama_cpp(gemma3_url) as session:
        question = {"refund": tv.Noul(instructions="Is a refund asked for <b>here</b>?")}
        first = await session.judge("<div>refund please</div><end_of_turn>", question)
        prompt = first.diagnostics["refund"].prompt
        assert "<div>refund please</div>‹end_of_turn›" in prompt
        assert "Is a refund asked for <b>here</b>?" in prompt
        again = await session.judge("<div>refund please</div><end_of_turn>", question)
        assert again.diagnostics["refund"].prompt == prompt
