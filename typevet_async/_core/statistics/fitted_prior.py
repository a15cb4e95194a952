"""A fitted prior: batch calibration's prior (`batch_calibration`) estimated once from a
batch of unlabelled states, kept, and divided out of later answers, with its versioned JSON
artefact.

It is pinned as a calibration map is (`Pins`, `Reading`, `question_hash`: one owner of what
decides a read): the question set, model, template family, server kind and prompt framing, and
for each question its own hash (type, instructions, options and their order, examples) and how
it was read (rotations, label prior). `FittedPrior.check` refuses a judgment any of these do
not match, before anything is sent, naming the question and the pin. The artefact carries a
SHA-256 of its own canonical JSON, and is read strictly: an unknown or missing field, a value
of the wrong type, a prior that is not a distribution, or a digest that is not the content's
is refused.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Answer, Diagnostics
from typevet_async._core.statistics.artefact_files import ArtefactFile, canonical_sha256
from typevet_async._core.statistics.batch_calibration import (
    BatchPrior,
    apply_batch_prior,
    min_batch_items,
)
from typevet_async._core.statistics.calibration import (
    Pins,
    Reading,
    check_pins,
    question_mismatch,
)
from typevet_async._errors import CalibrationError

__all__ = ["PRIOR_FORMAT", "PRIOR_REMEDY", "PRIOR_VERSION", "FittedPrior", "QuestionPrior"]

PRIOR_FORMAT: Final = "typevet_async.prior"
PRIOR_VERSION: Final = 1
_FILE: Final = ArtefactFile(PRIOR_FORMAT, PRIOR_VERSION, "fitted prior", "the prior")
#: What a prior's refusal tells the caller to do.
PRIOR_REMEDY: Final = "fit a prior for this one (Session.fit_prior, or typevet-async fit-prior)"
#: How far from 1 a prior's probabilities may sum (float noise of a mean, and JSON's digits).
_SUM_TOLERANCE: Final = 1e-6

_TOP_FIELDS: Final = frozenset({"format", "version", "created", "pins", "questions", "sha256"})
_ENTRY_FIELDS: Final = frozenset({"question", "reading", "probabilities", "items", "skipped"})
_PIN_FIELDS: Final = frozenset(field.name for field in attrs.fields(Pins))


@attrs.frozen
class QuestionPrior:
    """One question's fitted prior: what it was fitted on (`question_hash`, `Reading`) and
    the `BatchPrior` (the mean of its answers, or skipped with the reason)."""

    question: str
    reading: Reading
    prior: BatchPrior


@attrs.frozen
class FittedPrior:
    """A prior fitted from unlabelled states (`Session.fit_prior`), pinned to what decided
    its reads; ``to_json`` / ``from_json`` are its artefact. Give it as ``prior=`` to a
    session, `judge` or `judge_many`: each answer is divided by its question's prior and
    renormalised (``diagnostics.batch_prior``, ``raw_probabilities``)."""

    pins: Pins
    questions: Mapping[str, QuestionPrior]
    #: When it was fitted (ISO 8601), for people; not checked.
    created: str = ""

    def _body(self) -> dict[str, Any]:
        questions = {
            question_id: {
                "question": entry.question,
                "reading": attrs.asdict(entry.reading),
                "probabilities": None
                if entry.prior.probabilities is None
                else list(entry.prior.probabilities),
                "items": entry.prior.items,
                "skipped": entry.prior.skipped,
            }
            for question_id, entry in self.questions.items()
        }
        return _FILE.body(self.created, self.pins, questions)

    @functools.cached_property
    def sha256(self) -> str:
        """``sha256:`` of the artefact's canonical JSON (keys sorted), its own digest left out."""
        return canonical_sha256(self._body())

    def to_json(self) -> bytes:
        """The artefact: the prior's JSON with its ``sha256``, indented for reading."""
        return _FILE.to_json(self._body(), self.sha256)

    @classmethod
    def from_json(cls, data: bytes | str) -> FittedPrior:
        """Read an artefact, strictly.

        :raises CalibrationError: not JSON, another format or version, a field unknown,
            missing or of the wrong type, a prior that is not a distribution (or too few
            items for one), or a ``sha256`` that is not the content's (the file was edited).
        """
        body = _FILE.read(data)
        _fields("the prior", body, _TOP_FIELDS)
        pins = _fields("the prior's pins", body["pins"], _PIN_FIELDS)
        if not all(isinstance(value, str) for value in pins.values()):
            raise CalibrationError(f"the prior's pins must be text, got {pins!r}")
        questions = body["questions"]
        if not isinstance(questions, dict):
            raise CalibrationError(f"the prior's questions must be an object, got {questions!r}")
        created = body["created"]
        if not isinstance(created, str):
            raise CalibrationError(f"the prior's created must be text, got {created!r}")
        prior = cls(
            Pins(**pins),
            {question_id: _question_prior(question_id, e) for question_id, e in questions.items()},
            created,
        )
        _FILE.check_digest(body["sha256"], prior.sha256)
        return prior

    def check(
        self,
        served: Pins,
        questions: Sequence[tuple[str, Question]],
        readings: Mapping[str, Reading],
    ) -> None:
        """Refuse a judgment this prior was not fitted for (``served``: the judgment's own
        pins; its questions may be a subset of the prior's, each checked by its hash).

        :raises CalibrationError: the model, template family, server kind or prompt framing
            differ, or a question is not in the prior, was changed, is read another way
            (rotations, label prior) or has another number of options; ``question_id`` names
            the question (the judgment's first, where a pin of the whole prior differs).
        """
        try:
            check_pins("prior", PRIOR_REMEDY, self.pins, served)
        except CalibrationError as refused:
            refused.question_id = questions[0][0] if questions else None
            raise
        for question_id, question in questions:
            entry = self.questions.get(question_id)
            error = question_mismatch(
                "prior",
                PRIOR_REMEDY,
                None if entry is None else (entry.question, entry.reading),
                self.questions,
                (question_id, question),
                readings[question_id],
            )
            probabilities = None if entry is None else entry.prior.probabilities
            options = len(question.options())
            if error is None and probabilities is not None and len(probabilities) != options:
                error = CalibrationError(
                    f"the prior has {len(probabilities)} options, the question {options}"
                )
            if error is not None:
                error.question_id = question_id
                raise error

    def apply(
        self, question_id: str, question: Question, answer: Answer, diagnostics: Diagnostics
    ) -> tuple[Answer, Diagnostics]:
        """The answer with the question's prior divided out (`apply_batch_prior`; a skipped
        prior leaves it as read and says why in the diagnostics)."""
        return apply_batch_prior(question, answer, diagnostics, self.questions[question_id].prior)


