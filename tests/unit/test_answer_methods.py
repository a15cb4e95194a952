"""The answer methods of issue 44, their arithmetic and rendering: a Noul answered in words, a
Score read as a numbered scale, content-free calibration and examples shown as earlier turns.

The session-level tests use the in-memory stub backend (`stubs.InMemoryStubBackend`) to count
reads and fail one on cue; each method is also read live on the toy model's server
(tests/live/test_answer_methods_live.py).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import anyio
import pytest

import typevet_async as tv
from typevet_async._core.prompts.controls import NOUL_WORDS, UPPERCASE
from typevet_async._core.prompts.fields import framing_pin
from typevet_async._core.prompts.framing import (
    ANSWER_PROBE,
    GEMMA_FRAMES,
    PROBE_MESSAGE,
    SECOND_PROBE_MESSAGE,
    TemplateFamily,
    learn_turns,
)
from typevet_async._core.prompts.layouts import Layout
from typevet_async._core.prompts.scoring import bind_question, request_for
from typevet_async._core.reading.readings import softmax
from typevet_async._core.statistics.calibration import question_hash
from typevet_async._core.statistics.content_free import (
    CONTENT_FREE_STATES,
    PRIOR_FLOOR,
    content_free_off_menu_mass,
    content_free_prior,
    divide_prior,
)
from typevet_async._session.priors import PriorCache
from typevet_async._session.settings import ReadOptions

from .stubs import IDS, InMemoryStubBackend, failing_after

#: Control ids with letters, digits and the Noul's words (as a probe in context gives them).
CONTROL_IDS = {
    **IDS,
    **{letter: 2000 + n for n, letter in enumerate(UPPERCASE)},
    "No": 3000,
    "Yes": 3001,
}
GEMMA3 = GEMMA_FRAMES[TemplateFamily.GEMMA3]
#: Gemma 3's template around a conversation of two turns (recorded from the real server:
#: benchmarks/client_cost/recorded/llama_cpp/probe.json).
GEMMA3_HISTORY = (
    f"<start_of_turn>user\n{PROBE_MESSAGE}<end_of_turn>\n<start_of_turn>model\n{ANSWER_PROBE}"
    f"<end_of_turn>\n<start_of_turn>user\n{SECOND_PROBE_MESSAGE}<end_of_turn>\n"
    "<start_of_turn>model\n"
)
GEMMA3_TURNS = ("<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>\n<start_of_turn>user\n")
SENTIMENT = tv.Score(
    ["very negative", "negative", "neutral", "positive", "very positive"],
    instructions="How positive is the review?",
)


# -- content-free calibration ----------------------------------------------------------------


def test_the_prior_is_the_mean_of_the_content_free_answers() -> None:
    assert content_free_prior([(0.2, 0.8), (0.4, 0.6), (0.3, 0.7)]) == pytest.approx((0.3, 0.7))
    assert CONTENT_FREE_STATES == ("N/A", "", "[MASK]")  # Zhao et al.'s three


def test_dividing_the_prior_out_is_zhao_et_al_s_diagonal_map() -> None:
    # W = diag(p_cf)^-1, b = 0: q_i = (p_i / cf_i) / sum_j (p_j / cf_j).
    p, prior = (0.6, 0.3, 0.1), (0.5, 0.25, 0.25)
    weights = [0.6 / 0.5, 0.3 / 0.25, 0.1 / 0.25]
    assert divide_prior(p, prior) == pytest.approx([w / sum(weights) for w in weights])
    # A model that says yes to nothing at 0.8 and to this state at 0.8 has learnt nothing.
    assert divide_prior((0.2, 0.8), (0.2, 0.8)) == pytest.approx((0.5, 0.5))


def test_a_uniform_prior_changes_nothing_and_a_zero_is_floored() -> None:
    assert divide_prior((0.1, 0.2, 0.7), (1 / 3, 1 / 3, 1 / 3)) == pytest.approx((0.1, 0.2, 0.7))
    divided = divide_prior((0.5, 0.5), (1.0, 0.0))
    assert divided[1] / divided[0] == pytest.approx(1.0 / PRIOR_FLOOR)
    assert all(math.isfinite(p) for p in divided)


def test_a_prior_that_is_not_a_distribution_is_refused() -> None:
    with pytest.raises(tv.InvalidLogprobsError, match="at least one read"):
        content_free_prior([])
    with pytest.raises(tv.InvalidLogprobsError, match="different option counts"):
        content_free_prior([(0.5, 0.5), (0.2, 0.3, 0.5)])
    with pytest.raises(tv.InvalidLogprobsError, match="not a distribution"):
        content_free_prior([(math.nan, 1.0)])
    with pytest.raises(tv.InvalidLogprobsError, match="against a prior of 3"):
        divide_prior((0.5, 0.5), (0.2, 0.3, 0.5))


def test_the_prior_s_off_menu_mass_is_the_mean_of_its_reads_or_unknown() -> None:
    assert content_free_off_menu_mass([0.9, 0.6, 0.3]) == pytest.approx(0.6)
    assert content_free_off_menu_mass([0.9, None, 0.3]) is None  # a read from logits
    assert content_free_off_menu_mass([]) is None


def test_a_prior_is_read_without_the_guard_and_with_its_own_questions_counts() -> None:
    options = ReadOptions.for_call(
        tv.SessionSettings(),
        off_menu_threshold=0.5,
        raise_off_menu=True,
        permutations={"route": 3, "urgency": 2},
        label_prior=True,
    )
    priors = options.for_priors({"urgency"})
    assert (priors.off_menu_threshold, priors.raise_off_menu) == (None, False)
    assert priors.permutations == {"urgency": 2}
    assert priors.label_prior


@pytest.mark.asyncio
async def test_the_prior_cache_reads_once_for_callers_at_the_same_time() -> None:
    cache, calls = PriorCache(), []

    async def read() -> tuple[float, ...]:
        calls.append(1)
        await anyio.sleep(0.05)
        return (0.25, 0.75)

    results: list[tuple[float, ...]] = []

    async def get() -> None:
        results.append(await cache.get("key", read))

    async with anyio.create_task_group() as group:
        for _ in range(5):
            group.start_soon(get)
    assert calls == [1]
    assert results == [(0.25, 0.75)] * 5
    assert cache.reads == 1


@pytest.mark.asyncio
async def test_a_failed_prior_read_is_not_kept_and_the_next_caller_reads_again() -> None:
    cache, attempts = PriorCache(), []

    async def read() -> tuple[float, ...]:
        attempts.append(1)
        if len(attempts) == 1:
            raise tv.ServerError("boom", status=503, body="")
        return (0.5, 0.5)

    with pytest.raises(tv.ServerError):
        await cache.get("key", read)
    assert cache.known("key") is None
    assert await cache.get("key", read) == (0.5, 0.5)
    assert len(attempts) == 2


def test_the_prior_cache_keeps_at_most_its_size() -> None:
    cache = PriorCache(size=2)

    async def fill() -> None:
        for key in "abc":
            await cache.get(key, _constant((1.0,)))

    anyio.run(fill)
    assert cache.known("a") is None
    assert cache.known("c") == (1.0,)


def _constant(value: tuple[float, ...]) -> Any:
    async def read() -> tuple[float, ...]:
        return value

    return read


# -- a Noul in words, a Score on a scale -------------------------------------------------------


def test_a_noul_in_words_is_answered_no_or_yes_with_the_words_token_ids() -> None:
    question = tv.Noul("Is the customer asking for a refund?")
    plan = bind_question(question, Layout.TYPEVET, CONTROL_IDS, None, noul_controls="words")
    assert plan.controls == NOUL_WORDS == ("No", "Yes")
    assert plan.token_ids == (3000, 3001)
    assert plan.field_block == "Is the customer asking for a refund?\nAnswer Yes or No."
    described = tv.Noul("Refund?", criteria={"true": "asks for money back"})
    plan = bind_question(described, Layout.TYPEVET, CONTROL_IDS, None, noul_controls="words")
    assert plan.field_block == "Refund?\nYes: asks for money back\nAnswer Yes or No."


def test_a_noul_in_letters_is_the_plain_letter_prompt() -> None:
    plan = bind_question(tv.Noul("Refund?"), Layout.TYPEVET, CONTROL_IDS, None)
    assert plan.field_block == "Refund?\nA. No\nB. Yes\nAnswer with one letter."


def test_words_the_tokenizer_splits_are_refused_naming_the_setting() -> None:
    without_yes = {key: value for key, value in CONTROL_IDS.items() if key != "Yes"}
    with pytest.raises(tv.ControlTokenError, match="noul_controls='words'"):
        bind_question(tv.Noul("Refund?"), Layout.TYPEVET, without_yes, None, noul_controls="words")
    with pytest.raises(tv.ControlTokenError, match="same lead"):
        bind_question(
            tv.Noul("Refund?"), Layout.TYPEVET, CONTROL_IDS, None,
            leads={"Yes": (29871,)}, noul_controls="words",
        )  # fmt: skip


def test_a_score_on_a_scale_is_numbered_from_one_lowest_first() -> None:
    plan = bind_question(SENTIMENT, Layout.TYPEVET, CONTROL_IDS, None, score_controls="scale")
    assert plan.controls == ("1", "2", "3", "4", "5")
    assert plan.token_ids == tuple(IDS[str(n)] for n in range(1, 6))
    assert plan.field_block == (
        "How positive is the review?\n1. very negative\n2. negative\n3. neutral\n4. positive\n"
        "5. very positive\nAnswer with one number from 1 to 5."
    )


def test_a_scale_and_words_keep_their_one_order_under_a_rotation() -> None:
    scale = bind_question(
        SENTIMENT, Layout.TYPEVET, CONTROL_IDS, None, rotation=2, score_controls="scale"
    )
    assert scale.order == ()
    assert scale.controls[0] == "1"
    words = bind_question(
        tv.Noul("Refund?"), Layout.TYPEVET, CONTROL_IDS, None, rotation=1, noul_controls="words"
    )
    assert words.order == ()
    assert words.controls == NOUL_WORDS
    lettered = bind_question(SENTIMENT, Layout.TYPEVET, CONTROL_IDS, None, rotation=2)
    assert lettered.order == (2, 3, 4, 0, 1)


def test_a_score_of_more_than_nine_levels_stays_lettered() -> None:
    ten = tv.Score([f"level {n}" for n in range(10)], instructions="How much?")
    plan = bind_question(ten, Layout.TYPEVET, CONTROL_IDS, None, score_controls="scale")
    assert plan.controls[:3] == ("A", "B", "C")
    assert plan.field_block is not None
    assert plan.field_block.endswith("Answer with one letter.")


def test_jev_layouts_keep_their_letters_whatever_the_methods() -> None:
    plan = bind_question(
        tv.Noul("Refund?"), Layout.FUSED, CONTROL_IDS, None,
        noul_controls="words", score_controls="scale",
    )  # fmt: skip
    assert plan.controls == ("A", "B")


def test_the_score_answer_reports_the_expected_and_the_most_likely_level() -> None:
    from typevet_async._core.reading.answers import build_answer

    answer = build_answer(SENTIMENT, (0.1, 0.15, 0.2, 0.3, 0.25))
    assert isinstance(answer, tv.ScoreAnswer)
    assert answer.level == 3
    assert answer.score == pytest.approx(0.15 + 0.4 + 0.9 + 1.0)
    tie = build_answer(SENTIMENT, (0.3, 0.1, 0.3, 0.2, 0.1))
    assert isinstance(tie, tv.ScoreAnswer)
    assert tie.level == 0


def test_the_framing_pin_names_only_the_methods_that_are_not_the_alphabet_s() -> None:
    assert framing_pin("typevet", "letters") == "typevet/letters/2"  # as maps were pinned
    assert framing_pin("typevet", "letters", "words", "scale", "all") == (
        "typevet/letters/2/score-scale/noul-words/content-free"
    )
    assert framing_pin("typevet", "letters", "words", "scale", "scores") == (
        "typevet/letters/2/score-scale/noul-words/content-free-scores"
    )
    assert framing_pin("fused", "letters", "words", content_free="all") == "fused/content-free"


# -- examples ----------------------------------------------------------------------------------


def test_examples_are_normalised_to_option_labels_and_bad_ones_refused() -> None:
    noul = tv.Noul("Refund?", examples=[("money back please", True), ("thanks", False)])
    assert noul.examples == (("money back please", "true"), ("thanks", "false"))
    score = tv.Score(["low", "high"], instructions="How?", examples=[("s", 1)])
    assert score.examples == (("s", "1"),)
    choice = tv.Choice(["a", "b"], instructions="Which?", examples=(("s", "b"),))
    assert choice.examples == (("s", "b"),)
    refused = {
        "the labels": lambda: tv.Choice(["a", "b"], instructions="x", examples=[("s", "c")]),
        "a level from 0 to 1": lambda: tv.Score(
            ["lo", "hi"], instructions="x", examples=[("s", 2)]
        ),
        "True or False": lambda: tv.Noul("x", examples=[("s", 1)]),
        "pairs": lambda: tv.Noul("x", examples="ab"),
        "non-empty text": lambda: tv.Noul("x", examples=[("  ", True)]),
        "a \\(state, answer\\) pair": lambda: tv.Noul("x", examples=[("s", True, 1)]),
        "at most 64": lambda: tv.Noul("x", examples=[("s", True)] * 65),
        "got more": lambda: tv.Noul("x", examples=itertools.repeat(("s", True))),  # endless
    }
    for message, build in refused.items():
        with pytest.raises(tv.QuestionError, match=message):
            build()


def test_a_question_s_hash_moves_with_its_examples_and_not_without_them() -> None:
    plain = tv.Noul("Refund?")
    assert question_hash(plain) == question_hash(tv.Noul("Refund?", examples=()))
    one = tv.Noul("Refund?", examples=[("money back", True)])
    other = tv.Noul("Refund?", examples=[("money back", False)])
    assert len({question_hash(plain), question_hash(one), question_hash(other)}) == 3


def test_the_template_s_earlier_turns_are_learnt_from_a_conversation_of_two_turns() -> None:
    first = GEMMA3.prefix(PROBE_MESSAGE)
    assert learn_turns(first, GEMMA3_HISTORY) == GEMMA3_TURNS
    chatml_head = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n"
    chatml_tail = "<|im_end|>\n<|im_start|>assistant\n"
    chatml = f"{chatml_head}{PROBE_MESSAGE}{chatml_tail}"
    history = (
        f"{chatml_head}{PROBE_MESSAGE}{chatml_tail}{ANSWER_PROBE}<|im_end|>\n<|im_start|>user\n"
        f"{SECOND_PROBE_MESSAGE}{chatml_tail}"
    )
    assert learn_turns(chatml, history) == (chatml_tail, "<|im_end|>\n<|im_start|>user\n")
    # A template that rewrites its history (here: drops the system message) is not learnt.
    assert learn_turns(chatml, history.replace("You are helpful.", "")) is None
    assert learn_turns(chatml, history.replace(ANSWER_PROBE, "")) is None


def test_examples_are_framed_as_earlier_turns_before_the_state() -> None:
    question = tv.Choice(
        {"billing": "money", "shipping": "parcels"},
        instructions="Which team?",
        examples=[("Charged twice", "billing"), ("Parcel lost", "shipping")],
    )
    frame = GEMMA_FRAMES[TemplateFamily.GEMMA3].__class__(
        GEMMA3.head, GEMMA3.tail, turns=GEMMA3_TURNS
    )
    plan = bind_question(question, Layout.TYPEVET, CONTROL_IDS, None)
    request = request_for("route", plan, "Where is my order?", frame=frame)
    block = "Which team?\nA. billing: money\nB. shipping: parcels\nAnswer with one letter."
    assert request.prompt == (
        f"<start_of_turn>user\nCharged twice\n\n{block}<end_of_turn>\n<start_of_turn>model\n"
        f"A<end_of_turn>\n<start_of_turn>user\nParcel lost\n\n{block}<end_of_turn>\n"
        f"<start_of_turn>model\nB<end_of_turn>\n<start_of_turn>user\nWhere is my order?\n\n"
        f"{block}<end_of_turn>\n<start_of_turn>model\n"
    )
    assert [(m.role, m.content) for m in request.messages] == [
        ("user", f"Charged twice\n\n{block}"),
        ("assistant", "A"),
        ("user", f"Parcel lost\n\n{block}"),
        ("assistant", "B"),
        ("user", f"Where is my order?\n\n{block}"),
    ]


def test_an_example_s_answer_is_the_control_its_option_has_under_a_rotation() -> None:
    question = tv.Choice(["a", "b", "c"], instructions="Which?", examples=[("s", "a")])
    rotated = bind_question(question, Layout.TYPEVET, CONTROL_IDS, None, rotation=1)
    assert rotated.order == (1, 2, 0)
    assert rotated.examples[0][1] == "C"


def test_examples_in_a_jev_layout_are_refused() -> None:
    question = tv.Noul("Refund?", examples=[("money back", True)])
    with pytest.raises(tv.QuestionError, match="Jev's prompts"):
        bind_question(question, Layout.SPLIT, CONTROL_IDS, None)


def test_a_frame_without_earlier_turns_cannot_frame_examples() -> None:
    with pytest.raises(ValueError, match="earlier turns"):
        GEMMA3.prefix("state", [("example", "A")])


# -- through a session (the in-memory stub backend) -------------------------------------------


class _WordsStubBackend(InMemoryStubBackend):
    """The stub with the Noul's words among its controls, as a probe in context finds them."""

    async def probe(self) -> tv.Probe:
        probe = await super().probe()
        return tv.Probe(
            probe.family, probe.rendered_template, CONTROL_IDS, probe.vocab_size,
            probe.model_ids,
        )  # fmt: skip


