"""An eval run's reads line (what ``evaluate`` appends to its JSONL file, and what a resumed
run and ``calibrate`` read back), checked against the run's questions and readings.

One owner for what a valid line is, so that a corrupted or hand-edited file is refused naming
its problem, before the metrics or a fit meet it (a string of probabilities would otherwise
pass into a fit, three probabilities for a yes/no question would end inside numpy). A judged
line is ``{"id": ..., "labels": {question id: gold}, "answers": {question id: {"probabilities":
[...], "raw": [...] | null, "rotations": [[...], ...]}}}``; a failed record's line carries
``"error": {"type": ..., "message": ...}`` instead of ``answers``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from typevet_async._core.prompts.questions import Question
from typevet_async._core.statistics.calibration import Reading
from typevet_async._core.statistics.labels import gold_indices
from typevet_async._core.statistics.metrics import SUM_TOLERANCE
from typevet_async._errors import InvalidInputError

__all__ = ["QuestionRead", "ReadsLine", "distribution", "reads_line"]

#: Characters of a bad value an error message shows (a hostile line may hold megabytes).
_SHOWN: Final = 40


@attrs.frozen
class QuestionRead:
    """One labelled question's read on one record."""

    gold: int
    #: The answer's probabilities (calibrated, where a map applied), in option order.
    probabilities: tuple[float, ...]
    #: Before any calibration map (the answer's own where none applied).
    raw: tuple[float, ...]
    #: Each rotation's probabilities (empty when read in one order).
    rotations: tuple[tuple[float, ...], ...]


@attrs.frozen
class ReadsLine:
    """A checked reads line: the record's id and each labelled question's read, or its error."""

    record_id: Any
    reads: Mapping[str, QuestionRead] = attrs.field(factory=dict)
    #: A failed record's error type and message (None: the record was judged).
    error: tuple[str, str] | None = None


def _shown(value: Any) -> str:
    """What a bad value was, bounded."""
    if isinstance(value, list | dict):
        return f"a {'list' if isinstance(value, list) else 'object'} of {len(value)}"
    text = repr(value)
    if len(text) > _SHOWN:
        text = text[:_SHOWN] + "..."
    return f"{type(value).__name__} {text}"


def distribution(value: Any, options: int, what: str) -> tuple[float, ...]:
    """``value`` as a probability vector over ``options`` options: a list of that many
    numbers in [0, 1] (not booleans) summing to 1 within the metrics' ``SUM_TOLERANCE``.

    :raises InvalidInputError: naming ``what`` and the problem.
    """
    if not isinstance(value, list):
        raise InvalidInputError(
            f"{what} must be a list of {options} numbers (one per option), got {_shown(value)}"
        )
    if len(value) != options:
        raise InvalidInputError(
            f"{what} must hold {options} numbers (one per option), got {len(value)}"
        )
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise InvalidInputError(f"{what}[{index}] must be a number, got {_shown(item)}")
        if not 0 <= item <= 1:  # NaN fails this too; an integer of any size is compared exactly
            raise InvalidInputError(f"{what}[{index}] must lie in [0, 1], got {_shown(item)}")
    row = tuple(float(item) for item in value)
    total = math.fsum(row)
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise InvalidInputError(f"{what} sum to {total!r}, not 1 (tolerance {SUM_TOLERANCE:g})")
    return row


def _question_read(
    question_id: str, read: Any, gold: int, options: int, reading: Reading
) -> QuestionRead:
    where = f"the answer of {question_id!r}"
    if not isinstance(read, dict):
        raise InvalidInputError(f"{where} must be an object, got {_shown(read)}")
    missing = sorted({"probabilities", "raw", "rotations"} - set(read))
    if missing:
        raise InvalidInputError(f"{where} has no {', '.join(missing)}")
    probabilities = distribution(read["probabilities"], options, f"{where}: probabilities")
    raw = probabilities
    if read["raw"] is not None:
        raw = distribution(read["raw"], options, f"{where}: raw")
    rotations = read["rotations"]
    wanted = reading.rotations if reading.rotations > 1 else 0  # one order keeps none
    if not isinstance(rotations, list) or len(rotations) != wanted:
        runs = (
            f"a list of {wanted} reads (the run read it under {wanted} orders of its options)"
            if wanted
            else "empty (the run read it in one order)"
        )
        raise InvalidInputError(f"{where}: rotations must be {runs}, got {_shown(rotations)}")
    rows = tuple(
        distribution(row, options, f"{where}: rotations[{index}]")
        for index, row in enumerate(rotations)
    )
    return QuestionRead(gold, probabilities, raw, rows)


def _error(value: Any) -> tuple[str, str]:
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("type"), str)
        or not isinstance(value.get("message"), str)
    ):
        raise InvalidInputError(
            f'error must be {{"type": TEXT, "message": TEXT}}, got {_shown(value)}'
        )
    return value["type"], value["message"]


def reads_line(
    line: Any, questions: Sequence[tuple[str, Question]], readings: Mapping[str, Reading]
) -> ReadsLine:
    """A reads line checked against the run's questions and how each was read.

    :raises InvalidInputError: not an object with ``id`` and ``labels`` and either ``answers``
        or ``error``; a label its question cannot have or for a question not asked; an answer
        for a question not asked, or missing for a labelled one; probabilities that are not a
        distribution over the question's options (`distribution`); rotations other than the
        run's.
    """
    if not isinstance(line, dict):
        raise InvalidInputError(f"a reads line is a JSON object, got {_shown(line)}")
    missing = sorted({"id", "labels"} - set(line))
    if missing or ("answers" in line) == ("error" in line):
        raise InvalidInputError(
            'a reads line is {"id": ..., "labels": {...}, "answers": {...}} (or "error" '
            "instead of answers)"
        )
    if "error" in line:
        return ReadsLine(line["id"], error=_error(line["error"]))
    labels, answers = line["labels"], line["answers"]
    for name, value in (("labels", labels), ("answers", answers)):
        if not isinstance(value, dict):
            raise InvalidInputError(f"{name} must be an object, got {_shown(value)}")
    asked = dict(questions)
    unknown = sorted(set(answers) - set(asked))
    if unknown:
        shown = ", ".join(repr(name[:_SHOWN]) for name in unknown[:5])
        raise InvalidInputError(f"answers for question(s) {shown} that the run does not ask")
    reads: dict[str, QuestionRead] = {}
    for question_id, gold in gold_indices(labels, questions).items():
        if question_id not in answers:
            raise InvalidInputError(f"no answer for the labelled question {question_id!r}")
        options = len(asked[question_id].options())
        reads[question_id] = _question_read(
            question_id, answers[question_id], gold, options, readings[question_id]
        )
    return ReadsLine(line["id"], reads)
