"""Validating the logprobs a read returned, and turning the candidates' logprobs into probabilities.

Fail closed: a candidate missing from a read that could not have held more, a repeated token
id, a token id outside the vocabulary, a non-finite or positive logprob, and candidates whose
probabilities sum past 1 are typed errors. A missing value is never estimated.

The types on the wire (an id is a non-negative JSON integer, a logprob a JSON number) are the
backends' decoders' to check (``typevet_async._backends.wire``); the values' rules are here,
one owner each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import attrs

from typevet_async._errors import CandidateMissingError, InvalidLogprobsError, ProtocolError

__all__ = [
    "LOGPROB_SLACK",
    "MASS_SLACK",
    "CandidateRead",
    "TopLogprobs",
    "candidate_mass",
    "clamp_missing",
    "missing_options",
    "off_menu_mass",
    "present_candidates",
    "read_entries",
    "settle_candidates",
    "softmax",
    "validated_entries",
    "validated_logprobs",
]

#: Servers compute log-softmax in float32; the top token of a near-certain distribution can
#: come back a rounding error above zero. Anything larger than this is refused.
LOGPROB_SLACK = 1e-6
#: How far past 1 the candidates' summed probability may come from float32 rounding (a
#: whole-vocabulary read sums to 1 +- 1e-3); anything more is refused.
MASS_SLACK = 1e-3


@attrs.frozen
class TopLogprobs:
    """One read's logprobs by token id, how many entries the server returned, and how many
    were asked for.

    A decoder builds ``logprobs`` in one pass over the entries it decoded (a repeated id keeps
    its last value, and shows as ``len(logprobs) < returned``); ``pairs`` walks the entries
    again, in the order returned, only for a read that fails a check, to name its first
    offender.
    """

    logprobs: dict[int, float]
    returned: int
    requested: int
    pairs: Callable[[], Iterable[tuple[int, float]]] = attrs.field(eq=False, repr=False)

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[int, float]], requested: int) -> TopLogprobs:
        """From (token id, logprob) pairs in the order returned."""
        return cls(dict(pairs), len(pairs), requested, lambda: pairs)


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
    #: How many options ``clamp`` filled in (``truncated``: at least one).
    clamped: int = 0
    #: HTTP attempts, retries of transient failures included (at least ``reads``).
    attempts: int = 1
    #: The endpoint that answered, in a session over several (None: the only one).
    endpoint: str | None = None
    #: A two-token code question's reads after each of its distinct first tokens, in order
    #: (`typevet_async._core.prompts.codes`); this read is then the first one, and the counts above
    #: (reads, tokens, attempts) are the whole question's.
    after: tuple[CandidateRead, ...] = ()
    #: The session's read cache's outcome (`typevet_async._session.read_cache`): ``"hit"`` (stored,
    # or
    #: shared with the same read in flight: nothing was sent, every count above is 0),
    #: ``"miss"`` (read from the server, then stored); None: the session has no cache.
    cache: Literal["hit", "miss"] | None = None


def validated_logprobs(
    top: TopLogprobs, *, allow_positive: bool = False, vocab_size: int | None = None
) -> dict[int, float]:
    """The read's logprobs by token id; a repeated id, an id not below ``vocab_size`` (when it
    is known), a non-finite value or a positive logprob is refused.

    The one check of a read's entries, whichever backend returned them (`_all_valid`).
    """
    if not _all_valid(top.logprobs, top.returned, allow_positive, vocab_size):
        _refuse_first(top.pairs(), allow_positive, vocab_size)
    return top.logprobs


def validated_entries(
    entries: Sequence[tuple[int, float]],
    *,
    allow_positive: bool = False,
    vocab_size: int | None = None,
) -> dict[int, float]:
    """`validated_logprobs` of (token id, logprob) pairs in the order returned."""
    logprobs = dict(entries)
    if not _all_valid(logprobs, len(entries), allow_positive, vocab_size):
        _refuse_first(entries, allow_positive, vocab_size)
    return logprobs


def _all_valid(
    logprobs: dict[int, float], returned: int, allow_positive: bool, vocab_size: int | None
) -> bool:
    """Every entry passes (no id twice, every id below the vocabulary, every value finite and
    at most `LOGPROB_SLACK`). The checks run as builtins over the whole read (a default read
    holds 64 entries or more, on the hot path); only a read that fails one is walked entry by entry
    (`_refuse_first`), to name the first offender."""
    values = logprobs.values()
    return not (
        len(logprobs) != returned
        or (vocab_size is not None and logprobs and max(logprobs) >= vocab_size)
        or not all(map(math.isfinite, values))
        or (not allow_positive and values and max(values) > LOGPROB_SLACK)
    )


def _refuse_first(
    entries: Iterable[tuple[int, float]], allow_positive: bool, vocab_size: int | None
) -> None:
    seen: set[int] = set()
    for token_id, logprob in entries:
        if token_id in seen:
            raise InvalidLogprobsError(f"token id {token_id} appears twice in one read")
        if vocab_size is not None and token_id >= vocab_size:
            raise InvalidLogprobsError(
                f"token id {token_id} is outside the vocabulary of {vocab_size} tokens"
            )
        if not math.isfinite(logprob):
            raise InvalidLogprobsError(f"token id {token_id} has a non-finite logprob {logprob!r}")
        if logprob > LOGPROB_SLACK and not allow_positive:
            raise InvalidLogprobsError(f"token id {token_id} has a positive logprob {logprob!r}")
        seen.add(token_id)
    raise AssertionError("unreachable: a check above failed")


def read_entries(top: TopLogprobs, vocab_size: int) -> dict[int, float]:
    """A top-K read's entries by token id, once it has the entries asked for and each is valid.

    :raises ProtocolError: the read has another number of entries than was asked for.
    :raises InvalidLogprobsError: a repeated id, an id outside the vocabulary, a non-finite
        or a positive logprob.
    """
    expected = min(top.requested, vocab_size)
    if top.returned != expected:
        raise ProtocolError(
            f"asked for the top {top.requested} logprobs, the server returned {top.returned}"
        )
    return validated_logprobs(top, vocab_size=vocab_size)


def missing_options(
    logprobs: Mapping[int, float], groups: Sequence[Sequence[int]]
) -> list[tuple[int, ...]]:
    """The options none of whose accepted tokens was read (an option may accept several:
    Jev's ``A`` and ``" A"``); empty when every option has a value.

    This is the one rule for a missing candidate. An option's value is the maximum over its
    tokens, and a token missing from a top-K read is below every token read, so an option with
    one token present needs no larger read for the others.
    """
    missing: list[tuple[int, ...]] = []
    for group in groups:  # loops, not generators: this runs for every read
        for token in group:
            if token in logprobs:
                break
        else:
            missing.append(tuple(group))
    return missing


def present_candidates(
    logprobs: Mapping[int, float], groups: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The options' tokens that were read, in option order, and their logprobs."""
    present = [token for group in groups for token in group if token in logprobs]
    return tuple(present), tuple([logprobs[token] for token in present])


def clamp_missing(
    logprobs: Mapping[int, float], groups: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], tuple[float, ...], bool]:
    """Jev's policy: an option none of whose tokens is in the top-K gets the lowest logprob
    returned, on its control's token. Returns the ids, their logprobs and whether any option
    was filled in (``truncated``).

    :raises InvalidLogprobsError: the read returned nothing at all.
    """
    if not logprobs:
        raise InvalidLogprobsError("the read returned no logprobs to clamp to")
    floor = min(logprobs.values())
    filled = {group[0]: floor for group in missing_options(logprobs, groups)}
    ids, values = present_candidates({**logprobs, **filled}, groups)
    return ids, values, bool(filled)


