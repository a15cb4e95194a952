from __future__ import annotations

import math

import pytest

import typevet_async as tv
from typevet_async._core.reading.answers import (
    build_answer,
    choice_confidence,
    entropy_confidence,
    score_confidence,
)


def test_noul_answer_is_p_true() -> None:
    answer = build_answer(tv.Noul(instructions="x"), [0.2, 0.8])
    assert isinstance(answer, tv.NoulAnswer)
    assert answer.noul == 0.8
    assert dict(answer.probabilities) == {"false": 0.2, "true": 0.8}


def test_choice_ties_go_to_the_first_option() -> None:
    choice = tv.Choice({"a": None, "b": None, "c": None}, instructions="x")
    answer = build_answer(choice, [0.25, 0.375, 0.375])
    assert isinstance(answer, tv.ChoiceAnswer)
    assert answer.choice == "b"
    assert list(answer.probabilities) == ["a", "b", "c"]


def test_score_is_the_expected_level() -> None:
    score = tv.Score(["low", "mid", "high"], instructions="x")
    answer = build_answer(score, [0.2, 0.3, 0.5])
    assert isinstance(answer, tv.ScoreAnswer)
    assert answer.score == pytest.approx(0.3 + 1.0)
    assert dict(answer.probabilities) == {0: 0.2, 1: 0.3, 2: 0.5}
    assert answer.legend == ("low", "mid", "high")


def test_confidence_is_one_minus_normalised_entropy() -> None:
    assert entropy_confidence([1.0, 0.0, 0.0]) == 1.0
    assert entropy_confidence([0.5, 0.5]) == pytest.approx(0.0)
    p = [0.7, 0.2, 0.1]
    expected = 1 + sum(x * math.log(x) for x in p) / math.log(3)
    assert entropy_confidence(p) == pytest.approx(expected)


def test_confidence_is_system_ones_reference_formula() -> None:
    # a Choice: (max - 1/n) / (1 - 1/n)
    assert choice_confidence([0.25, 0.375, 0.375]) == pytest.approx((0.375 - 1 / 3) / (2 / 3))
    assert choice_confidence([1 / 3] * 3) == pytest.approx(0.0)
    assert choice_confidence([1.0, 0.0, 0.0]) == 1.0
    # a Score: max(0, 1 - sum p_i |i - mode| / D), D = sum |i - (n-1)/2| / n
    assert score_confidence([0.1, 0.2, 0.7]) == pytest.approx(1 - 0.4 / (2 / 3))
    assert score_confidence([0.0, 0.1, 0.8, 0.1, 0.0]) == pytest.approx(1 - 0.2 / 1.2)
    assert score_confidence([0.2, 0.3, 0.5]) == 0.0  # spread past the even one's: clamped
    assert score_confidence([0.0, 0.0, 1.0]) == 1.0
    # a tie for the mode: the first level, 0 (spread 1.4 > D = 1.2); level 1 would give 1/6
    assert score_confidence([0.3, 0.3, 0.2, 0.1, 0.1]) == 0.0
    assert score_confidence([0.3, 0.31, 0.19, 0.1, 0.1]) == pytest.approx(1 - 0.99 / 1.2)


def test_answers_carry_the_reference_and_the_entropy_confidence() -> None:
    noul = build_answer(tv.Noul(instructions="x"), [0.2, 0.8])
    assert noul.confidence == pytest.approx(0.6)  # |2 noul - 1|
    assert noul.entropy_confidence == pytest.approx(entropy_confidence([0.2, 0.8]))
    choice = build_answer(tv.Choice(["a", "b", "c"], instructions="x"), [0.7, 0.2, 0.1])
    assert choice.confidence == pytest.approx((0.7 - 1 / 3) / (2 / 3))
    assert choice.entropy_confidence == entropy_confidence([0.7, 0.2, 0.1])
    score = build_answer(tv.Score(["l", "m", "h"], instructions="x"), [0.1, 0.2, 0.7])
    assert score.confidence == score_confidence([0.1, 0.2, 0.7])
    assert score.entropy_confidence == entropy_confidence([0.1, 0.2, 0.7])
    # Built directly, an answer's entropy confidence comes from its probabilities.
    direct = tv.ChoiceAnswer("a", {"a": 0.5, "b": 0.5}, 0.0)
    assert direct.entropy_confidence == pytest.approx(0.0)


def test_answers_are_read_only() -> None:
    answer = build_answer(tv.Noul(instructions="x"), [0.2, 0.8])
    with pytest.raises(TypeError):
        answer.probabilities["true"] = 1.0  # type: ignore[index]


def sample_judgment() -> tv.Judgment:
    answers = {
        "refund": build_answer(tv.Noul(instructions="x"), [0.3, 0.7]),
        "route": build_answer(tv.Choice({"a": None, "b": None}, instructions="x"), [0.6, 0.4]),
        "urgency": build_answer(tv.Score(["l", "m", "h"], instructions="x"), [0.1, 0.2, 0.7]),
    }
    diagnostics = {
        qid: tv.Diagnostics("prompt", ("0", "1"), (1, 2), (-1.0, -2.0), 0.5, 4096, 1)
        for qid in answers
    }
    return tv.Judgment(answers, tv.Usage(30, 10, 3), diagnostics)


def test_judgment_is_a_mapping_in_request_order() -> None:
    judgment = sample_judgment()
    assert list(judgment) == ["refund", "route", "urgency"]
    assert len(judgment) == 3
    route = judgment["route"]
    assert isinstance(route, tv.ChoiceAnswer)
    assert route.choice == "a"


def test_json_round_trip_in_the_system_one_shape() -> None:
    judgment = sample_judgment()
    data = tv.converter.unstructure(judgment)
    assert data["answers"]["refund"] == {
        "type": "noul",
        "noul": 0.7,
        "probabilities": {"false": 0.3, "true": 0.7},
        "confidence": judgment["refund"].confidence,
        "entropy_confidence": judgment["refund"].entropy_confidence,
    }
    assert data["answers"]["route"]["type"] == "choice"
    assert data["answers"]["route"]["choice"] == "a"
    assert data["answers"]["urgency"]["legend"] == ["l", "m", "h"]
    assert data["usage"] == {"prompt_tokens": 30, "cached_tokens": 10, "reads": 3, "cache_hits": 0}
    raw = tv.judgment_to_json(judgment)
    assert b'"probabilities":{"0":0.1,"1":0.2,"2":0.7}' in raw
    assert tv.judgment_from_json(raw) == judgment
    assert list(tv.judgment_from_json(raw)) == ["refund", "route", "urgency"]
