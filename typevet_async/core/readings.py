"""Validating the logprobs a read returned, and turning the candidates' logprobs into probabilities.

Fail closed: a candidate missing from a read that could not have held more, a repeated token
id, a non-finite or positive logprob are typed errors. A missing value is never estimated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from typevet_async.errors import InvalidLogprobsError, ProtocolError

__all__ = [
    "LOGPROB_SLACK",
    "CandidateRead",
    "TopLogprobs",
    "clamp_candidates",
    "find_candidates",
    "find_option_candidates",
    "off_menu_mass",
    "read_entries",
    "require_candidates",
    "softmax",
    "validated_entries",
]

#: Servers compute log-softmax in float32; the top token of a near-certain distribution can
#: come back a rounding error above zero. Anything larger than this is refused.
LOGPROB_SLACK = 1e-6


@attrs.frozen
class TopLogprobs:
    """One read's (token id, logprob) pairs in the order returned, and how many were asked for."""

    entries: tuple[tuple[int, float], ...]
    requested: int


@attrs.frozen
class CandidateRead:
    """The candidates' full-vocabulary logprobs, in candidate order, and what the read cost."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_k: int
    reads: int = 1
    prompt_tokens: int = 0
    cached_tokens: int = 0
    #: False when the server returned logits rather than logprobs: the softmax is still exact,
    #: the off-menu mass is not known.
    off_menu_known: bool = True
    #: The text the server scored (the rendered prefix, or the user content on vLLM).
    prompt: str = ""
    policy: str = "exact"
    truncated: bool = False
    #: HTTP attempts, retries of transient failures included (at least ``reads``).
    attempts: int = 1


def validated_entries(
    entries: Sequence[tuple[int, float]], *, allow_positive: bool = False
) -> dict[int, float]:
    """Entries by token id; a repeated id, a non-finite value or a positive logprob is refused."""
    logprobs: dict[int, float] = {}
    for token_id, logprob in entries:
        if token_id in logprobs:
            raise InvalidLogprobsError(f"token id {token_id} appears twice in one read")
        if not math.isfinite(logprob):
            raise InvalidLogprobsError(f"token id {token_id} has a non-finite logprob {logprob!r}")
        if logprob > LOGPROB_SLACK and not allow_positive:
            raise InvalidLogprobsError(f"token id {token_id} has a positive logprob {logprob!r}")
        logprobs[token_id] = logprob
    return logprobs


def read_entries(top: TopLogprobs, vocab_size: int) -> dict[int, float]:
    """A top-K read's entries by token id, once it has the entries asked for and each is valid.

    :raises ProtocolError: the read has another number of entries than was asked for.
    :raises InvalidLogprobsError: a repeated id, a non-finite or a positive logprob.
    """
    expected = min(top.requested, vocab_size)
    if len(top.entries) != expected:
        raise ProtocolError(
            f"asked for the top {top.requested} logprobs, the server returned {len(top.entries)}"
        )
    return validated_entries(top.entries)


def find_option_candidates(
    top: TopLogprobs, groups: Sequence[Sequence[int]], vocab_size: int
) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
    """The ids present in a top-K read and their logprobs, once every option has at least one
    of its accepted tokens there (an option may accept several: Jev's ``A`` and ``" A"``).

    An option's value is the maximum over its tokens; a token missing from the top-K is below
    every token read, so it cannot be that maximum when another of the option's tokens is
    present, and no larger read is needed for it. None: some option has no token in the read.

    :raises ProtocolError: as `read_entries`.
    :raises InvalidLogprobsError: as `read_entries`, or the read already covered the whole
        vocabulary and an option still has no token in it.
    """
    logprobs = read_entries(top, vocab_size)
    if all(any(token in logprobs for token in group) for group in groups):
        present = tuple(token for group in groups for token in group if token in logprobs)
        return present, tuple(logprobs[token] for token in present)
    if top.requested >= vocab_size:
        missing = [t for group in groups if not any(t in logprobs for t in group) for t in group]
        raise InvalidLogprobsError(
            f"candidate token ids {missing} are missing from a whole-vocabulary read"
        )
    return None


def find_candidates(
    top: TopLogprobs, candidate_ids: Sequence[int], vocab_size: int
) -> tuple[float, ...] | None:
    """`find_option_candidates` where every option accepts exactly one token: the candidates'
    logprobs in candidate order; None when a larger read may find the rest."""
    found = find_option_candidates(top, [(token,) for token in candidate_ids], vocab_size)
    return None if found is None else found[1]


def clamp_candidates(
    top: TopLogprobs, candidate_ids: Sequence[int], vocab_size: int
) -> tuple[tuple[float, ...], bool]:
    """Jev's policy: a candidate missing from the top-N gets the lowest logprob returned.

    Returns the logprobs and whether any candidate was filled in (``truncated``).

    :raises ProtocolError: as `read_entries`.
    :raises InvalidLogprobsError: as `read_entries`, or the read returned nothing at all.
    """
    logprobs = read_entries(top, vocab_size)
    if not logprobs:
        raise InvalidLogprobsError("the read returned no logprobs to clamp to")
    floor = min(logprobs.values())
    values = tuple(logprobs.get(token_id, floor) for token_id in candidate_ids)
    return values, any(token_id not in logprobs for token_id in candidate_ids)


def require_candidates(
    entries: Sequence[tuple[int, float]],
    candidate_ids: Sequence[int],
    *,
    allow_positive: bool = False,
) -> tuple[float, ...]:
    """The candidates' values from a read that names them explicitly: all must be there."""
    logprobs = validated_entries(entries, allow_positive=allow_positive)
    missing = [token_id for token_id in candidate_ids if token_id not in logprobs]
    if missing:
        raise InvalidLogprobsError(f"candidate token ids {missing} are missing from the read")
    return tuple(logprobs[token_id] for token_id in candidate_ids)


def softmax(logprobs: Sequence[float]) -> tuple[float, ...]:
    """Softmax at temperature 1 over the candidates' logprobs (stable: shift by the maximum)."""
    top = max(logprobs)
    weights = [math.exp(value - top) for value in logprobs]
    total = math.fsum(weights)
    return tuple(weight / total for weight in weights)


def off_menu_mass(logprobs: Sequence[float]) -> float:
    """1 minus the candidates' summed full-vocabulary probability, clamped to [0, 1].

    The clamp only absorbs float32 rounding (a whole-vocabulary read sums to 1 +- 1e-3).
    """
    return min(1.0, max(0.0, 1.0 - math.fsum(math.exp(value) for value in logprobs)))