def settle_candidates(
    entries: Mapping[int, float],
    groups: Sequence[tuple[int, ...]],
    missing: Sequence[tuple[int, ...]],
    policy: str,
    top_k: int,
) -> tuple[tuple[int, ...], tuple[float, ...], bool]:
    """The candidates' ids and logprobs from a top-``top_k`` read's entries under a truncation
    ``policy``, and whether ``clamp`` filled a missing option in (``exact`` escalates before
    it gets here with one missing).

    :raises CandidateMissingError: an option is missing and the policy is ``error``.
    """
    if missing and policy == "error":
        tokens = tuple(token for group in missing for token in group)
        raise CandidateMissingError(
            f"candidate token ids {list(tokens)} are outside the top {top_k} (on_missing='error')",
            missing=tokens,
        )
    if missing:  # clamp
        return clamp_missing(entries, groups)
    ids, logprobs = present_candidates(entries, groups)
    return ids, logprobs, False


def softmax(logprobs: Sequence[float]) -> tuple[float, ...]:
    """Softmax at temperature 1 over the candidates' logprobs (stable: shift by the maximum)."""
    top = max(logprobs)
    weights = [math.exp(value - top) for value in logprobs]
    total = math.fsum(weights)
    return tuple([weight / total for weight in weights])  # a list: no generator to run


def candidate_mass(logprobs: Sequence[float]) -> float:
    """The candidates' summed full-vocabulary probability.

    :raises InvalidLogprobsError: it exceeds 1 by more than `MASS_SLACK`: these cannot be
        full-vocabulary logprobs of distinct tokens.
    """
    mass = math.fsum(map(math.exp, logprobs))
    if mass > 1.0 + MASS_SLACK:
        raise InvalidLogprobsError(
            f"the candidates' probabilities sum to {mass:.6g}, more than 1 + {MASS_SLACK}"
        )
    return mass


def off_menu_mass(logprobs: Sequence[float]) -> float:
    """1 minus the candidates' summed full-vocabulary probability, clamped to [0, 1].

    The clamp only absorbs float32 rounding, up to `MASS_SLACK`; a larger excess is refused.

    :raises InvalidLogprobsError: the candidates' probabilities sum past 1 + `MASS_SLACK`.
    """
    return min(1.0, max(0.0, 1.0 - candidate_mass(logprobs)))
