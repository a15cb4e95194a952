"""Typed questions: Noul (yes/no), Choice (one label of several) and Score (a rubric level).

Each question normalises to an ordered tuple of options; the option's position is what the
answer's probabilities are indexed by. Bad questions are refused when they are built.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

import attrs

from typevet_async._errors import QuestionError

__all__ = ["Choice", "Noul", "Option", "Question", "Score", "check_questions"]


@attrs.frozen
class Option:
    """One answer option: its label and an optional description shown to the model."""

    label: str
    description: str | None = None


def _instructions(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise QuestionError(f"instructions must be a non-empty string, got {value!r}")
    return value.strip()


def _description(owner: str, label: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise QuestionError(
            f"{owner}: the description of {label!r} must be a string or None, got {value!r}"
        )
    return value.strip() or None


def _noul_criteria(value: Any) -> tuple[tuple[str, str | None], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise QuestionError(f"Noul criteria must be a mapping of 'true'/'false', got {value!r}")
    unknown = [key for key in value if key not in ("true", "false")]
    if unknown:
        raise QuestionError(f"Noul criteria accept only 'true' and 'false', got {unknown!r}")
    return tuple(
        (key, _description("Noul", key, value[key])) for key in ("false", "true") if key in value
    )


def _choice_criteria(value: Any) -> tuple[tuple[str, str | None], ...]:
    if isinstance(value, str) or not isinstance(value, Mapping | Iterable):
        raise QuestionError(
            f"Choice criteria must be a mapping of label to description, got {value!r}"
        )
    pairs = list(value.items()) if isinstance(value, Mapping) else [(item, None) for item in value]
    seen: set[str] = set()
    normalised: list[tuple[str, str | None]] = []
    for label, description in pairs:
        if not isinstance(label, str) or not label.strip():
            raise QuestionError(f"Choice labels must be non-empty strings, got {label!r}")
        key = label.strip()
        if key in seen:
            raise QuestionError(f"Choice labels must be distinct, {key!r} appears twice")
        seen.add(key)
        normalised.append((key, _description("Choice", key, description)))
    if len(normalised) < 2:
        raise QuestionError(f"a Choice needs at least two labels, got {len(normalised)}")
    return tuple(normalised)


def _score_levels(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise QuestionError(f"Score levels must be a list of strings, got {value!r}")
    levels = tuple(value)
    for level in levels:
        if not isinstance(level, str) or not level.strip():
            raise QuestionError(f"Score levels must be non-empty strings, got {level!r}")
    if len(levels) < 2:
        raise QuestionError(f"a Score needs at least two levels, got {len(levels)}")
    return tuple(level.strip() for level in levels)


@attrs.frozen
class Noul:
    """A yes/no question; its answer is P(true).

    ``criteria`` may describe what ``"true"`` and ``"false"`` mean; no other keys are allowed.
    """

    instructions: str = attrs.field(converter=_instructions)
    criteria: tuple[tuple[str, str | None], ...] = attrs.field(
        default=None, converter=_noul_criteria
    )

    def options(self) -> tuple[Option, ...]:
        """(false, true), in that order."""
        described = dict(self.criteria)
        return (Option("false", described.get("false")), Option("true", described.get("true")))


@attrs.frozen
class Choice:
    """One label from several; ``criteria`` maps each label to a description (or None)."""

    criteria: tuple[tuple[str, str | None], ...] = attrs.field(converter=_choice_criteria)
    instructions: str = attrs.field(kw_only=True, converter=_instructions)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(label for label, _ in self.criteria)

    def options(self) -> tuple[Option, ...]:
        """The labels in the order the caller gave them."""
        return tuple(Option(label, description) for label, description in self.criteria)


@attrs.frozen
class Score:
    """A level on a rubric of two or more levels; ``levels[i]`` describes level ``i``."""

    levels: tuple[str, ...] = attrs.field(converter=_score_levels)
    instructions: str = attrs.field(kw_only=True, converter=_instructions)

    def options(self) -> tuple[Option, ...]:
        """Levels 0..n-1; each level's text is its description."""
        return tuple(Option(str(index), level) for index, level in enumerate(self.levels))


Question: TypeAlias = Noul | Choice | Score


def check_questions(questions: Any) -> tuple[tuple[str, Question], ...]:
    """A call's questions as ``(id, question)`` pairs in request order, once each is valid.

    :raises QuestionError: not a non-empty mapping, an id that is not a non-empty string, or a
        value that is not a question (``question_id`` names it).
    """
    if not isinstance(questions, Mapping) or not questions:
        raise QuestionError("questions must be a non-empty mapping of id to question")
    checked: list[tuple[str, Question]] = []
    for question_id, question in questions.items():
        if not isinstance(question_id, str) or not question_id.strip():
            raise QuestionError(f"question ids must be non-empty strings, got {question_id!r}")
        if not isinstance(question, Noul | Choice | Score):
            error = QuestionError(
                f"expected a Noul, Choice or Score, got {type(question).__name__}"
            )
            error.question_id = question_id
            raise error
        checked.append((question_id, question))
    return tuple(checked)
