"""Fitting calibration maps on labelled reads, and keeping one only where it helps.

Each transform (`typevet_async._core.statistics.calibration`) is fitted by minimising the negative
log-likelihood of the gold options on a fitting split; scipy does the optimising (a bounded
scalar search for the temperature, L-BFGS for Platt's slope and biases, the pool-adjacent-
violators algorithm for isotonic curves). A question keeps the candidate with the lowest NLL
on the held-out split, and only if that beats the raw probabilities there: a map that does not
help on data it was not fitted on is not kept.

Inputs are arrays: ``probabilities`` of shape (n, k), one row per item in option order, and
``gold`` of shape (n,), the right option's index. This module needs numpy and scipy (the
``eval`` extra); applying a fitted map does not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
from scipy.optimize import isotonic_regression, minimize, minimize_scalar

from typevet_async._core.statistics.calibration import (
    PROBABILITY_FLOOR,
    Isotonic,
    Platt,
    Temperature,
    Transform,
    transform_probabilities,
)

__all__ = [
    "MIN_FIT_ITEMS",
    "Candidate",
    "Labelled",
    "choose_transform",
    "fit_isotonic",
    "fit_platt",
    "fit_temperature",
    "is_heldout",
    "negative_log_likelihood",
]

Array = npt.NDArray[np.float64]
Indices = npt.NDArray[np.int64]

#: Fewer labelled items than this in a question's fitting split: no map is fitted for it.
MIN_FIT_ITEMS = 20
#: A temperature is searched between these bounds (log scale).
TEMPERATURE_BOUNDS = (1e-2, 1e2)


@attrs.frozen
class Labelled:
    """One question's labelled reads: probabilities (n, k) in option order, gold indices."""

    probabilities: Array
    gold: Indices

    def __len__(self) -> int:
        return len(self.gold)

    def subset(self, mask: npt.NDArray[np.bool_]) -> Labelled:
        return Labelled(self.probabilities[mask], self.gold[mask])


@attrs.frozen
class Candidate:
    """A fitted transform, what it was fitted on, and its held-out NLL."""

    name: str
    transform: Transform
    fitted_on: str
    heldout_nll: float


