"""Calibration maps: what they do to an answer's probabilities, what they are pinned to, and
their versioned JSON artefact.

A map is fitted (``typevet_async._fitting``) on labelled reads and applied to a question's
final probabilities, in option order, after any rotations were averaged
(`typevet_async._core.prompts.rotations`). Every transform works on those probabilities, so it
applies
the same way whichever backend read them (logprobs normalised by the server or not: the
softmax of log-probabilities is the probabilities again):

- ``temperature``: ``softmax(log p / T)``;
- ``platt``: ``softmax(a log p + b)``, one slope and a bias per option; for two options this is
  exactly Platt's ``sigmoid(a (logit) + b)``;
- ``isotonic``: each option's probability through its own non-decreasing piecewise-linear curve
  (one-vs-rest, Zadrozny and Elkan), then normalised.

A map is pinned. The artefact names a hash of the question set, the model id, the template
family and the server kind it was fitted with; each question's entry names its own question's
hash and how its probabilities were read (rotations, label prior). `CalibrationMap.check`
refuses a judgment any of these do not match, before anything is sent: a temperature fitted on
one model's logprobs means nothing on another's. The artefact carries a SHA-256 of its own
canonical JSON, checked when it is read.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar, TypeAlias

import attrs
import orjson

from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.readings import softmax
from typevet_async._core.statistics.artefact_files import ArtefactFile, canonical_sha256
from typevet_async._errors import CalibrationError

__all__ = [
    "CALIBRATION_FORMAT",
    "CALIBRATION_VERSION",
    "MAP_REMEDY",
    "CalibrationMap",
    "Isotonic",
    "Pins",
    "Platt",
    "QuestionMap",
    "Reading",
    "Temperature",
    "Transform",
    "check_pins",
    "question_hash",
    "question_mismatch",
    "question_set_hash",
    "transform_probabilities",
]

CALIBRATION_FORMAT = "typevet_async.calibration"
CALIBRATION_VERSION = 1
_FILE = ArtefactFile(
    CALIBRATION_FORMAT, CALIBRATION_VERSION, "calibration map", "the calibration map"
)

#: The smallest probability a transform takes the log of, or leaves an option with: a read
#: whose probability underflowed to 0 stays finite (and an isotonic curve at 0 stays above it).
PROBABILITY_FLOOR = 1e-12


def _finite(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise CalibrationError(f"{attribute.name} must be a finite number, got {value!r}")


#: A temperature a map may hold: the fitter searches 1e-2..1e2; past these a map is degenerate
#: (5e-324 divides every log-probability into an infinity).
TEMPERATURE_RANGE = (1e-3, 1e3)
#: The largest magnitude of a Platt slope or bias (log-probabilities are floored at about -27.6,
#: so this keeps every logit far from overflowing).
PLATT_LIMIT = 1e4


def _temperature(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    _finite(_, attribute, value)
    low, high = TEMPERATURE_RANGE
    if not low <= value <= high:
        raise CalibrationError(
            f"{attribute.name} must be between {low:g} and {high:g}, got {value!r}: a map "
            "beyond them is degenerate"
        )


def _platt_slope(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    _finite(_, attribute, value)
    if abs(value) > PLATT_LIMIT:
        raise CalibrationError(f"slope must be at most {PLATT_LIMIT:g} in size, got {value!r}")


def _finite_tuple(value: Any) -> tuple[float, ...]:
    values = tuple(float(item) for item in value)
    if not all(math.isfinite(v) and abs(v) <= PLATT_LIMIT for v in values):
        raise CalibrationError(
            f"biases must be finite numbers at most {PLATT_LIMIT:g} in size, got {values!r}"
        )
    return values


def _curves(value: Any) -> tuple[tuple[tuple[float, float], ...], ...]:
    curves = tuple(tuple((float(x), float(y)) for x, y in curve) for curve in value)
    for curve in curves:
        xs = [x for x, _ in curve]
        ys = [y for _, y in curve]
        if not curve:
            raise CalibrationError("an isotonic curve needs at least one knot")
        if any(not (0.0 <= v <= 1.0) for v in xs + ys):
            raise CalibrationError("isotonic knots must lie in [0, 1]")
        if xs != sorted(xs) or len(set(xs)) != len(xs) or ys != sorted(ys):
            raise CalibrationError("isotonic knots must rise: x strictly, y never falling")
    return curves


@attrs.frozen
class Temperature:
    """``softmax(log p / temperature)``: above 1 softens, below 1 sharpens."""

    kind: ClassVar[str] = "temperature"
    temperature: float = attrs.field(validator=_temperature)

    @property
    def options(self) -> int | None:
        return None


@attrs.frozen
class Platt:
    """``softmax(slope * log p + biases)``: one slope, a bias per option."""

    kind: ClassVar[str] = "platt"
    slope: float = attrs.field(validator=_platt_slope)
    biases: tuple[float, ...] = attrs.field(converter=_finite_tuple)

    @property
    def options(self) -> int | None:
        return len(self.biases)


@attrs.frozen
class Isotonic:
    """Each option's probability through its curve (``(x, y)`` knots, linear between them,
    flat outside), then normalised."""

    kind: ClassVar[str] = "isotonic"
    curves: tuple[tuple[tuple[float, float], ...], ...] = attrs.field(converter=_curves)

    @property
    def options(self) -> int | None:
        return len(self.curves)


Transform: TypeAlias = Temperature | Platt | Isotonic
_TRANSFORMS: dict[str, type[Transform]] = {t.kind: t for t in (Temperature, Platt, Isotonic)}


def _interpolate(curve: Sequence[tuple[float, float]], x: float) -> float:
    xs = [knot[0] for knot in curve]
    right = bisect.bisect_right(xs, x)
    if right == 0:
        return curve[0][1]
    if right == len(curve):
        return curve[-1][1]
    (x0, y0), (x1, y1) = curve[right - 1], curve[right]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def transform_probabilities(
    transform: Transform, probabilities: Sequence[float]
) -> tuple[float, ...]:
    """A question's probabilities (option order) through ``transform``.

    :raises CalibrationError: the result is not a distribution of finite numbers (a transform
        the validators let through must still never answer NaN).
    """
    if isinstance(transform, Isotonic):
        mapped = [
            max(_interpolate(curve, p), PROBABILITY_FLOOR)
            for curve, p in zip(transform.curves, probabilities, strict=True)
        ]
        total = math.fsum(mapped)
        result = tuple(value / total for value in mapped)
    else:
        logs = [math.log(max(p, PROBABILITY_FLOOR)) for p in probabilities]
        if isinstance(transform, Temperature):
            result = softmax([value / transform.temperature for value in logs])
        else:
            pairs = zip(logs, transform.biases, strict=True)
            result = softmax([transform.slope * value + bias for value, bias in pairs])
    if not all(map(math.isfinite, result)) or abs(math.fsum(result) - 1.0) > 1e-6:
        raise CalibrationError(f"the {transform.kind} map gave {result!r}, not a distribution")
    return result


@functools.lru_cache(maxsize=1024)  # checked on every calibrated judgment
def question_hash(question: Question) -> str:
    """``sha256:`` of what the model is asked: the question's type, instructions and options
    (labels and descriptions, in order), and its examples if it has any, so any change to them
    moves it (a question without examples hashes as it did before they existed)."""
    shown: list[Any] = [
        type(question).__name__,
        question.instructions,
        [[option.label, option.description] for option in question.options()],
    ]
    if question.examples:
        shown.append([list(example) for example in question.examples])
    return "sha256:" + hashlib.sha256(orjson.dumps(shown)).hexdigest()


def question_set_hash(questions: Sequence[tuple[str, Question]]) -> str:
    """``sha256:`` of the question set: every id with its `question_hash`, in order."""
    pairs = [[question_id, question_hash(question)] for question_id, question in questions]
    return canonical_sha256(pairs)


def _rotations(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CalibrationError(f"rotations must be a whole number of 1 or more, got {value!r:.40}")


def _label_prior(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise CalibrationError(f"label_prior must be true or false, got {value!r:.40}")


@attrs.frozen
class Reading:
    """How a question's probabilities were read: options' rotations averaged, and whether the
    label prior was divided out (`typevet_async._core.prompts.rotations`). Checked where it is
    built, since it is read back from files (a map, an eval run's facts)."""

    rotations: int = attrs.field(default=1, validator=_rotations)
    label_prior: bool = attrs.field(default=False, validator=_label_prior)


@attrs.frozen
class Pins:
    """What a map was fitted with, and a judgment must match."""

    #: `question_set_hash` of the questions it was fitted on.
    questions: str
    #: The model id the server served.
    model: str
    #: The served template family (`TemplateFamily` value).
    template_family: str
    #: The server kind (`Capabilities.server`): llama.cpp and vLLM normalise differently.
    backend: str
    #: How the prompt was framed (`typevet_async._core.prompts.fields.framing_pin`: the
    #: layout, and for the default layout its controls and field block): another prompt reads
    #: otherwise. Empty in a map an SDK wrote before it pinned the framing.
    framing: str = ""


@attrs.frozen
class QuestionMap:
    """One question's map: the transform kept (None: no candidate beat the raw probabilities
    on held-out NLL, so they are kept as read), and the figures it was chosen by."""

    #: `question_hash` of the question it was fitted on.
    question: str
    reading: Reading
    transform: Transform | None
    #: What the transform was fitted on: ``"question"``, or ``"type"`` (every question of its
    #: type pooled); empty when none was kept.
    fitted_on: str = ""
    #: Held-out figures of the raw probabilities and of every candidate (NLL, ECE, counts).
    report: Mapping[str, Any] = attrs.field(factory=dict)


#: What a calibration map's refusal tells the caller to do.
MAP_REMEDY = "fit a map for this one (typevet-async eval, then calibrate)"


def _mismatch(artefact: str, remedy: str, what: str, fitted: Any, actual: Any) -> CalibrationError:
    return CalibrationError(
        f"the {artefact} was fitted for {what} {fitted!r}, this judgment has {actual!r}; {remedy}"
    )


def check_pins(artefact: str, remedy: str, pins: Pins, served: Pins) -> None:
    """Refuse a judgment whose own pins (``served``) are not those an artefact (a calibration
    map, a fitted prior: ``artefact`` names it, ``remedy`` says what to do) was fitted with.

    :raises CalibrationError: the model, template family, server kind or prompt framing
        differ, naming which.
    """
    if pins.framing != served.framing and not pins.framing:
        raise CalibrationError(
            f"the {artefact} was fitted before the SDK pinned the prompt's framing (an "
            f"earlier version, whose default prompt differs); this judgment's is "
            f"{served.framing!r}: {remedy}"
        )
    for what, fitted, actual in (
        ("model", pins.model, served.model),
        ("template family", pins.template_family, served.template_family),
        ("backend", pins.backend, served.backend),
        ("prompt framing", pins.framing, served.framing),
    ):
        if fitted != actual:
            raise _mismatch(artefact, remedy, what, fitted, actual)


def question_mismatch(
    artefact: str,
    remedy: str,
    fitted: tuple[str, Reading] | None,
    known: Collection[str],
    question: tuple[str, Question],
    reading: Reading,
) -> CalibrationError | None:
    """Why an artefact's entry for a question (``fitted``: the question's hash and reading it
    was fitted on; None: it has none, ``known`` the ids it has) does not fit the question as
    this judgment reads it, or None when it fits."""
    question_id, asked = question
    if fitted is None:
        return CalibrationError(
            f"the {artefact} has no question {question_id!r} (it has {sorted(known)}); a "
            "question without one would be left raw"
        )
    if fitted[0] != question_hash(asked):
        return CalibrationError(
            f"the question is not the one the {artefact} was fitted on (its instructions, "
            "options or their order changed)"
        )
    if fitted[1] != reading:
        return _mismatch(artefact, remedy, "reading", fitted[1], reading)
    return None


@attrs.frozen
class CalibrationMap:
    """A fitted, pinned calibration map; ``to_json`` / ``from_json`` are its artefact."""

    pins: Pins
    questions: Mapping[str, QuestionMap]
    #: When it was fitted (ISO 8601), for people; not checked.
    created: str = ""

    def _body(self) -> dict[str, Any]:
        questions = {
            question_id: {
                "question": entry.question,
                "reading": attrs.asdict(entry.reading),
                "transform": None
                if entry.transform is None
                else {"kind": entry.transform.kind, **attrs.asdict(entry.transform)},
                "fitted_on": entry.fitted_on,
                "report": dict(entry.report),
            }
            for question_id, entry in self.questions.items()
        }
        return _FILE.body(self.created, self.pins, questions)

    @functools.cached_property  # describe() names it for every question of every judgment
    def sha256(self) -> str:
        """``sha256:`` of the artefact's canonical JSON (keys sorted), its own digest left out."""
        return canonical_sha256(self._body())

    def to_json(self) -> bytes:
        """The artefact: the map's JSON with its ``sha256``, indented for reading."""
        return _FILE.to_json(self._body(), self.sha256)

    @classmethod
    def from_json(cls, data: bytes | str) -> CalibrationMap:
        """Read an artefact.

        :raises CalibrationError: not JSON, another format or version, a bad field, or a
            ``sha256`` that is not the content's (the file was edited or cut short).
        """
        body = _FILE.read(data)
        try:
            calibration = cls(
                Pins(**body["pins"]),
                {
                    str(question_id): _question_map(entry)
                    for question_id, entry in body["questions"].items()
                },
                str(body.get("created", "")),
            )
        except CalibrationError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CalibrationError(f"the calibration map has a bad field: {error!r}") from None
        _FILE.check_digest(body.get("sha256"), calibration.sha256)
        return calibration

    def check(
        self,
        served: Pins,
        questions: Sequence[tuple[str, Question]],
        readings: Mapping[str, Reading],
    ) -> None:
        """Refuse a judgment this map was not fitted for (``served``: the judgment's own pins;
        its question set may be a subset of the map's, each question checked by its hash).

        :raises CalibrationError: the model, template family, server kind or prompt framing
            differ, or a question is not in the map, was changed, or is read another way
            (rotations, label prior); ``question_id`` names the question.
        """
        check_pins("calibration map", MAP_REMEDY, self.pins, served)
        for question_id, question in questions:
            entry = self.questions.get(question_id)
            error = question_mismatch(
                "calibration map",
                MAP_REMEDY,
                None if entry is None else (entry.question, entry.reading),
                self.questions,
                (question_id, question),
                readings[question_id],
            )
            transform = None if entry is None else entry.transform
            options = len(question.options())
            if error is None and transform is not None and transform.options not in (None, options):
                error = CalibrationError(
                    f"the map's {transform.kind} transform has {transform.options} options, "
                    f"the question {options}"
                )
            if error is not None:
                error.question_id = question_id
                raise error

    def apply(self, question_id: str, probabilities: Sequence[float]) -> tuple[float, ...]:
        """The question's calibrated probabilities (its raw ones where no map was kept)."""
        transform = self.questions[question_id].transform
        if transform is None:
            return tuple(probabilities)
        return transform_probabilities(transform, probabilities)

    def describe(self, question_id: str) -> str:
        """What was applied to the question, for its diagnostics: ``"temperature"`` (or
        ``"none"``) and the map's digest."""
        transform = self.questions[question_id].transform
        return f"{'none' if transform is None else transform.kind} {self.sha256}"


def _question_map(entry: Mapping[str, Any]) -> QuestionMap:
    raw = entry["transform"]
    transform: Transform | None = None
    if raw is not None:
        fields = dict(raw)
        kind = fields.pop("kind")
        if kind not in _TRANSFORMS:
            raise CalibrationError(f"unknown calibration transform {kind!r}")
        transform = _TRANSFORMS[kind](**fields)
    return QuestionMap(
        str(entry["question"]),
        Reading(**entry["reading"]),
        transform,
        str(entry.get("fitted_on", "")),
        dict(entry.get("report", {})),
    )
