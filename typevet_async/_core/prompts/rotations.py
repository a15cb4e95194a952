"""Option-order debiasing: a question read under cyclic rotations of its option order.

Models favour some positions of an option list whatever the options say. Under rotation ``r``
the prompt shows option ``(d + r) mod n`` at position ``d``, and the controls stay in their
places (the first line is always the first control), so each option is read under other
controls and positions; each read is mapped back to option order and the reads are averaged.

The label prior (``label_prior=True``, every rotation read) divides out what the positions
themselves are worth, estimated from the item's own reads, without labels (as PriDe does, Zheng
et al. 2024, "Large language models are not robust multiple choice selectors"): if a read is
``P(position d) ∝ prior(d) · q(option shown at d)``, then over all ``n`` rotations each option
visits each position once, so the geometric mean of position ``d``'s probability over the
rotations is ``prior(d)`` times a constant. Each read is divided by that prior, renormalised,
mapped back to option order, and the reads averaged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from typevet_async._core.reading.readings import softmax
from typevet_async._errors import QuestionError

__all__ = ["combine_rotations", "in_option_order", "rotation_offsets", "rotation_order"]


def rotation_offsets(options: int, rotations: int) -> tuple[int, ...]:
    """The offsets of ``rotations`` cyclic rotations of ``options`` options, spread evenly
    (0 first: the order as given). More rotations than options are the ``options`` distinct
    ones."""
    count = min(rotations, options)
    return tuple(round(index * options / count) for index in range(count))


def rotation_order(options: int, offset: int) -> tuple[int, ...]:
    """The option shown at each position under the rotation by ``offset``."""
    return tuple((position + offset) % options for position in range(options))


def in_option_order(by_position: Sequence[float], order: Sequence[int]) -> tuple[float, ...]:
    """A read's probabilities by position (``order``: the option shown at each), by option."""
    by_option = [0.0] * len(by_position)
    for position, option in enumerate(order):
        by_option[option] = by_position[position]
    return tuple(by_option)


def combine_rotations(
    reads: Sequence[Sequence[float]],
    orders: Sequence[Sequence[int]],
    *,
    label_prior: bool = False,
) -> tuple[float, ...]:
    """One probability per option (option order) from reads under rotations.

    :param reads: each read's probabilities in option order (already mapped back).
    :param orders: each read's `rotation_order`.
    :param label_prior: divide out the positions' prior first (needs every rotation).
    :raises QuestionError: ``label_prior`` without every rotation of the options.
    """
    options = len(reads[0])
    if label_prior:
        if sorted(order[0] for order in orders) != list(range(options)):
            raise QuestionError(
                f"label_prior needs all {options} rotations of the options read, got "
                f"{len(orders)}; pass permutations >= {options}"
            )
        reads = _divide_prior(reads, orders)
    count = len(reads)
    return tuple(math.fsum(read[option] for read in reads) / count for option in range(options))


def _divide_prior(
    reads: Sequence[Sequence[float]], orders: Sequence[Sequence[int]]
) -> list[tuple[float, ...]]:
    options = len(reads[0])
    # log_positions[r][d]: the log of read r's probability of the option it showed at d (a
    # probability that underflowed to 0 keeps its logarithm finite).
    log_positions = [
        [math.log(max(read[option], 1e-300)) for option in order]
        for read, order in zip(reads, orders, strict=True)
    ]
    log_prior = [
        math.fsum(logs[position] for logs in log_positions) / len(reads)
        for position in range(options)
    ]
    debiased: list[tuple[float, ...]] = []
    for logs, order in zip(log_positions, orders, strict=True):
        by_position = softmax([logs[d] - log_prior[d] for d in range(options)])
        debiased.append(in_option_order(by_position, order))
    return debiased
