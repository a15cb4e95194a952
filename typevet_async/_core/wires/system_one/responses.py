"""A judgment as a System One response: each answer in its type's declared shape
(`typevet_async._core.wires.system_one.schema`), the usage, and our richer record under the
extension field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from typevet_async._core.reading.answers import (
    Answer,
    ChoiceAnswer,
    Judgment,
    NoulAnswer,
    ScoreAnswer,
)
from typevet_async._core.wires.system_one.questions import EXTENSION
from typevet_async._core.wires.system_one.schema import ANSWER_FIELDS, wire_fields

__all__ = ["answer_fields", "answer_to_system_one", "response_to_system_one"]


def _values(
    answer: Answer, criteria: list[Any] | None, off_menu_mass: float | None
) -> tuple[str, dict[str, Any]]:
    """The answer's type, and the value of every field it declares."""
    values: dict[str, Any] = {
        "confidence": answer.confidence,
        "x_entropy_confidence": answer.entropy_confidence,
        "probabilities": {str(key): p for key, p in answer.probabilities.items()},
        "off_menu_mass": off_menu_mass,
    }
    if isinstance(answer, NoulAnswer):
        values.update(type="noul", noul=answer.noul)
    elif isinstance(answer, ChoiceAnswer):
        values.update(type="choice", choice=answer.choice)
    else:
        assert isinstance(answer, ScoreAnswer)
        fits = criteria is not None and len(criteria) == len(answer.legend)
        legend = criteria if fits and criteria is not None else answer.legend
        values.update(type="score", score=answer.score)
        values["legend"] = {str(n): text for n, text in enumerate(legend)}
    return values["type"], values


def answer_fields(
    answer: Answer, criteria: list[Any] | None = None, *, off_menu_mass: float | None = None
) -> dict[str, Any]:
    """Every declared field of ``answer`` (`ANSWER_FIELDS`: the wire's, then MCP's extras), in
    the declared order; a Score's legend is ``criteria`` as sent, if given."""
    kind, values = _values(answer, criteria, off_menu_mass)
    return {field.name: values[field.name] for field in ANSWER_FIELDS[kind]}


def answer_to_system_one(answer: Answer, criteria: list[Any] | None = None) -> dict[str, Any]:
    """One answer in the System One shape (its type's wire fields, in order); a Score's legend
    is ``criteria`` as sent, if given."""
    kind, values = _values(answer, criteria, None)
    return {field.name: values[field.name] for field in wire_fields(kind)}


def response_to_system_one(
    judgment: Judgment,
    model: str,
    *,
    score_criteria: Mapping[str, list[Any]] | None = None,
    extension: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A System One response for ``judgment``; ``extension`` (our usage and diagnostics, as the
    converter writes them) goes under `EXTENSION`."""
    criteria = score_criteria or {}
    body: dict[str, Any] = {
        "model": model,
        "answers": {
            qid: answer_to_system_one(answer, criteria.get(qid))
            for qid, answer in judgment.answers.items()
        },
        "usage": {"input_tokens": judgment.usage.prompt_tokens, "output_tokens": 0},
    }
    if extension is not None:
        body[EXTENSION] = extension
    return body
