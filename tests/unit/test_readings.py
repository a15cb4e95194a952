from __future__ import annotations

import math

import pytest

import typevet_async as tv
from typevet_async._core.reading.readings import (
    MASS_SLACK,
    TopLogprobs,
    clamp_missing,
    missing_options,
    off_menu_mass,
    present_candidates,
    read_entries,
    softmax,
    validated_entries,
)

VOCAB = 100
# Jev's letters: each option accepts its control ("A") and its space variant (" A").
A, SPACE_A, B, SPACE_B = 1, 2, 3, 4
JEV_GROUPS = ((A, SPACE_A), (B, SPACE_B))


def top(*entries: tuple[int, float], requested: int | None = None) -> TopLogprobs:
    return TopLogprobs.from_pairs(tuple(entries), len(entries) if requested is None else requested)


def test_candidates_in_candidate_order() -> None:
    entries = read_entries(top((7, -0.5), (3, -1.0), (9, -2.0)), VOCAB)
    assert present_candidates(entries, [(9,), (7,)]) == ((9, 7), (-2.0, -0.5))
    assert missing_options(entries, [(9,), (7,)]) == []


def test_a_missing_candidate_is_named_for_a_larger_read() -> None:
    entries = read_entries(top((7, -0.5), (3, -1.0)), VOCAB)
    assert missing_options(entries, [(7,), (42,)]) == [(42,)]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (((7, -0.5), (7, -1.0)), "appears twice"),
        (((7, math.nan), (3, -1.0)), "non-finite"),
        (((7, math.inf), (3, -1.0)), "non-finite"),
        (((7, -math.inf), (3, -1.0)), "non-finite"),
        (((7, 0.5), (3, -1.0)), "positive"),
    ],
)
def test_invalid_logprobs_fail_closed(entries: tuple[tuple[int, float], ...], message: str) -> None:
    with pytest.raises(tv.InvalidLogprobsError, match=message):
        read_entries(top(*entries), VOCAB)


def test_logits_may_be_positive_but_never_repeated_or_non_finite() -> None:
    assert validated_entries(((7, 3.5), (3, -1.0)), allow_positive=True) == {7: 3.5, 3: -1.0}
    with pytest.raises(tv.InvalidLogprobsError, match="appears twice"):
        validated_entries(((7, 3.5), (7, 3.5)), allow_positive=True)
    with pytest.raises(tv.InvalidLogprobsError, match="non-finite"):
        validated_entries(((7, math.nan),), allow_positive=True)


def test_a_rounding_error_above_zero_is_accepted() -> None:
    entries = read_entries(top((7, 4e-7), (3, -20.0)), VOCAB)
    assert present_candidates(entries, [(7,), (3,)]) == ((7, 3), (4e-7, -20.0))


def test_wrong_entry_count_is_a_protocol_error() -> None:
    with pytest.raises(tv.ProtocolError, match="asked for the top 5"):
        read_entries(top((7, -0.5), requested=5), VOCAB)
    # A read asking for more than the vocabulary returns the whole vocabulary.
    assert read_entries(top((1, -0.5), (0, -1.0), requested=VOCAB), 2) == {1: -0.5, 0: -1.0}


def test_an_id_outside_the_vocabulary_is_refused() -> None:
    assert read_entries(top((VOCAB - 1, -0.5)), VOCAB) == {VOCAB - 1: -0.5}
    with pytest.raises(tv.InvalidLogprobsError, match="outside the vocabulary of 100 tokens"):
        read_entries(top((7, -0.5), (VOCAB, -1.0)), VOCAB)


def test_an_option_is_missing_only_when_none_of_its_tokens_was_read() -> None:
    assert missing_options({A: -1.0, SPACE_B: -2.0}, JEV_GROUPS) == []
    assert missing_options({A: -1.0}, JEV_GROUPS) == [(B, SPACE_B)]
    assert missing_options({}, JEV_GROUPS) == list(JEV_GROUPS)


def test_clamp_keeps_an_option_whose_space_variant_was_read() -> None:
    # B's control is outside the top-K, but " B" is in it: B is not missing, nothing is filled.
    ids, logprobs, truncated = clamp_missing({A: -1.0, SPACE_B: -3.0, 99: -5.0}, JEV_GROUPS)
    assert (ids, logprobs, truncated) == ((A, SPACE_B), (-1.0, -3.0), False)


def test_clamp_fills_an_option_with_none_of_its_tokens_read_with_the_floor() -> None:
    ids, logprobs, truncated = clamp_missing({A: -1.0, SPACE_A: -2.0, 99: -5.0}, JEV_GROUPS)
    assert (ids, logprobs, truncated) == ((A, SPACE_A, B), (-1.0, -2.0, -5.0), True)


def test_clamp_needs_something_to_clamp_to() -> None:
    with pytest.raises(tv.InvalidLogprobsError, match="no logprobs to clamp to"):
        clamp_missing({}, JEV_GROUPS)


def test_softmax_matches_the_definition_and_is_stable() -> None:
    logprobs = [-1.0, -2.0, -3.0]
    expected = [math.exp(v) / sum(math.exp(w) for w in logprobs) for v in logprobs]
    # Both sides are the same float64 formula in another order: a few ulps apart, not a
    # tolerance measured on a server.
    assert softmax(logprobs) == pytest.approx(expected, abs=1e-15)
    assert sum(softmax([-1000.0, -1001.0])) == pytest.approx(1.0)
    assert softmax([-1000.0, -1000.0]) == (0.5, 0.5)


def test_off_menu_mass() -> None:
    assert off_menu_mass([math.log(0.25), math.log(0.25)]) == pytest.approx(0.5)
    # float32 rounding can push the sum a little past 1: up to MASS_SLACK reads as 0 off-menu.
    assert off_menu_mass([math.log(0.5), math.log(0.5) + 5e-4]) == 0.0
    assert off_menu_mass([0.0, math.log(MASS_SLACK) - 1e-9]) == 0.0


@pytest.mark.parametrize("total", [1.0 + 2 * MASS_SLACK, 1.86, 2.0])
def test_candidates_summing_past_one_are_refused_not_clamped(total: float) -> None:
    with pytest.raises(tv.InvalidLogprobsError, match="sum to"):
        off_menu_mass([math.log(total / 2), math.log(total / 2)])


def test_a_clamped_reads_off_menu_mass_is_unknown_not_a_sum_of_fill_ins() -> None:
    from typevet_async._core.prompts.scoring import plan_question
    from typevet_async._core.reading.interpreting import interpret_read

    request = plan_question(
        "q",
        tv.Choice(["a", "b", "c"], instructions="Which?"),
        "state",
        family=tv.TemplateFamily.GEMMA3,
        control_ids={str(n): 100 + n for n in range(10)},
    )
    # Three fills at a high floor would sum past 1; a clamped read is not refused for it.
    fills = (100, 101, 102), (-0.2, -0.2, -0.2)
    clamped = tv.CandidateRead(*fills, top_k=2, policy="clamp", truncated=True)
    _, diagnostics = interpret_read(request, clamped, off_menu_threshold=0.5)
    assert diagnostics.truncated
    assert diagnostics.off_menu_mass is None
    assert not diagnostics.off_menu_flagged
    exact = tv.CandidateRead((100, 101, 102), (-1.0, -2.0, -3.0), top_k=64)
    _, diagnostics = interpret_read(request, exact)
    expected = 1 - (math.exp(-1.0) + math.exp(-2.0) + math.exp(-3.0))
    assert diagnostics.off_menu_mass == pytest.approx(expected, abs=1e-15)
