"""Answer records, their diagnostics, and the judgment that gathers them in request order.

Every answer carries two confidences, both in [0, 1]:

- ``confidence`` is System One's reference confidence (TypeSafe's, as jevcompat's
  ``confidence.formula`` checks it), so a threshold tuned on the hosted API means the same
  here. A Choice's is ``(max p - 1/n) / (1 - 1/n)``: 0 when the options are equally likely, 1
  all on one. A Score's is ``max(0, 1 - sum_i p_i |i - mode| / D)``: the expected distance from
  the most probable level (the first, on a tie) against ``D``, that distance for the even
  distribution over the levels around their middle, ``sum_i |i - (n-1)/2| / n``. A Noul's is
  the Choice formula over (false, true): ``|2 noul - 1|``. From a System One server
  (`Session.system_one`) it is the server's own value.
- ``entropy_confidence`` is 1 minus the normalised Shannon entropy, ``1 - H(p) / ln(n)``, the
  SDK's own measure (its ``confidence`` before issue 33): comparable across questions of any
  size, and for a Score a rating of the whole distribution. Always computed from the answer's
  probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

import attrs

from typevet_async._core.prompts.questions import Choice, Noul, Question, Score

__all__ = [
    "Answer",
    "ChoiceAnswer",
    "Diagnostics",
    "Judgment",
    "NoulAnswer",
    "ScoreAnswer",
    "Usage",
    "build_answer",
    "choice_confidence",
    "entropy_confidence",
    "score_confidence",
]


def _frozen_mapping(value: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(value))


def entropy_confidence(probabilities: Sequence[float]) -> float:
    """1 - H(p)/ln(n), in [0, 1]."""
    entropy = -math.fsum([p * math.log(p) for p in probabilities if p > 0.0])
    return min(1.0, max(0.0, 1.0 - entropy / math.log(len(probabilities))))


def choice_confidence(probabilities: Sequence[float]) -> float:
    """System One's reference confidence of a Choice (and a Noul): ``(max - 1/n) / (1 - 1/n)``,
    clamped to [0, 1]."""
    n = len(probabilities)
    if n <= 1:
        return 1.0
    return min(1.0, max(0.0, (max(probabilities) - 1 / n) / (1 - 1 / n)))


def score_confidence(probabilities: Sequence[float]) -> float:
    """System One's reference confidence of a Score: ``max(0, 1 - sum_i p_i |i - mode| / D)``,
    ``mode`` the most probable level (the first on a tie), ``D = sum_i |i - (n-1)/2| / n``."""
    n = len(probabilities)
    if n <= 1:
        return 1.0
    mode = max(range(n), key=lambda i: (probabilities[i], -i))
    spread = math.fsum(p * abs(i - mode) for i, p in enumerate(probabilities))
    even = math.fsum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return min(1.0, max(0.0, 1.0 - spread / even))


def _entropy_of(answer: Any) -> float:
    return entropy_confidence(list(answer.probabilities.values()))


@attrs.frozen
class NoulAnswer:
    """``noul`` is P(true); ``probabilities`` has the keys ``"false"`` and ``"true"``."""

    noul: float
    probabilities: Mapping[str, float] = attrs.field(converter=_frozen_mapping)
    #: System One's reference confidence, ``|2 noul - 1|`` (module docstring).
    confidence: float
    #: ``1 - H(p) / ln 2``; computed from ``probabilities`` when not given.
    entropy_confidence: float = attrs.field(
        default=attrs.Factory(_entropy_of, takes_self=True), kw_only=True
    )


@attrs.frozen
class ChoiceAnswer:
    """The most probable label (ties go to the first), and every label's probability."""

    choice: str
    probabilities: Mapping[str, float] = attrs.field(converter=_frozen_mapping)
    #: System One's reference confidence, ``(max - 1/n) / (1 - 1/n)`` (module docstring).
    confidence: float
    #: ``1 - H(p) / ln(n)``; computed from ``probabilities`` when not given.
    entropy_confidence: float = attrs.field(
        default=attrs.Factory(_entropy_of, takes_self=True), kw_only=True
    )


def _most_likely_level(answer: Any) -> int:
    probabilities: Mapping[int, float] = answer.probabilities
    return max(probabilities, key=lambda level: (probabilities[level], -level))


@attrs.frozen
class ScoreAnswer:
    """``score`` is the expected level (0-based); ``level`` the most likely level (the lowest,
    on a tie); ``legend[i]`` describes level ``i``."""

    score: float
    probabilities: Mapping[int, float] = attrs.field(converter=_frozen_mapping)
    legend: tuple[str, ...]
    #: System One's reference confidence, ``max(0, 1 - sum_i p_i |i - mode| / D)``.
    confidence: float
    #: ``1 - H(p) / ln(n)``; computed from ``probabilities`` when not given.
    entropy_confidence: float = attrs.field(
        default=attrs.Factory(_entropy_of, takes_self=True), kw_only=True
    )
    #: The most likely level (0-based; the lowest on a tie); computed from ``probabilities``
    #: when not given.
    level: int = attrs.field(
        default=attrs.Factory(_most_likely_level, takes_self=True), kw_only=True
    )