def _fields(what: str, value: Any, expected: frozenset[str]) -> dict[str, Any]:
    """``value`` as an object of exactly the ``expected`` fields.

    :raises CalibrationError: not an object, or a field missing or unknown, naming them.
    """
    if not isinstance(value, dict):
        raise CalibrationError(f"{what} must be an object, got {value!r:.80}")
    missing, unknown = sorted(expected - set(value)), sorted(set(value) - expected)
    if missing or unknown:
        raise CalibrationError(f"{what} has fields missing {missing} or unknown {unknown}")
    return value


def _question_prior(question_id: str, value: Any) -> QuestionPrior:
    """One question's entry of an artefact, checked field by field.

    :raises CalibrationError: a field missing, unknown or of the wrong type, or a prior that
        is not a distribution of at least two options fitted on `min_batch_items` answers;
        ``question_id`` names the question.
    """
    try:
        entry = _fields("the entry", value, _ENTRY_FIELDS)
        reading = _fields("its reading", entry["reading"], frozenset({"rotations", "label_prior"}))
        question, items, skipped = entry["question"], entry["items"], entry["skipped"]
        if not isinstance(question, str) or not question.startswith("sha256:"):
            raise CalibrationError(f"question must be a 'sha256:' digest, got {question!r:.80}")
        if isinstance(items, bool) or not isinstance(items, int) or items < 0:
            raise CalibrationError(f"items must be a whole number of 0 or more, got {items!r:.40}")
        probabilities = _distribution(entry["probabilities"])
        if probabilities is None and not (isinstance(skipped, str) and skipped):
            raise CalibrationError("a prior without probabilities must say why it was skipped")
        if probabilities is not None and (
            skipped is not None or items < min_batch_items(len(probabilities))
        ):
            raise CalibrationError(
                f"a prior with probabilities is fitted on at least "
                f"{min_batch_items(len(probabilities))} answers and not skipped, got items "
                f"{items!r} and skipped {skipped!r:.80}"
            )
        prior = BatchPrior(probabilities, items, skipped)
        return QuestionPrior(question, Reading(**reading), prior)
    except CalibrationError as error:
        error.question_id = question_id
        raise


def _distribution(value: Any) -> tuple[float, ...] | None:
    """A prior's probabilities: None, or two or more numbers in [0, 1] summing to 1.

    :raises CalibrationError: anything else.
    """
    if value is None:
        return None
    if not isinstance(value, list) or len(value) < 2:
        raise CalibrationError(f"probabilities must be a list of 2 or more, got {value!r:.80}")
    if not all(
        isinstance(p, int | float) and not isinstance(p, bool) and math.isfinite(p) and 0 <= p <= 1
        for p in value
    ):
        raise CalibrationError(f"probabilities must be numbers in [0, 1], got {value!r:.80}")
    if abs(math.fsum(value) - 1.0) > _SUM_TOLERANCE:
        raise CalibrationError(f"probabilities must sum to 1, got {math.fsum(value)!r}")
    return tuple(float(p) for p in value)
