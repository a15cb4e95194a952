from __future__ import annotations

import math

import pytest

import typevet_async as tv
from typevet_async._core.readings import TopLogprobs, find_candidates, off_menu_mass, softmax

VOCAB = 100


def top(*entries: tuple[int, float], requested: int | None = None) -> TopLogprobs:
    return TopLogprobs(tuple(entries), len(entries) if requested is None else requested)


def test_candidates_in_candidate_order() -> None:
    read = top((7, -0.5), (3, -1.0), (9, -2.0))
    assert find_candidates(read, [9, 7], VOCAB) == (-2.0, -0.5)


def test_missing_candidate_asks_for_a_larger_read() -> None:
    assert find_candidates(top((7, -0.5), (3, -1.0)), [7, 42], VOCAB) is None


def test_missing_from_a_whole_vocabulary_read_is_an_error() -> None:
    with pytest.raises(tv.InvalidLogprobsError, match=r"\[42\] are missing"):
        find_candidates(top((7, -0.5), (3, -1.0), requested=VOCAB), [7, 42], 2)


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
        find_candidates(top(*entries), [7, 3], VOCAB)


def test_a_rounding_error_above_zero_is_accepted() -> None:
    assert find_candidates(top((7, 4e-7), (3, -20.0)), [7, 3], VOCAB) == (4e-7, -20.0)


def test_wrong_entry_count_is_a_protocol_error() -> None:
    with pytest.raises(tv.ProtocolError, match="asked for the top 5"):
        find_candidates(top((7, -0.5), requested=5), [7], VOCAB)


def test_softmax_matches_the_definition_and_is_stable() -> None:
    logprobs = [-1.0, -2.0, -3.0]
    expected = [math.exp(v) / sum(math.exp(w) for w in logprobs) for v in logprobs]
    assert softmax(logprobs) == pytest.approx(expected, abs=1e-15)
    assert sum(softmax([-1000.0, -1001.0])) == pytest.approx(1.0)
    assert softmax([-1000.0, -1000.0]) == (0.5, 0.5)


def test_off_menu_mass() -> None:
    assert off_menu_mass([math.log(0.25), math.log(0.25)]) == pytest.approx(0.5)
    assert off_menu_mass([0.0, 0.0]) == 0.0  # float32 rounding can push the sum past 1