Answer: TypeAlias = NoulAnswer | ChoiceAnswer | ScoreAnswer


def build_answer(question: Question, probabilities: Sequence[float]) -> Answer:
    """The typed answer for a question from its options' probabilities, in option order; both
    confidences computed from them (module docstring)."""
    entropy = entropy_confidence(probabilities)
    if isinstance(question, Noul):
        p_false, p_true = probabilities
        return NoulAnswer(
            p_true,
            {"false": p_false, "true": p_true},
            choice_confidence(probabilities),
            entropy_confidence=entropy,
        )
    if isinstance(question, Choice):
        best = max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))
        labels = question.labels
        return ChoiceAnswer(
            labels[best],
            dict(zip(labels, probabilities, strict=True)),
            choice_confidence(probabilities),
            entropy_confidence=entropy,
        )
    assert isinstance(question, Score)
    expected = math.fsum(level * p for level, p in enumerate(probabilities))
    return ScoreAnswer(
        expected,
        dict(enumerate(probabilities)),
        question.levels,
        score_confidence(probabilities),
        entropy_confidence=entropy,
    )


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
    #: How many options "clamp" filled in (0 unless ``truncated``).
    clamped: int = 0
    #: True when the off-menu mass exceeded the judgment's threshold.
    off_menu_flagged: bool = False
    #: HTTP attempts the read took, retries of transient failures included.
    attempts: int = 1
    #: The endpoint that answered, in a session over several endpoints (None: the only one).
    endpoint: str | None = None
    #: Each rotation's probabilities, in option order, when the options were read under
    #: rotations (``permutations``); the fields above are then the first (unrotated) read's.
    rotations: tuple[tuple[float, ...], ...] = ()
    #: The probabilities before the content-free prior was divided out and the calibration
    #: map applied, in option order (None: neither was).
    raw_probabilities: tuple[float, ...] | None = None
    #: The calibration applied: the transform's kind and the map's SHA-256 (None: none).
    calibration: str | None = None
    #: Each option's (first, second) token ids when its control is a two-token code
    #: (`typevet_async._core.prompts.codes`); ``token_ids`` are then the first tokens and
    # ``logprobs``
    #: the codes' joint logprobs, log P(first) + log P(second | first). Empty: one token each.
    codes: tuple[tuple[int, int], ...] = ()
    #: The session's read cache's outcome: ``"hit"`` (nothing was sent for it: ``reads`` and
    #: ``attempts`` are 0; a question read under rotations is a hit only if every rotation
    #: was), ``"miss"`` (read from the server and stored); None: the session has no cache.
    cache: Literal["hit", "miss"] | None = None
    #: The question's content-free prior, in option order, divided out of this answer
    #: (``content_free=True``: `typevet_async._core.statistics.content_free`); None: not divided.
    content_free_prior: tuple[float, ...] | None = None
    #: The mean off-menu mass of the reads ``content_free_prior`` was averaged from (None: no
    #: prior, or a read's mass is unknown). Reported only: the off-menu guard
    #: (``off_menu_threshold``, ``raise_off_menu``) judges this answer's own read.
    content_free_off_menu_mass: float | None = None
    #: The batch prior divided out of this answer, in option order (``batch_calibration``:
    #: `typevet_async._core.statistics.batch_calibration`); None: not divided.
    batch_prior: tuple[float, ...] | None = None
    #: How many answers the batch prior was (or would have been) estimated from (0: batch
    #: calibration was off).
    batch_prior_items: int = 0
    #: Why batch calibration left this answer as read (too small a batch, a batch that does
    #: not vary the answers); None: divided, or off.
    batch_prior_skipped: str | None = None


@attrs.frozen
class Usage:
    """What a judgment cost the server."""

    #: Prompt tokens of every read, cached or not.
    prompt_tokens: int = 0
    #: Of those, tokens the server took from its prompt cache.
    cached_tokens: int = 0
    #: HTTP scoring reads, escalations and the content-free prior reads this judgment made
    #: included (a prior the session already kept costs nothing).
    reads: int = 0
    #: Scoring requests answered by the session's read cache, with nothing sent (one per
    #: question and rotation, and per prior read; a two-token code question's reads are one).
    cache_hits: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.cached_tokens + other.cached_tokens,
            self.reads + other.reads,
            self.cache_hits + other.cache_hits,
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