def is_heldout(record_key: str, fraction: float, seed: int = 0) -> bool:
    """Whether a record (its id's JSON) falls in the held-out split: a hash of the id, so the
    split does not move when the file is reordered, resumed or grows."""
    digest = hashlib.sha256(f"{seed}:{record_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def _log(probabilities: Array) -> Array:
    logs: Array = np.log(np.maximum(probabilities, PROBABILITY_FLOOR))  # some stubs give Any
    return logs


def _nll_of_logits(logits: Array, gold: Indices) -> float:
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_normaliser = np.log(np.exp(shifted).sum(axis=1))
    return float(np.mean(log_normaliser - shifted[np.arange(len(gold)), gold]))


def negative_log_likelihood(probabilities: Array, gold: Indices) -> float:
    """Mean ``-log p[gold]``, each probability floored at `PROBABILITY_FLOOR`."""
    return float(np.mean(-_log(probabilities[np.arange(len(gold)), gold])))


def fit_temperature(data: Labelled) -> Temperature:
    """The temperature that minimises the NLL of ``softmax(log p / T)``."""
    logs = _log(data.probabilities)
    low, high = np.log(TEMPERATURE_BOUNDS)
    result = minimize_scalar(
        lambda log_t: _nll_of_logits(logs / np.exp(log_t), data.gold),
        bounds=(low, high),
        method="bounded",
        options={"xatol": 1e-6},
    )
    return Temperature(float(np.exp(result.x)))


def fit_platt(data: Labelled, ridge: float = 1e-4) -> Platt:
    """The slope and per-option biases that minimise the NLL of ``softmax(a log p + b)`` (the
    first bias fixed at 0: a shift of every bias changes nothing). ``ridge`` keeps the biases
    finite when the split is separable."""
    logs = _log(data.probabilities)
    options = logs.shape[1]

    def loss(parameters: Array) -> float:
        biases = np.concatenate(([0.0], parameters[1:]))
        penalty = ridge * float(np.sum(parameters[1:] ** 2))
        return _nll_of_logits(parameters[0] * logs + biases, data.gold) + penalty

    start = np.concatenate(([1.0], np.zeros(options - 1)))
    result = minimize(loss, start, method="L-BFGS-B")
    slope, *rest = (float(value) for value in result.x)
    return Platt(slope, (0.0, *rest))


def _curve(x: Array, y: Array) -> tuple[tuple[float, float], ...]:
    order = np.argsort(x, kind="stable")
    fitted = isotonic_regression(y[order], increasing=True).x
    xs = x[order]
    # One knot per distinct x (ties averaged), then only the ends of each flat run: the
    # curve is linear between knots, so the inner knots of a run change nothing.
    unique, start = np.unique(xs, return_index=True)
    values = np.add.reduceat(fitted, start) / np.diff(np.append(start, len(xs)))
    values = np.maximum.accumulate(np.clip(values, 0.0, 1.0))
    knots: list[tuple[float, float]] = []
    for index, (knot_x, knot_y) in enumerate(zip(unique, values, strict=True)):
        last = index == len(unique) - 1
        same_before = index > 0 and values[index - 1] == knot_y
        same_after = not last and values[index + 1] == knot_y
        if not (same_before and same_after):
            knots.append((float(np.clip(knot_x, 0.0, 1.0)), float(knot_y)))
    return tuple(knots)


def fit_isotonic(data: Labelled) -> Isotonic:
    """One non-decreasing curve per option, of its probability against whether it is gold."""
    options = data.probabilities.shape[1]
    return Isotonic(
        tuple(
            _curve(data.probabilities[:, option], (data.gold == option).astype(np.float64))
            for option in range(options)
        )
    )


def transformed(transform: Transform, probabilities: Array) -> Array:
    """Every row through ``transform`` (the same function a session applies)."""
    return np.array([transform_probabilities(transform, row) for row in probabilities.tolist()])


def choose_transform(
    fit: Labelled, heldout: Labelled, pooled: Labelled | None = None
) -> tuple[Candidate | None, dict[str, Any]]:
    """Fit every candidate on ``fit`` (and a temperature on ``pooled``, every question of the
    type, when given), and return the one with the lowest held-out NLL if it beats the raw
    probabilities (else None), with the figures it was chosen by.
    """
    report: dict[str, Any] = {"fit_items": len(fit), "heldout_items": len(heldout)}
    if len(fit) < MIN_FIT_ITEMS or len(heldout) == 0:
        report["kept"] = "none"
        report["why"] = (
            f"too few labelled items to fit ({len(fit)} to fit, {len(heldout)} held out; "
            f"at least {MIN_FIT_ITEMS} to fit and 1 held out)"
        )
        return None, report
    raw = negative_log_likelihood(heldout.probabilities, heldout.gold)
    fitted: list[tuple[str, Transform, str]] = [
        ("temperature", fit_temperature(fit), "question"),
        ("platt", fit_platt(fit), "question"),
        ("isotonic", fit_isotonic(fit), "question"),
    ]
    if pooled is not None and len(pooled) > len(fit):
        fitted.insert(1, ("temperature (type)", fit_temperature(pooled), "type"))
    candidates = [
        Candidate(
            name,
            transform,
            on,
            negative_log_likelihood(transformed(transform, heldout.probabilities), heldout.gold),
        )
        for name, transform, on in fitted
    ]
    report["heldout_nll_raw"] = raw
    report["heldout_nll"] = {candidate.name: candidate.heldout_nll for candidate in candidates}
    best = min(candidates, key=lambda candidate: candidate.heldout_nll)
    if best.heldout_nll >= raw:
        report["kept"] = "none"
        report["why"] = "no candidate lowered the held-out NLL"
        return None, report
    report["kept"] = best.name
    return best, report


def pool(parts: Sequence[Labelled]) -> Labelled:
    """Several questions' labelled reads as one (same number of options each)."""
    return Labelled(
        np.concatenate([part.probabilities for part in parts]),
        np.concatenate([part.gold for part in parts]),
    )


def pooled_by_type(
    fits: Mapping[str, Labelled], kinds: Mapping[str, str]
) -> dict[str, Labelled | None]:
    """Each question's type-pooled fitting data: every question of its type with as many
    options (a temperature does not depend on the options' meaning, only on their count)."""
    pooled: dict[str, Labelled | None] = {}
    for question_id, data in fits.items():
        same = [
            fits[other]
            for other in fits
            if kinds[other] == kinds[question_id]
            and fits[other].probabilities.shape[1] == data.probabilities.shape[1]
        ]
        pooled[question_id] = pool(same) if len(same) > 1 else None
    return pooled
