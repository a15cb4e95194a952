"""Two-token codes (`typevet_async._core.prompts.codes`): which codes a tokenizer keeps, how options
are bound to them, and how a code question's reads become its answer, exactly.

The session tests use `CodeTokenizingStub`, a hand-written in-memory backend (named as a
stub): its tokenizer writes code ``dL`` as the digit's token then the letter's, and its reads
return logprobs computed from the token ids, so every expected probability is worked out here
by hand. The real tokenizers and servers are in ``tests/live/test_codes_live.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import pytest

import typevet_async as tv
from typevet_async._backends.llama_cpp_wire import completion_body
from typevet_async._core.prompts.codes import (
    CODES,
    CodeTokens,
    code_firsts,
    codes_in_context,
    codes_needed,
    joint_logprobs,
    seconds_after,
    usable_codes,
    with_reads_after,
)
from typevet_async._core.prompts.controls import LOWERCASE, UPPERCASE
from typevet_async._core.prompts.layouts import Layout
from typevet_async._core.prompts.scoring import after_first, bind_question, request_for
from typevet_async._core.reading.interpreting import interpret_read
from typevet_async._core.reading.readings import CandidateRead

from .stubs import IDS, InMemoryStubBackend

LETTERS = UPPERCASE + LOWERCASE
BASE = [1, 2, 3]


def code_tokens(code: str) -> list[int]:
    """The stub tokenizer: a code is the digit's token (its control id), then the letter's."""
    return [*BASE, IDS[code[0]], 2000 + LETTERS.index(code[1])]


def first_logprob(token: int) -> float:
    return -2.0 - 0.5 * (token - 1000)


def second_logprob(first: int, token: int) -> float:
    return -5.0 - 0.05 * (token - 2000) - 0.1 * (first - 1000)


class CodeTokenizingStub(InMemoryStubBackend):
    """A stub backend whose tokenizer writes codes as two tokens and whose reads are a
    function of the token ids asked (and of the first token, after it)."""

    def __init__(self, merged: Sequence[str] = ()) -> None:
        super().__init__()
        self.merged = set(merged)  # codes this tokenizer writes as one token
        self.asked: list[list[str]] = []

    async def answer_tokens(self, answers: Sequence[str]) -> tuple[list[int], list[list[int]]]:
        self.asked.append(list(answers))
        extended = [
            [*BASE, 9000 + CODES.index(answer)] if answer in self.merged else code_tokens(answer)
            for answer in answers
        ]
        return list(BASE), extended

    async def read(
        self, request: tv.ScoringRequest, probe: tv.Probe, *, max_retries: int | tv.Unset
    ) -> tv.CandidateRead:
        self.read_requests.append(request)
        if request.lead:
            first = request.lead[-1]
            values = tuple(second_logprob(first, token) for token in request.token_ids)
        else:
            values = tuple(first_logprob(token) for token in request.token_ids)
        return tv.CandidateRead(request.token_ids, values, 64, 1, 100, 40)


def choice(count: int) -> tv.Choice:
    return tv.Choice([f"label{index}" for index in range(count)], instructions="Which one?")


def expected(count: int) -> tuple[list[float], float]:
    """The answer's probabilities and off-menu mass, by hand from the stub's logprobs."""
    joint = []
    for code in CODES[:count]:
        *_, first, second = code_tokens(code)
        joint.append(first_logprob(first) + second_logprob(first, second))
    weights = [math.exp(value) for value in joint]
    total = math.fsum(weights)
    return [weight / total for weight in weights], 1.0 - total


# -- the pure rules ----------------------------------------------------------------------------


def test_the_codes_are_a_digit_then_a_letter_520_of_them_in_order() -> None:
    assert CODES[:3] == ("0A", "0B", "0C")
    assert CODES[51:53] == ("0z", "1A")
    assert len(CODES) == 520
    assert len(set(CODES)) == 520


def test_a_code_is_usable_when_it_adds_two_tokens_or_a_lead_and_two() -> None:
    found = codes_in_context(
        [7, 8],
        {
            "0A": [7, 8, 50, 60],  # two tokens
            "0B": [7, 8, 4, 50, 61],  # a lead, then two
            "0C": [7, 8, 70],  # one token: merged
            "0D": [7, 9, 50, 62],  # changes the prefix
            "0E": [7, 8, 50, 60],  # another code's tokens
            "0F": [7, 8, 1, 2, 50, 63],  # a lead of two
        },
    )
    assert found == {
        "0A": CodeTokens((), 50, 60),
        "0B": CodeTokens((4,), 50, 61),
        "0C": None,
        "0D": None,
        "0E": None,
        "0F": None,
    }


def test_only_the_codes_still_missing_are_asked_for() -> None:
    assert codes_needed(3, {}) == ["0A", "0B", "0C"]
    known: dict[str, CodeTokens | None] = {"0A": CodeTokens((), 1, 2), "0B": None}
    assert codes_needed(3, known) == ["0C", "0D"]  # one usable, two more to find
    assert codes_needed(1, known) == []
    every: dict[str, CodeTokens | None] = dict.fromkeys(CODES)
    assert codes_needed(3, every) == []  # every code asked: none usable, nothing left


def test_usable_codes_share_the_first_usable_codes_lead() -> None:
    known: dict[str, CodeTokens | None] = {
        "0A": None,
        "0B": CodeTokens((4,), 1, 2),
        "0C": CodeTokens((), 1, 3),
        "0D": CodeTokens((4,), 1, 5),
    }
    assert usable_codes(5, known) == [("0B", known["0B"]), ("0D", known["0D"])]


def test_the_joint_logprob_is_the_first_reads_plus_the_read_after_it() -> None:
    codes = [(10, 20), (10, 21), (11, 20)]
    assert code_firsts(codes) == (10, 11)
    assert seconds_after(codes, 10) == (20, 21)
    assert seconds_after(codes, 11) == (20,)
    first = {10: -1.0, 11: -2.0}
    after = {10: {20: -0.5, 21: -3.0}, 11: {20: -0.25}}
    assert joint_logprobs(codes, first, after) == (-1.5, -4.0, -2.25)


def test_a_code_question_binds_every_option_to_a_code_past_the_single_controls() -> None:
    known = codes_in_context(BASE, {code: code_tokens(code) for code in CODES[:60]})
    plan = bind_question(choice(11), Layout.TYPEVET, IDS, None, codes=known)
    assert plan.controls == CODES[:11]
    assert plan.codes == tuple((IDS["0"], 2000 + index) for index in range(11))
    assert plan.token_ids == (IDS["0"],)  # the distinct first tokens: what the first read asks
    assert plan.field_block is not None
    assert "\n0A. label0\n" in plan.field_block
    assert "\n0K. label10\n" in plan.field_block
    assert plan.field_block.endswith("Answer with one code: its digit, then its letter.")
    # Up to the single controls nothing changes: ten options, ten digits.
    assert bind_question(choice(10), Layout.TYPEVET, IDS, None, codes=known).codes == ()


def test_too_few_usable_codes_is_a_typed_refusal_naming_both_limits() -> None:
    known = codes_in_context(BASE, {code: code_tokens(code) for code in CODES[:12]})
    with pytest.raises(tv.TooManyOptionsError, match="keeps only 12 two-token codes") as caught:
        bind_question(choice(13), Layout.TYPEVET, IDS, None, codes=known)
    assert (caught.value.count, caught.value.limit) == (13, 12)
    with pytest.raises(tv.TooManyOptionsError, match="only 10 single-token controls"):
        bind_question(choice(13), Layout.TYPEVET, IDS, None)  # a backend that cannot tell


def test_a_code_question_with_images_is_refused_before_any_read_naming_the_question() -> None:
    # Issue 43.1: llama.cpp's image prompt is a string, so a follow-up read's first token was
    # dropped and every P(second | first) was read at the answer position, silently.
    known = codes_in_context(BASE, {code: code_tokens(code) for code in CODES[:60]})
    plan = bind_question(choice(11), Layout.TYPEVET, IDS, None, codes=known)
    image = tv.Image.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 24, "image/png")
    with pytest.raises(tv.QuestionError, match="two-token codes") as refused:
        request_for("route", plan, "state", frame=None, images=(image,))
    assert refused.value.question_id == "route"
    assert "11 options" in str(refused.value)
    assert request_for("route", plan, "state", frame=None).codes == plan.codes  # no images: read


def test_a_multimodal_completion_body_never_drops_a_lead() -> None:
    image = tv.Image.from_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 24, "image/png")
    with pytest.raises(ValueError, match="cannot end in lead tokens"):
        completion_body("p", 64, cache_prompt=True, images=(image,), lead=(5,))
    assert completion_body("p", 64, cache_prompt=True, lead=(5,))["prompt"] == ["p", 5]


def test_a_code_question_past_a_backends_candidate_limit_is_refused() -> None:
    known = codes_in_context(BASE, {code: code_tokens(code) for code in CODES[:60]})
    with pytest.raises(tv.TooManyOptionsError, match="one read takes at most 40"):
        bind_question(choice(60), Layout.TYPEVET, IDS, 40, codes=known)  # 52 seconds after 0


def test_interpreting_a_code_read_refuses_a_missing_or_partial_read_after() -> None:
    known = codes_in_context(BASE, {code: code_tokens(code) for code in CODES[:60]})
    plan = bind_question(choice(60), Layout.TYPEVET, IDS, None, codes=known)
    request = request_for("q", plan, "state", frame=None)
    first = CandidateRead((IDS["0"], IDS["1"]), (-1.0, -2.0), 64)
    with pytest.raises(tv.InvalidLogprobsError, match="a read after each of its 2 first"):
        interpret_read(request, first)
    after = after_first(request, IDS["0"])
    assert after.lead == (IDS["0"],)
    assert after.token_ids == tuple(range(2000, 2052))
    complete = CandidateRead(after.token_ids, (-5.0,) * 52, 64)
    partial = CandidateRead(tuple(range(2000, 2007)), (-5.0,) * 7, 64)  # 1A..1G, not 1H
    with pytest.raises(tv.InvalidLogprobsError, match="no logprob was read"):
        interpret_read(request, with_reads_after(first, [complete, partial]))


def test_a_code_questions_reads_add_up_its_costs() -> None:
    first = CandidateRead((1,), (-1.0,), 64, 2, 100, 0, attempts=3)
    after = CandidateRead((2,), (-1.0,), 64, 1, 101, 99, off_menu_known=False)
    joined = with_reads_after(first, [after, after])
    assert (joined.reads, joined.prompt_tokens, joined.cached_tokens) == (4, 302, 198)
    assert joined.attempts == 5
    assert not joined.off_menu_known
    assert joined.after == (after, after)


# -- through a session -------------------------------------------------------------------------


def session(backend: InMemoryStubBackend, **settings: Any) -> tv.Session:
    return tv.Session(backend, tv.SessionSettings(**settings))


@pytest.mark.asyncio
@pytest.mark.parametrize("prefix_reuse", ["off", "auto"])
async def test_a_question_past_the_single_controls_is_answered_by_the_product(
    prefix_reuse: str,
) -> None:
    backend = CodeTokenizingStub()
    backend._capabilities = attrs.evolve(backend.capabilities, prefix_reuse=prefix_reuse != "off")
    async with session(backend, prefix_reuse=prefix_reuse) as s:
        judgment = await s.judge("state", {"many": choice(120), "few": choice(3)})
    answer, diagnostics = judgment["many"], judgment.diagnostics["many"]
    assert isinstance(answer, tv.ChoiceAnswer)
    probabilities, off_menu = expected(120)
    assert list(answer.probabilities.values()) == pytest.approx(probabilities, abs=1e-12)
    assert diagnostics.off_menu_mass == pytest.approx(off_menu, abs=1e-12)
    assert answer.choice == "label0"  # the stub's logprobs fall with the token ids
    assert diagnostics.controls == CODES[:120]
    assert len(diagnostics.codes) == 120
    # 120 options: 0A..0z, 1A..1z, 2A..2P: one read, then one after each of 0, 1 and 2.
    assert diagnostics.reads == 4
    leads = [request.lead for request in backend.read_requests if request.question_id == "many"]
    assert leads == [(), (IDS["0"],), (IDS["1"],), (IDS["2"],)]
    assert judgment.usage.reads == 5
    assert judgment.diagnostics["few"].codes == ()
    assert backend.asked == [list(CODES[:120])]  # asked once, only the codes it needs


@pytest.mark.asyncio
async def test_the_tokenizer_is_asked_once_per_session_however_many_judgments() -> None:
    backend = CodeTokenizingStub()
    async with session(backend) as s:
        for _ in range(3):
            await s.judge("state", {"many": choice(70)})
        await s.judge("state", {"more": choice(80)})  # wider: only the ten codes it lacks
    assert backend.asked == [list(CODES[:70]), list(CODES[70:80])]


@pytest.mark.asyncio
async def test_codes_the_tokenizer_merges_are_skipped() -> None:
    backend = CodeTokenizingStub(merged=["0B", "0C"])
    async with session(backend) as s:
        judgment = await s.judge("state", {"many": choice(12)})
    assert judgment.diagnostics["many"].controls == ("0A", *CODES[3:14])
    assert backend.asked == [list(CODES[:12]), ["0M", "0N"]]


@pytest.mark.asyncio
@pytest.mark.parametrize("count", [521, 1000])
async def test_a_question_past_every_code_is_refused_before_the_tokenizer_is_asked(
    count: int,
) -> None:
    backend = CodeTokenizingStub()
    async with session(backend) as s:
        with pytest.raises(tv.TooManyOptionsError) as refused:
            await s.judge("state", {"few": choice(3), "many": choice(count)})
        assert backend.asked == []  # not one code asked (it asked all 520 before)
        assert backend.read_requests == []
        await s.judge("state", {"most": choice(len(CODES))})  # the maximum is still answered
    error = refused.value
    assert (error.question_id, error.count, error.limit) == ("many", count, 520)
    assert f"{count} options, and a question takes at most 520" in str(error)


@pytest.mark.asyncio
async def test_a_backend_that_cannot_tokenize_answers_keeps_the_single_control_limit() -> None:
    async with session(InMemoryStubBackend()) as s:
        with pytest.raises(tv.TooManyOptionsError, match="only 10 single-token controls"):
            await s.judge("state", {"many": choice(11)})


@pytest.mark.asyncio
async def test_the_jev_layouts_keep_their_sixteen_letters() -> None:
    backend = CodeTokenizingStub()
    async with session(backend, layout="fused") as s:
        with pytest.raises(tv.TooManyOptionsError):
            await s.judge("state", {"many": choice(17)})
    assert backend.asked == []


def test_a_code_read_of_logits_is_refused_not_softmaxed() -> None:
    # Logits leave out each read's normaliser, and a code's two reads have two: no exact joint.
    known = codes_in_context(BASE, {code: code_tokens(code) for code in CODES[:60]})
    plan = bind_question(choice(11), Layout.TYPEVET, IDS, None, codes=known)
    request = request_for("q", plan, "state", frame=None)
    first = CandidateRead((IDS["0"],), (3.0,), 64, off_menu_known=False)
    after = CandidateRead(tuple(range(2000, 2011)), (1.0,) * 11, 64, off_menu_known=False)
    with pytest.raises(tv.InvalidLogprobsError, match="normalised logprobs"):
        interpret_read(request, with_reads_after(first, [after]))


@pytest.mark.asyncio
async def test_vllm_in_a_logits_mode_refuses_codes_before_asking_the_server() -> None:
    config = tv.VllmConfig(base_url="http://127.0.0.1:9", model="m", logprobs_mode="raw_logits")
    with pytest.raises(tv.ConfigurationError, match="--logprobs-mode raw_logprobs"):
        await tv.AsyncVllm(config).answer_tokens(["0A"])  # port 9: nothing was sent
