"""Answer records, their diagnostics, and the judgment that gathers them in request order.

``confidence`` is one formula for every question type: 1 minus the normalised Shannon entropy
of the candidates' probabilities, ``1 - H(p) / ln(n)``. It is 1 when all mass is on one option
and 0 when the options are equally likely. We chose it over the top probability because the
top probability has a floor of 1/n that moves with the number of options (a 0.5 means "sure"
for nothing and "torn" for a Noul), and over the top-two margin because that ignores how the
rest of the mass is spread; an entropy score is comparable across questions of any size, and
for a Score it rates the whole distribution, not one level.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeAlias

import attrs

from typevet_async._core.questions import Choice, Noul, Question, Score

__all__ = [
    "Answer",
    "ChoiceAnswer",
    "Diagnostics",
    "Judgment",
    "NoulAnswer",
    "ScoreAnswer",
    "Usage",
    "build_answer",
    "entropy_confidence",
]


def _frozen_mapping(value: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(value))


def entropy_confidence(probabilities: Sequence[float]) -> float:
    """1 - H(p)/ln(n), in [0, 1]."""
    entropy = -math.fsum([p * math.log(p) for p in probabilities if p > 0.0])
    return min(1.0, max(0.0, 1.0 - entropy / math.log(len(probabilities))))


@attrs.frozen
class NoulAnswer:
    """``noul`` is P(true); ``probabilities`` has the keys ``"false"`` and ``"true"``."""

    noul: float
    probabilities: Mapping[str, float] = attrs.field(converter=_frozen_mapping)
    confidence: float


@attrs.frozen
class ChoiceAnswer:
    """The most probable label (ties go to the first), and every label's probability."""

    choice: str
    probabilities: Mapping[str, float] = attrs.field(converter=_frozen_mapping)
    confidence: float


@attrs.frozen
class ScoreAnswer:
    """``score`` is the expected level (0-based); ``legend[i]`` describes level ``i``."""

    score: float
    probabilities: Mapping[int, float] = attrs.field(converter=_frozen_mapping)
    legend: tuple[str, ...]
    confidence: float


Answer: TypeAlias = NoulAnswer | ChoiceAnswer | ScoreAnswer


def build_answer(question: Question, probabilities: Sequence[float]) -> Answer:
    """The typed answer for a question from its options' probabilities, in option order."""
    confidence = entropy_confidence(probabilities)
    if isinstance(question, Noul):
        p_false, p_true = probabilities
        return NoulAnswer(p_true, {"false": p_false, "true": p_true}, confidence)
    if isinstance(question, Choice):
        best = max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))
        labels = question.labels
        return ChoiceAnswer(labels[best], dict(zip(labels, probabilities, strict=True)), confidence)
    assert isinstance(question, Score)
    expected = math.fsum(level * p for level, p in enumerate(probabilities))
    return ScoreAnswer(expected, dict(enumerate(probabilities)), question.levels, confidence)


@attrs.frozen
class Diagnostics:
    """What one answer was read from, for audits and reproducing it."""

    #: The exact text the server scored.
    prompt: str
    #: The controls offered, in option order.
    controls: tuple[str, ...]
    #: The candidate token ids, in option order.
    token_ids: tuple[int, ...]
    #: The candidates' full-vocabulary logprobs as read, in option order.
    logprobs: tuple[float, ...]
    #: 1 - the candidates' summed full-vocabulary probability; None when the server returned
    #: logits instead of logprobs (vLLM in a ``*_logits`` mode), where it cannot be known.
    off_menu_mass: float | None
    #: The top-K of the read the logprobs came from.
    top_k: int
    #: HTTP reads it took (1, plus one per escalation to a larger top-K).
    reads: int
    #: Every token id read with its logprob (controls, then variants such as Jev's " A").
    candidates: tuple[tuple[int, float], ...] = ()
    #: The truncation policy of the read: "exact", "clamp" or "error".
    policy: str = "exact"
    #: True when "clamp" filled a candidate missing from the top-N with the lowest logprob read.
    truncated: bool = False
    #: True when the off-menu mass exceeded the judgment's threshold.
    off_menu_flagged: bool = False
    #: HTTP attempts the read took, retries of transient failures included.
    attempts: int = 1
    #: The endpoint that answered, in a session over several endpoints (None: the only one).
    endpoint: str | None = None
    #: Each rotation's probabilities, in option order, when the options were read under
    #: rotations (``permutations``); the fields above are then the first (unrotated) read's.
    rotations: tuple[tuple[float, ...], ...] = ()
    #: The probabilities before the calibration map, in option order (None: no map applied).
    raw_probabilities: tuple[float, ...] | None = None
    #: The calibration applied: the transform's kind and the map's SHA-256 (None: none).
    calibration: str | None = None


@attrs.frozen
class Usage:
    """What a judgment cost the server."""

    #: Prompt tokens of every read, cached or not.
    prompt_tokens: int = 0
    #: Of those, tokens the server took from its prompt cache.
    cached_tokens: int = 0
    #: HTTP scoring reads, escalations included.
    reads: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.cached_tokens + other.cached_tokens,
            self.reads + other.reads,
        )


@attrs.frozen
class Judgment(Mapping[str, Answer]):
    """Answers by question id, in request order; ``list(judgment)`` gives the ids."""

    answers: Mapping[str, Answer] = attrs.field(converter=_frozen_mapping)
    usage: Usage = Usage()
    diagnostics: Mapping[str, Diagnostics] = attrs.field(factory=dict, converter=_frozen_mapping)

    def __getitem__(self, question_id: str) -> Answer:
        return self.answers[question_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.answers)

    def __len__(self) -> int:
        return len(self.answers)