def _session(backend: InMemoryStubBackend, **settings: Any) -> tv.Session:
    return tv.Session(backend, tv.SessionSettings(**settings))


@pytest.mark.asyncio
async def test_content_free_divides_each_answer_by_the_prior_read_once_per_session() -> None:
    backend = InMemoryStubBackend()
    question = tv.Score(["low", "mid", "high"], instructions="How urgent?")
    async with _session(backend, content_free=True) as session:
        first = await session.judge("The app crashes.", {"urgency": question})
        second = await session.judge("Refund me.", {"urgency": question})
    # The stub reads every prompt alike (logprobs -1, -2, -3): the prior is that read, so the
    # divided answer is uniform, and the read is kept as the raw probabilities.
    as_read = softmax((-1.0, -2.0, -3.0))
    for judgment in (first, second):
        diagnostics = judgment.diagnostics["urgency"]
        assert diagnostics.content_free_prior == pytest.approx(as_read)
        assert diagnostics.raw_probabilities == pytest.approx(as_read)
        assert list(judgment["urgency"].probabilities.values()) == pytest.approx([1 / 3] * 3)
    states = [request.user_text.split("\n\n")[0] for request in backend.read_requests]
    # "[MASK]" neutralised: the stub's tokenizer cannot say it is not a special token.
    assert states.count("N/A") == 1
    assert states.count("\uff3bMASK\uff3d") == 1
    assert len(backend.read_requests) == 3 + 2  # the prior's three reads, then one a judgment


