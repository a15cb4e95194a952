"""Typed questions: Noul (yes/no), Choice (one label of several) and Score (a rubric level).

Each question normalises to an ordered tuple of options; the option's position is what the
answer's probabilities are indexed by. Bad questions are refused when they are built: text that
cannot be sent (a lone surrogate), and options the model would see as the same (two labels,
levels or option lines that render identically once folded and neutralised, as the prompt
renders them with `neutralise_line`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from typevet_async._core.jsonvalues import check_text
from typevet_async._core.markers import neutralise_line
from typevet_async._errors import QuestionError

__all__ = [
    "Choice",
    "Noul",
    "Option",
    "Question",
    "Score",
    "check_questions",
    "refuse_lookalike_options",
]


@attrs.frozen
class Option:
    """One answer option: its label and an optional description shown to the model."""

    label: str
    description: str | None = None


def _text(value: str, what: str) -> str:
    return check_text(value, what, QuestionError)


def _instructions(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise QuestionError(f"instructions must be a non-empty string, got {value!r}")
    return _text(value.strip(), "instructions")


def _description(owner: str, label: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise QuestionError(
            f"{owner}: the description of {label!r} must be a string or None, got {value!r}"
        )
    return _text(value.strip(), f"{owner}: the description of {label!r}") or None


def _refuse_lookalikes(owner: str, kind: str, items: Iterable[tuple[str, str]]) -> None:
    """Refuse two of ``items`` (each ``(as given, as the prompt renders it)``) that render the
    same: the model could not tell them apart, so their probabilities would mean nothing."""
    seen: dict[str, str] = {}
    for given, rendered in items:
        if rendered in seen and seen[rendered] == given:
            raise QuestionError(f"{owner} {kind} must be distinct, {given!r} appears twice")
        if rendered in seen:
            raise QuestionError(
                f"{owner} {kind} {seen[rendered]!r} and {given!r} render identically in the "
                f"prompt ({rendered!r}); make them differ in more than line breaks, spacing "
                "or marker-shaped <...> brackets"
            )
        seen[rendered] = given


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
        key = _text(label.strip(), f"Choice label {label!r}")
        if key in seen:
            raise QuestionError(f"Choice labels must be distinct, {key!r} appears twice")
        seen.add(key)
        normalised.append((key, _description("Choice", key, description)))
    if len(normalised) < 2:
        raise QuestionError(f"a Choice needs at least two labels, got {len(normalised)}")
    _refuse_lookalikes("Choice", "labels", ((key, neutralise_line(key)) for key, _ in normalised))
    # An option line is "label: description": {"a: b": None} and {"a": "b"} read the same.
    _refuse_lookalikes(
        "Choice",
        "options",
        (
            (key, neutralise_line(key) + (f": {neutralise_line(text)}" if text else ""))
            for key, text in normalised
        ),
    )
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
    stripped = tuple(_text(level.strip(), f"Score level {level!r}") for level in levels)
    _refuse_lookalikes("Score", "levels", ((level, neutralise_line(level)) for level in stripped))
    return stripped


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

    :raises QuestionError: not a non-empty mapping, an id that is not a non-empty string (or
        holds a lone surrogate, which no answer's JSON could carry), or a value that is not a
        question (``question_id`` names it).
    """
    if not isinstance(questions, Mapping) or not questions:
        raise QuestionError("questions must be a non-empty mapping of id to question")
    checked: list[tuple[str, Question]] = []
    for question_id, question in questions.items():
        if not isinstance(question_id, str) or not question_id.strip():
            raise QuestionError(f"question ids must be non-empty strings, got {question_id!r}")
        _text(question_id, f"question id {question_id!r}")
        if not isinstance(question, Noul | Choice | Score):
            error = QuestionError(
                f"expected a Noul, Choice or Score, got {type(question).__name__}"
            )
            error.question_id = question_id
            raise error
        checked.append((question_id, question))
    return tuple(checked)


def refuse_lookalike_options(
    question_id: str, question: Question, texts: Sequence[str | None]
) -> None:
    """Refuse a question whose options a layout shows as ``texts`` (one per option, before
    `neutralise_line`) when two of them read the same (the Jev layouts show a description in
    place of its label).

    :raises QuestionError: naming both options' labels; ``question_id`` names the question.
    """
    labels = [option.label for option in question.options()]
    try:
        _refuse_lookalikes(
            type(question).__name__,
            "options",
            (
                (label, neutralise_line(text or label))
                for label, text in zip(labels, texts, strict=True)
            ),
        )
    except QuestionError as error:
        error.question_id = question_id
        raise
