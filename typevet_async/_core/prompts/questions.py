"""Typed questions: Noul (yes/no), Choice (one label of several) and Score (a rubric level).

Each question normalises to an ordered tuple of options; the option's position is what the
answer's probabilities are indexed by. Bad questions are refused when they are built: text that
cannot be sent (a lone surrogate), and options the model would see as the same (two labels,
levels or option lines that render identically once folded and neutralised, as the prompt
renders them with `neutralise_line`).

A question may carry ``examples``: (state, answer) pairs the prompt shows as earlier turns of
the conversation, each answered with its option's control (in-context examples). They are
normalised to (state text, option label) pairs when the question is built, so a bad one is
refused there: an answer that is not one of the question's options, a state that is not text.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from typevet_async._core.prompts.markers import neutralise_line
from typevet_async._core.wires.jsonvalues import check_text
from typevet_async._errors import QuestionError

__all__ = [
    "MAX_EXAMPLES",
    "Choice",
    "Noul",
    "Option",
    "Question",
    "Score",
    "check_questions",
    "example_answer",
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


#: The most examples one question may carry: each is a turn of every prompt that asks it.
MAX_EXAMPLES = 64


def _example_label(question: Question, index: int, answer: Any) -> str:
    """The option label an example's answer names: a Noul's bool, a Choice's label, a
    Score's level (an int)."""
    kind = type(question).__name__
    where = f"{kind} examples[{index}]"
    if isinstance(question, Noul):
        if not isinstance(answer, bool):
            raise QuestionError(f"{where}: a Noul's answer must be True or False, got {answer!r}")
        return "true" if answer else "false"
    if isinstance(question, Choice):
        if not isinstance(answer, str) or answer.strip() not in question.labels:
            raise QuestionError(
                f"{where}: the answer must be one of the labels {list(question.labels)}, "
                f"got {answer!r}"
            )
        return answer.strip()
    levels = len(question.levels)
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < levels:
        raise QuestionError(
            f"{where}: a Score's answer must be a level from 0 to {levels - 1}, got {answer!r}"
        )
    return str(answer)


def example_answer(question: Question, label: str) -> bool | str | int:
    """An example's answer as the caller gave it, from the option label it is kept as (the
    inverse of `_example_label`): a Noul's bool, a Choice's label, a Score's level."""
    if isinstance(question, Noul):
        return label == "true"
    if isinstance(question, Score):
        return int(label)
    return label


def _examples(value: Any, question: Question) -> tuple[tuple[str, str], ...]:
    """``examples`` as (state text, option label) pairs, once each is valid."""
    kind = type(question).__name__
    if value is None:
        return ()
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise QuestionError(
            f"{kind} examples must be a sequence of (state, answer) pairs, got {value!r}"
        )
    items = list(itertools.islice(value, MAX_EXAMPLES + 1))  # an endless iterable stops here
    if len(items) > MAX_EXAMPLES:
        raise QuestionError(
            f"{kind} examples: at most {MAX_EXAMPLES} (each is a turn of every prompt), got more"
        )
    pairs: list[tuple[str, str]] = []
    for index, item in enumerate(items):
        if isinstance(item, str | bytes) or not isinstance(item, Sequence) or len(item) != 2:
            raise QuestionError(
                f"{kind} examples[{index}] must be a (state, answer) pair, got {item!r}"
            )
        state, answer = item
        if not isinstance(state, str) or not state.strip():
            raise QuestionError(
                f"{kind} examples[{index}]: the state must be non-empty text, got {state!r}"
            )
        state_text = _text(state, f"{kind} examples[{index}] state")
        pairs.append((state_text, _example_label(question, index, answer)))
    return tuple(pairs)


#: The examples' converter sees the question (its options are built by then).
_EXAMPLES = attrs.Converter(_examples, takes_self=True)  # type: ignore[call-overload]


@attrs.frozen
class Noul:
    """A yes/no question; its answer is P(true).

    ``criteria`` may describe what ``"true"`` and ``"false"`` mean; no other keys are allowed.
    ``examples`` are (state, True/False) pairs shown as earlier turns.
    """

    instructions: str = attrs.field(converter=_instructions)
    criteria: tuple[tuple[str, str | None], ...] = attrs.field(
        default=None, converter=_noul_criteria
    )
    #: (state text, option label) pairs: the label ``"true"`` or ``"false"``.
    examples: tuple[tuple[str, str], ...] = attrs.field(
        default=(),
        kw_only=True,
        converter=_EXAMPLES,  # type: ignore[misc]
    )

    def options(self) -> tuple[Option, ...]:
        """(false, true), in that order."""
        described = dict(self.criteria)
        return (Option("false", described.get("false")), Option("true", described.get("true")))


@attrs.frozen
class Choice:
    """One label from several; ``criteria`` maps each label to a description (or None).
    ``examples`` are (state, label) pairs shown as earlier turns."""

    criteria: tuple[tuple[str, str | None], ...] = attrs.field(converter=_choice_criteria)
    instructions: str = attrs.field(kw_only=True, converter=_instructions)
    #: (state text, label) pairs.
    examples: tuple[tuple[str, str], ...] = attrs.field(
        default=(),
        kw_only=True,
        converter=_EXAMPLES,  # type: ignore[misc]
    )

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(label for label, _ in self.criteria)

    def options(self) -> tuple[Option, ...]:
        """The labels in the order the caller gave them."""
        return tuple(Option(label, description) for label, description in self.criteria)


@attrs.frozen
class Score:
    """A level on a rubric of two or more levels; ``levels[i]`` describes level ``i``.
    ``examples`` are (state, level) pairs shown as earlier turns."""

    levels: tuple[str, ...] = attrs.field(converter=_score_levels)
    instructions: str = attrs.field(kw_only=True, converter=_instructions)
    #: (state text, level) pairs, the level as its option label (``"0"``, ``"1"``, ...).
    examples: tuple[tuple[str, str], ...] = attrs.field(
        default=(),
        kw_only=True,
        converter=_EXAMPLES,  # type: ignore[misc]
    )

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
