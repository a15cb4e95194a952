"""Content-free calibration ("Calibrate Before Use", Zhao et al., ICML 2021).

A small model's answer carries a prior of its own: the prompt, the options' wording and their
order pull it towards some options whatever the state says. The prior is estimated with no
labels by asking the question about states that say nothing, the content-free states; the
answer to a real state is then divided by it and renormalised. In Zhao et al.'s terms this is
their contextual calibration with ``W = diag(p_cf)^-1`` and ``b = 0``, ``p_cf`` the mean of the
content-free answers (they average "N/A", "[MASK]" and the empty string).

Pure arithmetic: the session reads the content-free states once per question
(`typevet_async._session.judging`) and keeps the prior.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

import attrs

from typevet_async._core.prompts.questions import Question, Score
from typevet_async._errors import ConfigurationError, InvalidLogprobsError

#: Which questions have their content-free prior divided out: none, Scores only, or all.
ContentFree = Literal["off", "scores", "all"]

__all__ = [
    "CONTENT_FREE_STATES",
    "PRIOR_FLOOR",
    "ContentFree",
    "ContentFreePrior",
    "content_free_applies",
    "content_free_off_menu_mass",
    "content_free_prior",
    "content_free_setting",
    "divide_prior",
]

#: The states a question's prior is read on: Zhao et al.'s three.
CONTENT_FREE_STATES: tuple[str, ...] = ("N/A", "", "[MASK]")

#: The smallest prior probability divided by: an option the content-free reads gave 0 (an
#: underflow) would otherwise take every answer's mass.
PRIOR_FLOOR = 1e-6


@attrs.frozen
class ContentFreePrior:
    """A question's content-free prior as kept: the mean of its content-free answers
    (`content_free_prior`), and the mean off-menu mass of their reads
    (`content_free_off_menu_mass`), which is reported beside the answers it divides, never
    held against them."""

    probabilities: tuple[float, ...]
    off_menu_mass: float | None = None


def content_free_setting(value: Any) -> ContentFree:
    """A ``content_free`` setting: ``"off"``, ``"scores"`` or ``"all"``; ``False`` is
    ``"off"`` and ``True`` ``"all"``.

    :raises ConfigurationError: any other value.
    """
    if value is True or value is False:
        return "all" if value else "off"
    if isinstance(value, str) and value in get_args(ContentFree):
        return value  # type: ignore[return-value]
    raise ConfigurationError(
        f"content_free must be 'off', 'scores', 'all', True or False, got {value!r}"
    )


def content_free_applies(question: Question, setting: ContentFree) -> bool:
    """Whether ``setting`` divides ``question``'s prior out of its answers."""
    return setting == "all" or (setting == "scores" and isinstance(question, Score))


def content_free_prior(reads: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """The mean of the content-free answers' probabilities (each in option order).

    :raises InvalidLogprobsError: no reads, reads of different sizes, or a value that is not
        a finite probability (what a read's validation already refuses; checked again here,
        since every later answer is divided by it).
    """
    if not reads:
        raise InvalidLogprobsError("a content-free prior needs at least one read")
    options = len(reads[0])
    if any(len(read) != options for read in reads):
        raise InvalidLogprobsError("content-free reads of different option counts")
    for read in reads:
        if not all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in read):
            raise InvalidLogprobsError(f"a content-free read is not a distribution: {read!r}")
    return tuple(math.fsum(read[i] for read in reads) / len(reads) for i in range(options))


def content_free_off_menu_mass(masses: Sequence[float | None]) -> float | None:
    """The mean of the content-free reads' off-menu masses: the off-menu mass of their mean
    distribution over the whole vocabulary (None: no reads, or a read's mass is unknown)."""
    known = [mass for mass in masses if mass is not None]
    if not masses or len(known) < len(masses):
        return None
    return math.fsum(known) / len(known)


def divide_prior(probabilities: Sequence[float], prior: Sequence[float]) -> tuple[float, ...]:
    """``probabilities`` divided by ``prior`` option by option, renormalised (each prior value
    floored at `PRIOR_FLOOR`). A prior that is uniform changes nothing."""
    if len(probabilities) != len(prior):
        raise InvalidLogprobsError(
            f"{len(probabilities)} probabilities against a prior of {len(prior)} options"
        )
    weights = [p / max(q, PRIOR_FLOOR) for p, q in zip(probabilities, prior, strict=True)]
    total = math.fsum(weights)
    if not total > 0.0 or not math.isfinite(total):
        return tuple(probabilities)  # every option at 0 (underflow): nothing to divide
    return tuple(weight / total for weight in weights)
