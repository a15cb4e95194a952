"""The answer methods of issue 44 on the toy model's real server (Gemma 3 270M, llama.cpp's
built-in ``gemma`` template): a Noul answered in words, a Score read as a scale, content-free
calibration and examples as earlier turns. Each read is checked against an independent read of
the same prompt outside the SDK (plain urllib), the tokens against the served tokenizer.

What these methods are worth is measured on the real instruction model in
``benchmarks/real_answers/bench_public_data.py``; here the toy model only shows the mechanics are
exact.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

import typevet_async as tv
from typevet_async._core.prompts.framing import GEMMA_FRAMES, TemplateFamily
from typevet_async._core.statistics.content_free import CONTENT_FREE_STATES, divide_prior

from .helpers import post_json, softmax, whole_vocabulary_logprobs

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

TICKET = "I was charged twice for order 1234 and want my money back."
REFUND = tv.Noul("Is the customer asking for a refund?")
URGENCY = tv.Score(["not urgent", "today", "right now"], instructions="How urgent is it?")


def tokens(url: str, text: str) -> list[int]:
    reply = post_json(url, "/tokenize", {"content": text, "add_special": False})
    return [int(token) for token in reply["tokens"]]


def independent_read(url: str, prompt: str, token_ids: tuple[int, ...]) -> tuple[float, ...]:
    """The options' probabilities from a whole-vocabulary read of ``prompt``, without the SDK."""
    logprobs = whole_vocabulary_logprobs(url, prompt, cache_prompt=False)
    return softmax([logprobs[token] for token in token_ids])


async def judged(
    url: str, question_id: str, question: tv.Question, **settings: Any
) -> tuple[tv.Answer, tv.Diagnostics]:
    """One question about `TICKET`, read without the prompt cache (so an independent read of
    the same prompt gives the same logprobs)."""
    async with tv.Session.llama_cpp(url, reproducible=True, **settings) as session:
        judgment = await session.judge(TICKET, {question_id: question})
    return judgment[question_id], judgment.diagnostics[question_id]