@pytest.mark.asyncio
async def test_judgments_at_once_share_one_prior_read() -> None:
    backend = InMemoryStubBackend()
    states = [f"ticket {n}" for n in range(8)]
    async with _session(backend, content_free=True, max_concurrency=4) as session:
        items = [item async for item in session.judge_many(states, {"q": tv.Noul("Refund?")})]
    assert all(item.judgment is not None for item in items)
    assert len(backend.read_requests) == len(CONTENT_FREE_STATES) + len(states)


@pytest.mark.asyncio
async def test_a_failed_prior_fails_its_judgment_and_the_next_one_reads_it_again() -> None:
    backend = InMemoryStubBackend()
    backend.state_behaviours["N/A"] = failing_after(
        0.0, tv.ServerError("down", status=500, body="")
    )
    async with _session(backend, content_free=True) as session:
        with pytest.raises(tv.ServerError):
            await session.judge("ticket", {"q": tv.Noul("Refund?")})
        del backend.state_behaviours["N/A"]
        judgment = await session.judge("ticket", {"q": tv.Noul("Refund?")})
    assert judgment.diagnostics["q"].content_free_prior is not None


@pytest.mark.asyncio
async def test_without_content_free_no_prior_is_read_or_reported() -> None:
    backend = InMemoryStubBackend()
    async with _session(backend) as session:
        judgment = await session.judge("ticket", {"q": tv.Noul("Refund?")})
    assert len(backend.read_requests) == 1
    assert judgment.diagnostics["q"].content_free_prior is None
    assert judgment.diagnostics["q"].raw_probabilities is None


