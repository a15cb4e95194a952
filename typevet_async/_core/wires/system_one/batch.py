"""A System One batch (``POST /v1/systemone/batch``): several states, the same questions, one
result per state, in input order. Pure: the gateway and the client map through it.

No spec defines this wire (laya-serve and avrik-server serve a batch route, neither documents
its shape where we could read it), so it is the obvious extension of ``/v1/systemone``:

- request ``{"model"?, "states": [state, ...], "questions": {...}}``: ``questions`` and
  ``model`` exactly as ``/v1/systemone`` takes them, each state as its ``state`` (a string, an
  object or an array). No ``state``/``document`` and no ``assets`` (a batch carries no images:
  send those through ``/v1/systemone``).
- response ``{"model", "results": [...], "usage"}``: ``results[i]`` is exactly the body
  ``/v1/systemone`` answers for ``states[i]``, or ``{"error": {"error_type", "message",
  "status"}}``, the error that request would have had (``status`` its HTTP status; a 422's
  ``loc`` too). An item's error never fails the batch; ``usage`` sums the answered items'.
- whole-body failures are the single route's: a 422 for the questions, the model, a
  ``states`` that is not a non-empty list, more states than the server's cap (``too_long``,
  ``ctx.max_length``); 413 past the byte cap.
- the server says it offers the route in ``GET /v1/models``: a top-level `ADVERTISEMENT`
  field ``{"path": "/v1/systemone/batch", "max_states": N}``; no field (or a 404/405 on the
  route) means not offered.
- whether the route divides each question's batch prior out of its results' answers (batch
  calibration) is the `CALIBRATION_ADVERTISEMENT` field of ``GET /v1/models``:
  ``{"mode": "on" | "off", "min_states": 8}`` (fewer answered states than ``min_states``
  are left as read); each result's ``x_typevet`` diagnostics report the prior it was divided
  by (``batch_prior``, option order), from how many answers (``batch_prior_items``) and why
  an answer was left as read (``batch_prior_skipped``), beside ``raw_probabilities``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from typevet_async._core.prompts.questions import Question
from typevet_async._core.statistics.batch_calibration import ITEMS_PER_OPTION, MIN_BATCH_ITEMS
from typevet_async._core.wires.system_one.questions import question_to_system_one
from typevet_async._core.wires.system_one.requests import (
    request_from_system_one,
    state_problem,
    validation_detail,
)
from typevet_async._errors import SystemOneValidationError

__all__ = [
    "ADVERTISEMENT",
    "BATCH_PATH",
    "CALIBRATION_ADVERTISEMENT",
    "SystemOneBatch",
    "advertisement",
    "batch_from_system_one",
    "batch_item_error",
    "batch_response",
    "batch_to_system_one",
    "calibration_advertisement",
]

BATCH_PATH: Final = "/v1/systemone/batch"
#: The ``GET /v1/models`` field that advertises the batch route (``x_``: an extension).
ADVERTISEMENT: Final = "x_systemone_batch"
#: The ``GET /v1/models`` field that says whether the batch route divides out each question's
#: batch prior (``x_``: an extension).
CALIBRATION_ADVERTISEMENT: Final = "x_batch_calibration"


@attrs.frozen
class SystemOneBatch:
    """A batch request, as the gateway judges it."""

    model: str
    #: Every state as sent, in input order (the refused ones too).
    states: tuple[Any, ...]
    #: Index -> the 422 entry of a state that is not one (it is answered with its error).
    refused: Mapping[int, dict[str, Any]]
    questions: dict[str, Question]
    #: Each Score question's criteria as sent (its legend in every result).
    score_criteria: dict[str, list[Any]] = attrs.field(factory=dict)


def batch_from_system_one(
    data: Any,
    *,
    max_states: int,
    max_questions: int | None = None,
    served_models: Sequence[str] = (),
) -> SystemOneBatch:
    """A batch body (parsed JSON) as the gateway judges it; at most ``max_states`` states,
    counted before any is read. A state that is not a state is refused alone (`refused`).
    ``model`` is read as ``/v1/systemone`` reads it (``served_models``: a batch without one
    is answered by the one model served).

    :raises SystemOneValidationError: the body's shared parts (model, questions, ``states``
        itself) are not a batch's; ``detail`` lists every problem, in the 422 shape.
    """
    if not isinstance(data, dict):
        raise SystemOneValidationError(
            [validation_detail(["body"], "the body must be a JSON object", "dict_type", data)]
        )
    detail: list[dict[str, Any]] = []
    for name in ("state", "document"):
        if name in data:
            detail.append(
                validation_detail(
                    ["body", name],
                    "a batch takes states (a list), not one state",
                    "extra_forbidden",
                    None,
                )
            )
    if data.get("assets"):
        detail.append(
            validation_detail(
                ["body", "assets"],
                "a batch carries no assets: send images through /v1/systemone",
                "unsupported",
                None,
            )
        )
    states = _states(data.get("states"), max_states, detail)
    shared = {"model": data.get("model"), "state": "", "questions": data.get("questions")}
    try:
        call = request_from_system_one(
            shared, max_questions=max_questions, served_models=served_models
        )
    except SystemOneValidationError as error:
        detail.extend(error.detail)
    if detail:
        raise SystemOneValidationError(detail)
    refused = {
        index: problem
        for index, state in enumerate(states)
        if (problem := state_problem(state, ["body", "states", index])) is not None
    }
    return SystemOneBatch(call.model, tuple(states), refused, call.questions, call.score_criteria)


def _states(raw: Any, max_states: int, detail: list[dict[str, Any]]) -> list[Any]:
    """The ``states`` list, counted before any state is read."""
    if not isinstance(raw, list) or not raw:
        detail.append(
            validation_detail(
                ["body", "states"],
                "a non-empty list of states",
                "missing",
                None,
                {"min_length": 1},
            )
        )
        return []
    if len(raw) > max_states:
        detail.append(
            validation_detail(
                ["body", "states"],
                f"at most {max_states} states a batch",
                "too_long",
                len(raw),
                {"max_length": max_states},
            )
        )
        return []
    return raw


def batch_to_system_one(
    model: str, states: Sequence[Any], questions: Mapping[str, Question]
) -> dict[str, Any]:
    """A batch body asking ``questions`` about each of ``states``."""
    return {
        "model": model,
        "states": list(states),
        "questions": {qid: question_to_system_one(q) for qid, q in questions.items()},
    }


def batch_item_error(
    status: int, kind: str, message: str, loc: Sequence[str | int] | None = None
) -> dict[str, Any]:
    """A result that is an error: the one ``/v1/systemone`` would have answered this state
    with (``status``, its ``error_type`` ``kind``; a 422's ``loc``)."""
    error: dict[str, Any] = {"error_type": kind, "message": message, "status": status}
    if loc is not None:
        error["loc"] = list(loc)
    return {"error": error}


def batch_response(model: str, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The batch's response: ``results`` in input order, the answered items' usage summed."""
    input_tokens = sum(
        result["usage"]["input_tokens"] for result in results if "error" not in result
    )
    return {
        "model": model,
        "results": list(results),
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }


def advertisement(max_states: int) -> dict[str, Any]:
    """The `ADVERTISEMENT` field's value: where the route is, and its cap."""
    return {"path": BATCH_PATH, "max_states": max_states}


def calibration_advertisement(mode: str) -> dict[str, Any]:
    """The `CALIBRATION_ADVERTISEMENT` field's value: the route's batch calibration (``"on"``
    or ``"off"``), and its floor: the fewest answered states it divides, and per option."""
    return {"mode": mode, "min_states": MIN_BATCH_ITEMS, "min_states_per_option": ITEMS_PER_OPTION}