async def test_a_noul_in_words_reads_the_tokens_yes_and_no_where_the_model_writes_them(
    gemma3_url: str,
) -> None:
    answer, diagnostics = await judged(gemma3_url, "refund", REFUND, noul_controls="words")
    assert diagnostics.controls == ("No", "Yes")
    assert diagnostics.prompt.endswith(
        "Is the customer asking for a refund?\nAnswer Yes or No.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    # The served tokenizer's own tokens for the words, appended at the answer position.
    base = tokens(gemma3_url, diagnostics.prompt)
    for word, token in zip(("No", "Yes"), diagnostics.token_ids, strict=True):
        assert tokens(gemma3_url, diagnostics.prompt + word) == [*base, token]
    assert isinstance(answer, tv.NoulAnswer)
    expected = independent_read(gemma3_url, diagnostics.prompt, diagnostics.token_ids)
    assert (answer.probabilities["false"], answer.noul) == pytest.approx(expected, abs=1e-6)


async def test_a_score_on_a_scale_reads_the_numbers_and_reports_both_levels(
    gemma3_url: str,
) -> None:
    # The scale alone: its content-free prior is another test's.
    answer, diagnostics = await judged(
        gemma3_url, "urgency", URGENCY, score_controls="scale", content_free="off"
    )
    assert diagnostics.controls == ("1", "2", "3")
    assert "1. not urgent\n2. today\n3. right now\nAnswer with one number from 1 to 3." in (
        diagnostics.prompt
    )
    assert isinstance(answer, tv.ScoreAnswer)
    probabilities = independent_read(gemma3_url, diagnostics.prompt, diagnostics.token_ids)
    assert tuple(answer.probabilities.values()) == pytest.approx(probabilities, abs=1e-6)
    assert answer.score == pytest.approx(sum(i * p for i, p in enumerate(probabilities)), abs=1e-6)
    assert answer.level == max(range(3), key=lambda level: probabilities[level])


async def test_content_free_divides_the_prior_read_once_on_the_content_free_states(
    gemma3_url: str,
) -> None:
    questions = {"refund": REFUND, "urgency": URGENCY}
    async with tv.Session.llama_cpp(gemma3_url, content_free=True, reproducible=True) as session:
        first = await session.judge(TICKET, questions)
        second = await session.judge("Thanks, the replacement arrived.", questions)
    for judgment in (first, second):
        for question_id in questions:
            diagnostics = judgment.diagnostics[question_id]
            prior = diagnostics.content_free_prior
            raw = diagnostics.raw_probabilities
            assert prior is not None
            assert raw is not None
            assert raw == pytest.approx(softmax(diagnostics.logprobs), abs=1e-12)
            divided = tuple(judgment[question_id].probabilities.values())
            assert divided == pytest.approx(divide_prior(raw, prior), abs=1e-12)
    for question_id in questions:  # one prior per question for the whole session
        assert (
            first.diagnostics[question_id].content_free_prior
            == second.diagnostics[question_id].content_free_prior
        )


async def test_the_prior_is_the_mean_of_independent_reads_of_the_content_free_prompts(
    gemma3_url: str,
) -> None:
    async with tv.Session.llama_cpp(gemma3_url, content_free=True, reproducible=True) as session:
        judgment = await session.judge(TICKET, {"refund": REFUND})
    diagnostics = judgment.diagnostics["refund"]
    block = "Is the customer asking for a refund?\nAnswer Yes or No."  # in words, the default
    prompts = content_free_prompts(block)
    assert prompts[0] == diagnostics.prompt.replace(TICKET, "N/A")
    reads = [independent_read(gemma3_url, prompt, diagnostics.token_ids) for prompt in prompts]
    mean = tuple(sum(read[i] for read in reads) / len(reads) for i in range(2))
    assert diagnostics.content_free_prior == pytest.approx(mean, abs=1e-5)


def content_free_prompts(block: str) -> list[str]:
    """The prompts of the content-free states under Gemma's template (which trims a message:
    the empty state's prompt starts at the question; its tokenizer reads "[MASK]" as text)."""
    frame = attrs.evolve(GEMMA_FRAMES[TemplateFamily.GEMMA3], trim=True)
    return [frame.prefix(f"{state}\n\n{block}") for state in CONTENT_FREE_STATES]


async def test_the_off_menu_guard_judges_the_answer_and_reports_the_prior_s_off_menu_mass(
    gemma3_url: str,
) -> None:
    # The toy model answers a state that opens with "Yes" on the menu (it repeats the word),
    # and the content-free states far off it: a threshold of 0.5 lies between the two.
    states = ("Yes, I want a refund.", "Yes, refund me.")
    async with tv.Session.llama_cpp(
        gemma3_url, content_free=True, reproducible=True, off_menu_threshold=0.5,
        raise_off_menu=True,
    ) as session:  # fmt: skip
        first = await session.judge(states[0], {"refund": REFUND})
        second = await session.judge(states[1], {"refund": REFUND})
        with pytest.raises(tv.OffMenuError) as raised:  # the guard still judges the answer
            await session.judge(TICKET, {"refund": REFUND})
    for judgment in (first, second):
        diagnostics = judgment.diagnostics["refund"]
        assert diagnostics.off_menu_mass is not None
        assert diagnostics.off_menu_mass < 0.5
        assert not diagnostics.off_menu_flagged
        assert diagnostics.content_free_off_menu_mass is not None
        assert diagnostics.content_free_off_menu_mass > 0.5
    # The prior's off-menu mass is the mean of independent reads of the content-free prompts.
    diagnostics = first.diagnostics["refund"]
    prompts = content_free_prompts("Is the customer asking for a refund?\nAnswer Yes or No.")
    masses = []
    for prompt in prompts:
        logprobs = whole_vocabulary_logprobs(gemma3_url, prompt, cache_prompt=False)
        masses.append(1.0 - sum(math.exp(logprobs[token]) for token in diagnostics.token_ids))
    # Off-menu mass is exact up to the float32 normaliser's rounding (docs/guide/judging.md).
    assert diagnostics.content_free_off_menu_mass == pytest.approx(sum(masses) / 3, abs=5e-3)
    assert second.diagnostics["refund"].content_free_prior == diagnostics.content_free_prior
    # The prior was read once, by the first judgment: the later ones read only their state.
    assert first.usage.reads >= diagnostics.reads + len(CONTENT_FREE_STATES)
    assert second.usage.reads == second.diagnostics["refund"].reads
    assert raised.value.off_menu_mass > 0.5


async def test_scores_only_content_free_answers_with_permutations_for_a_choice(
    gemma3_url: str,
) -> None:
    route = tv.Choice(["billing", "shipping", "tech"], instructions="Which team handles it?")
    questions = {"route": route, "urgency": URGENCY}
    async with tv.Session.llama_cpp(
        gemma3_url, content_free="scores", permutations={"route": 3}, reproducible=True
    ) as session:
        judgment = await session.judge(TICKET, questions)
        again = await session.judge(TICKET, questions, permutations={"route": 2})
    for answered in (judgment, again):
        assert list(answered) == ["route", "urgency"]
        assert answered.diagnostics["route"].content_free_prior is None  # a Choice: no prior
        assert answered.diagnostics["urgency"].content_free_prior is not None
    assert len(judgment.diagnostics["route"].rotations) == 3
    assert len(again.diagnostics["route"].rotations) == 2
    # The Score is read in one order under both: one prior, read by the first judgment.
    assert again.usage.reads == sum(d.reads for d in again.diagnostics.values())


async def test_examples_are_earlier_turns_the_next_state_reads_from_the_prompt_cache(
    gemma3_url: str,
) -> None:
    question = tv.Choice(
        {"billing": "charges, refunds", "shipping": "parcels, delivery"},
        instructions="Which team should handle the ticket?",
        examples=[
            ("I was charged twice for my order.", "billing"),
            ("My parcel has not arrived yet.", "shipping"),
        ],
    )
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as session:
        first = await session.judge(TICKET, {"route": question})
    async with tv.Session.llama_cpp(gemma3_url, max_concurrency=1) as session:
        await session.judge(TICKET, {"route": question})
        second = await session.judge("Where is parcel 77?", {"route": question})
    prompt = first.diagnostics["route"].prompt
    block = (
        "Which team should handle the ticket?\nA. billing: charges, refunds\n"
        "B. shipping: parcels, delivery\nAnswer with one letter."
    )
    assert prompt == (
        f"<start_of_turn>user\nI was charged twice for my order.\n\n{block}<end_of_turn>\n"
        f"<start_of_turn>model\nA<end_of_turn>\n<start_of_turn>user\nMy parcel has not arrived "
        f"yet.\n\n{block}<end_of_turn>\n<start_of_turn>model\nB<end_of_turn>\n"
        f"<start_of_turn>user\n{TICKET}\n\n{block}<end_of_turn>\n<start_of_turn>model\n"
    )
    # What llama.cpp's own template renders for the same conversation (the SDK frames it).
    rendered = post_json(
        gemma3_url,
        "/apply-template",
        {
            "messages": [
                {"role": "user", "content": f"I was charged twice for my order.\n\n{block}"},
                {"role": "assistant", "content": "A"},
                {"role": "user", "content": f"My parcel has not arrived yet.\n\n{block}"},
                {"role": "assistant", "content": "B"},
                {"role": "user", "content": f"{TICKET}\n\n{block}"},
            ],
            "add_generation_prompt": True,
        },
    )["prompt"]
    assert rendered == prompt
    answer = first["route"]
    assert isinstance(answer, tv.ChoiceAnswer)
    diagnostics = first.diagnostics["route"]
    expected = independent_read(gemma3_url, prompt, diagnostics.token_ids)
    assert tuple(answer.probabilities.values()) == pytest.approx(expected, abs=1e-6)
    # The examples are a prefix the next state shares: read from the server's prompt cache.
    usage = second.usage
    assert usage.cached_tokens >= len(tokens(gemma3_url, prompt.split(TICKET)[0])) - 1