@pytest.mark.asyncio
async def test_words_and_a_scale_are_read_once_whatever_the_permutations() -> None:
    backend = _WordsStubBackend()
    questions = {"refund": tv.Noul("Refund?"), "mood": SENTIMENT, "team": tv.Choice(["a", "b"],
                 instructions="Which?")}  # fmt: skip
    async with _session(
        backend, noul_controls="words", score_controls="scale", permutations=2, content_free="off"
    ) as session:
        judgment = await session.judge("ticket", questions)
    assert backend.reads.count("refund") == 1
    assert backend.reads.count("mood") == 1
    assert backend.reads.count("team") == 2  # a lettered question still rotates
    assert judgment.diagnostics["refund"].controls == ("No", "Yes")
    assert judgment.diagnostics["mood"].controls == ("1", "2", "3", "4", "5")


@pytest.mark.asyncio
async def test_examples_on_a_template_whose_turns_were_not_learnt_are_refused_unsent() -> None:
    backend = InMemoryStubBackend()  # its probe learns no frame: Gemma 3's own, no turns
    question = tv.Noul("Refund?", examples=[("money back", True)])
    async with _session(backend) as session:
        with pytest.raises(tv.UnsupportedTemplateError, match="has examples") as raised:
            await session.judge("ticket", {"refund": question})
    assert raised.value.question_id == "refund"
    assert backend.read_requests == []
