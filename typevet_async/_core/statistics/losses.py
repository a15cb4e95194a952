"""Per-item proper scoring rules: the negative log-likelihood and the Brier score of each item.

Inputs: ``p``, a float array ``(n, k)`` of probability rows in option order, and ``y``, an int
array ``(n,)`` of the gold option's index (both checked by
`typevet_async._core.statistics.metrics`).

- NLL_i = -ln(max(p_i[y_i], 1e-12)). The clip keeps one item that put zero mass on its gold
  option from making the mean infinite (and the JSON report invalid); it caps an item's loss
  at -ln(1e-12) ~ 27.6 nats.
- Brier_i = sum_k (p_ik - [k == y_i])^2, the multi-class form, in [0, 2]. For two options it is
  twice the binary Brier score (p_true - outcome)^2.

The metrics are their means over the items (`typevet_async._core.statistics.bootstrap.mean_of`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from typevet_async._core.statistics.bootstrap import Floats

__all__ = ["NLL_FLOOR", "item_brier", "item_nll"]

#: The smallest gold probability the NLL takes the log of.
NLL_FLOOR = 1e-12


def _gold_probability(p: Floats, y: NDArray[np.intp]) -> Floats:
    gold: Floats = p[np.arange(len(y)), y]  # typed here: some numpy stubs give Any
    return gold


def item_nll(p: Floats, y: NDArray[np.intp]) -> Floats:
    """-ln(max(p[gold], NLL_FLOOR))."""
    nll: Floats = -np.log(np.maximum(_gold_probability(p, y), NLL_FLOOR))
    return nll


def item_brier(p: Floats, y: NDArray[np.intp]) -> Floats:
    """sum_k (p_k - onehot_k)^2."""
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y] = 1.0
    return np.asarray(((p - onehot) ** 2).sum(axis=1), dtype=np.float64)
