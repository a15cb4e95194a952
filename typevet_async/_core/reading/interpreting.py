"""From the reads of a question back to its typed answer: validate, softmax, record.

The pure step after the one ``await`` of a read (``typevet_async._session.judging``); its other
side,
from a question to a scoring request, is `typevet_async._core.prompts.scoring`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import attrs

from typevet_async._core.prompts.codes import code_firsts, joint_logprobs
from typevet_async._core.prompts.questions import Question
from typevet_async._core.prompts.rotations import combine_rotations, in_option_order
from typevet_async._core.prompts.scoring import ScoringRequest, after_first
from typevet_async._core.reading.answers import Answer, Diagnostics, build_answer
from typevet_async._core.reading.readings import (
    CandidateRead,
    missing_options,
    off_menu_mass,
    softmax,
    validated_entries,
)
from typevet_async._core.statistics.content_free import ContentFreePrior, divide_prior
from typevet_async._errors import InvalidLogprobsError, OffMenuError

__all__ = ["interpret_read", "settle_question"]


def interpret_read(
    request: ScoringRequest,
    read: CandidateRead,
    *,
    off_menu_threshold: float | None = None,
    raise_off_menu: bool = False,
) -> tuple[Answer, Diagnostics]:
    """Softmax the options' logprobs into the typed answer, and record what it came from.

    An option with variants takes its most probable variant (ties: the control itself).

    :raises OffMenuError: ``raise_off_menu`` and the off-menu mass exceeds the threshold.
    """
    logprob = _checked(request, read)
    candidates = tuple(zip(read.token_ids, read.logprobs, strict=True))
    if request.codes:
        chosen = tuple(first for first, _ in request.codes)
        chosen_logprobs = _code_logprobs(request, read, logprob)
        menu_logprobs = chosen_logprobs
    else:
        chosen = _chosen_tokens(request.option_groups, logprob)
        chosen_logprobs = tuple(logprob[token] for token in chosen)
        menu_logprobs = read.logprobs
    probabilities = softmax(chosen_logprobs)
    if request.order:  # shown rotated: back to option order
        probabilities = in_option_order(probabilities, request.order)
    answer = build_answer(request.question, probabilities)
    # A clamped read's filled-in values are not measurements: its off-menu mass is unknown.
    known = read.off_menu_known and not read.truncated
    off_menu = off_menu_mass(menu_logprobs) if known else None
    flagged = (
        off_menu is not None and off_menu_threshold is not None and (off_menu > off_menu_threshold)
    )
    if flagged and raise_off_menu and off_menu is not None and off_menu_threshold is not None:
        raise OffMenuError(
            f"off-menu mass {off_menu:.4f} exceeds the threshold {off_menu_threshold}",
            off_menu_mass=off_menu,
            threshold=off_menu_threshold,
        )
    diagnostics = Diagnostics(
        prompt=read.prompt or (request.prompt or request.user_text),
        controls=request.controls,
        token_ids=tuple(chosen),
        logprobs=chosen_logprobs,
        off_menu_mass=off_menu,
        top_k=read.top_k,
        reads=read.reads,
        candidates=candidates,
        policy=read.policy,
        truncated=read.truncated,
        clamped=read.clamped,
        off_menu_flagged=flagged,
        attempts=read.attempts,
        endpoint=read.endpoint,
        codes=request.codes,
        cache=read.cache,
    )
    return answer, diagnostics


def _checked(request: ScoringRequest, read: CandidateRead) -> dict[int, float]:
    """The read's logprobs by token id, once it holds only what was asked for, each value
    valid and every option (or, for codes, every first token) present."""
    unexpected = set(read.token_ids) - set(request.read_ids)
    if unexpected:
        raise InvalidLogprobsError(
            f"read returned token ids {sorted(unexpected)} that the request did not ask for"
        )
    candidates = tuple(zip(read.token_ids, read.logprobs, strict=True))
    logprob = validated_entries(candidates, allow_positive=not read.off_menu_known)
    missing = missing_options(logprob, request.option_groups)
    if missing:
        raise InvalidLogprobsError(f"no logprob was read for any of the tokens {list(missing[0])}")
    return logprob


def _chosen_tokens(groups: Sequence[Sequence[int]], logprob: dict[int, float]) -> tuple[int, ...]:
    """Each option's token: its control's, or its most probable variant (ties: the control)."""
    chosen: list[int] = []
    for group in groups:
        if len(group) == 1:  # no variants: the control itself
            chosen.append(group[0])
            continue
        present = [token for token in group if token in logprob]
        chosen.append(max(present, key=lambda token: (logprob[token], -group.index(token))))
    return tuple(chosen)


def _code_logprobs(
    request: ScoringRequest, read: CandidateRead, first: dict[int, float]
) -> tuple[float, ...]:
    """A code question's joint logprobs (`joint_logprobs`): ``read`` is its first read, and
    ``read.after`` the read after each distinct first token, in that order, each checked as
    the read it answers."""
    if not read.off_menu_known:  # with_reads_after: known only if every read's is
        raise InvalidLogprobsError(
            "a two-token code's probability needs normalised logprobs from each of its reads; "
            "this server returned logits, whose normaliser differs from read to read"
        )
    firsts = code_firsts(request.codes)
    if len(read.after) != len(firsts):
        raise InvalidLogprobsError(
            f"a code question needs a read after each of its {len(firsts)} first tokens, "
            f"it has {len(read.after)}"
        )
    after = {
        head: _checked(after_first(request, head), follow)
        for head, follow in zip(firsts, read.after, strict=True)
    }
    return joint_logprobs(request.codes, first, after)


def settle_question(
    question: Question,
    reads: Sequence[tuple[Answer, Diagnostics]],
    orders: Sequence[tuple[int, ...]],
    *,
    label_prior: bool = False,
    prior: ContentFreePrior | None = None,
    calibrate: Callable[[Sequence[float]], tuple[float, ...]] | None = None,
    calibration: str | None = None,
) -> tuple[Answer, Diagnostics]:
    """A question's answer from its reads (one, or one per rotation: `combine_rotations`),
    divided by its content-free ``prior`` (`divide_prior`) when it has one, then through
    ``calibrate`` when a map applies; the diagnostics keep the rotations', the prior (and its
    reads' off-menu mass) and the raw probabilities (before either), and count every read.
    """
    answer, diagnostics = reads[0]
    if len(reads) == 1 and calibrate is None and prior is None:
        return answer, diagnostics
    probabilities = tuple(answer.probabilities.values())  # option order
    rotations: tuple[tuple[float, ...], ...] = ()
    if len(reads) > 1:
        options = len(probabilities)
        rotations = tuple(tuple(read.probabilities.values()) for read, _ in reads)
        probabilities = combine_rotations(
            rotations,
            [order or tuple(range(options)) for order in orders],
            label_prior=label_prior,
        )
    raw = None
    if prior is not None:
        raw, probabilities = probabilities, divide_prior(probabilities, prior.probabilities)
    if calibrate is not None:
        raw, probabilities = raw or probabilities, calibrate(probabilities)
    settled = attrs.evolve(
        diagnostics,
        reads=sum(read.reads for _, read in reads),
        attempts=sum(read.attempts for _, read in reads),
        rotations=rotations,
        raw_probabilities=raw,
        content_free_prior=None if prior is None else prior.probabilities,
        content_free_off_menu_mass=None if prior is None else prior.off_menu_mass,
        calibration=calibration,
        cache=_cache_outcome([read.cache for _, read in reads]),
    )
    return build_answer(question, probabilities), settled


def _cache_outcome(outcomes: Sequence[str | None]) -> Literal["hit", "miss"] | None:
    """A question's cache outcome from its reads': a hit only if every read was one."""
    if outcomes[0] is None:
        return None
    return "hit" if all(outcome == "hit" for outcome in outcomes) else "miss"
