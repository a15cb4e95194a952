"""The System One batch wire's pure mapping (`typevet_async._core.wires.system_one.batch`)."""

from __future__ import annotations

from typing import Any

import pytest

import typevet_async as tv
from typevet_async._core.wires.system_one import (
    ADVERTISEMENT,
    BATCH_PATH,
    SystemOneValidationError,
    advertisement,
    batch_from_system_one,
    batch_item_error,
    batch_response,
    batch_to_system_one,
    request_from_system_one,
    request_to_system_one,
)

QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul("Is a refund requested?"),
    "route": tv.Choice({"billing": "money", "shipping": None}, instructions="Team?"),
    "urgency": tv.Score(["low", "high"], instructions="How urgent?"),
}


def test_a_batch_round_trips_and_reads_its_questions_as_the_single_route() -> None:
    states: list[Any] = ["text", {"ticket": 1}, ["a"]]
    body = batch_to_system_one("m", states, QUESTIONS)
    batch = batch_from_system_one(body, max_states=3)
    single = request_from_system_one(request_to_system_one("m", "text", QUESTIONS))
    assert batch.model == "m"
    assert list(batch.states) == states
    assert batch.refused == {}
    assert batch.questions == single.questions
    assert batch.score_criteria == single.score_criteria


def test_a_state_that_is_not_one_is_refused_alone() -> None:
    body = batch_to_system_one("m", ["ok", 3, None, {"x": 1}], QUESTIONS)
    batch = batch_from_system_one(body, max_states=10)
    assert sorted(batch.refused) == [1, 2]
    assert batch.refused[1]["loc"] == ["body", "states", 1]
    assert batch.refused[2]["input"] is None


@pytest.mark.parametrize(
    ("change", "loc", "kind"),
    [
        ({"states": []}, ["body", "states"], "missing"),
        ({"states": {"0": "x"}}, ["body", "states"], "missing"),
        ({"states": ["x"] * 4}, ["body", "states"], "too_long"),
        ({"state": "x"}, ["body", "state"], "extra_forbidden"),
        ({"document": "x"}, ["body", "document"], "extra_forbidden"),
        ({"assets": {"a": {}}}, ["body", "assets"], "unsupported"),
        ({"model": ""}, ["body", "model"], "missing"),
        ({"questions": {"q": {"type": "choice"}}}, ["body", "questions", "q"], "value_error"),
    ],
)
def test_the_shared_parts_are_checked_every_problem_at_once(
    change: dict[str, Any], loc: list[Any], kind: str
) -> None:
    body = {**batch_to_system_one("m", ["x"], QUESTIONS), **change}
    with pytest.raises(SystemOneValidationError) as raised:
        batch_from_system_one(body, max_states=3)
    assert (raised.value.detail[0]["loc"], raised.value.detail[0]["type"]) == (loc, kind)


def test_states_are_counted_before_any_is_read() -> None:
    body = batch_to_system_one("m", [object()] * 1000, QUESTIONS)  # not JSON: never looked at
    with pytest.raises(SystemOneValidationError) as raised:
        batch_from_system_one(body, max_states=64)
    assert raised.value.detail[0]["input"] == 1000
    assert raised.value.detail[0]["ctx"] == {"max_length": 64}


def test_the_questions_limit_is_the_single_routes() -> None:
    questions = {f"q{n}": tv.Noul("Yes?") for n in range(5)}
    with pytest.raises(SystemOneValidationError, match="at most 4 questions"):
        batch_from_system_one(
            batch_to_system_one("m", ["x"], questions), max_states=2, max_questions=4
        )


def test_a_response_keeps_order_and_sums_the_answered_items_usage() -> None:
    answered = {"model": "m", "answers": {}, "usage": {"input_tokens": 7, "output_tokens": 0}}
    failed = batch_item_error(422, "value_error", "bad", ["body", "states", 1])
    body = batch_response("m", [answered, failed, answered])
    assert body["results"] == [answered, failed, answered]
    assert body["usage"] == {"input_tokens": 14, "output_tokens": 0}
    assert failed == {
        "error": {
            "error_type": "value_error",
            "message": "bad",
            "status": 422,
            "loc": ["body", "states", 1],
        }
    }
    assert "loc" not in batch_item_error(502, "upstream_error", "x")["error"]


def test_the_advertisement_names_the_route_and_its_cap() -> None:
    assert ADVERTISEMENT.startswith("x_")
    assert advertisement(16) == {"path": BATCH_PATH, "max_states": 16}
