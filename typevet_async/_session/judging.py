"""The judgment pipeline: plan every question, schedule the reads, interpret, gather in order.
(A backend whose server judges, System One's, is sent the judgment whole: nothing is read here.)

Planning is pure and happens before any request, so bad input fails with nothing sent. The
reads then run as tasks, each holding one slot of the session's semaphore, in the order the
prefix-reuse strategy picks (where the backend declares prefix reuse). The first error in
question order fails the judgment; its sibling reads are cancelled with the task group, so no
task outlives it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

import typevet_async._telemetry as telemetry
from typevet_async._backends.base import Backend, RemoteJudging
from typevet_async._concurrency.fanout import gather_in_order
from typevet_async._core.prompts.codes import code_firsts, with_reads_after
from typevet_async._core.prompts.controls import reads_in_one_order
from typevet_async._core.prompts.fields import framing_pin
from typevet_async._core.prompts.questions import Question
from typevet_async._core.prompts.scoring import ScoringRequest, after_first
from typevet_async._core.reading.answers import Answer, Diagnostics, Judgment, Usage
from typevet_async._core.reading.interpreting import interpret_read, settle_question
from typevet_async._core.reading.probe import Probe, model_identity
from typevet_async._core.reading.readings import CandidateRead
from typevet_async._core.statistics.calibration import (
    Pins,
    Reading,
    question_set_hash,
)
from typevet_async._core.statistics.content_free import ContentFreePrior, content_free_applies
from typevet_async._core.statistics.fitted_prior import FittedPrior
from typevet_async._errors import (
    ConfigurationError,
    InvalidInputError,
    OffMenuError,
    QuestionError,
    TypevetError,
)
from typevet_async._session.fair_slots import SlotShare
from typevet_async._session.images import NO_IMAGES, JudgmentImages
from typevet_async._session.planning import Planner
from typevet_async._session.priors import Answered, content_free_priors
from typevet_async._session.read_cache import CachedReads
from typevet_async._session.settings import PrefixReuse, ReadOptions, SessionSettings

__all__ = ["Planner", "judge", "read_judgment"]


@attrs.frozen
class _Scored:
    answer: Answer
    diagnostics: Diagnostics
    usage: Usage


def question_readings(
    questions: Sequence[tuple[str, Question]],
    options: ReadOptions,
    settings: SessionSettings | None = None,
) -> dict[str, Reading]:
    """How each question is read under ``options``' permutations and label prior (a question
    that ``settings`` answer in their one order, a words Noul or a scale Score, once:
    `reads_in_one_order`).

    :raises QuestionError: a count for a question the judgment does not ask, or the label
        prior for a question read under some but not all of its rotations.
    """
    permutations = options.permutations
    if isinstance(permutations, Mapping):
        unknown = sorted(set(permutations) - {question_id for question_id, _ in questions})
        if unknown:
            raise QuestionError(
                f"permutations names question(s) {unknown} that this judgment does not ask"
            )
    readings: dict[str, Reading] = {}
    for question_id, question in questions:
        one_order = settings is not None and reads_in_one_order(
            question, settings.noul_controls, settings.score_controls, jev=settings.layout.is_jev
        )
        if one_order:
            readings[question_id] = Reading()
            continue
        options_count = len(question.options())
        wanted = (
            permutations.get(question_id, 1) if isinstance(permutations, Mapping) else permutations
        )
        rotations = min(wanted, options_count)
        prior = options.label_prior and rotations > 1
        if prior and rotations < options_count:
            error = QuestionError(
                f"label_prior needs all {options_count} rotations of the options, "
                f"permutations gives {rotations}"
            )
            error.question_id = question_id
            raise error
        readings[question_id] = Reading(rotations, prior)
    return readings


def check_fitted(
    planner: Planner,
    questions: Sequence[tuple[str, Question]],
    readings: Mapping[str, Reading],
    options: ReadOptions,
) -> None:
    """The call's artefacts fitted on reads (``options``' calibration map, its fitted prior)
    checked against this judgment's own pins.

    :raises ConfigurationError: the session's content-free calibration divides a question a
        fitted prior would divide too (nothing sent).
    :raises CalibrationError: a map or prior was not fitted for this judgment (nothing sent).
    """
    served = served_pins(planner.backend, planner.probe, questions, planner.settings)
    for artefact in (options.calibration, options.prior):
        if artefact is None:
            continue
        if isinstance(artefact, FittedPrior):
            refuse_content_free(questions, planner.settings, "a fitted prior")
        artefact.check(served, questions, readings)


def refuse_content_free(
    questions: Sequence[tuple[str, Question]], settings: SessionSettings, what: str
) -> None:
    """A batch prior (``what``: fitted, or fitted on the batch) is not divided out of a
    question the content-free prior divides: both estimate the same lean, and the second would
    divide it out again.

    :raises ConfigurationError: the first such question, named.
    """
    for question_id, question in questions:
        if content_free_applies(question, settings.content_free):
            error = ConfigurationError(
                f"{what} and content_free={settings.content_free!r} would both divide this "
                "question's lean out; use one (a session without content_free, or no prior)"
            )
            error.question_id = question_id
            raise error


def served_pins(
    backend: Backend,
    probe: Probe,
    questions: Sequence[tuple[str, Question]],
    settings: SessionSettings,
) -> Pins:
    """What a map fitted on this backend's reads of ``questions`` (framed under ``settings``)
    is pinned to, and what a judgment's map must match."""
    return Pins(
        question_set_hash(questions),
        model_identity(backend.model, probe.model_ids),
        probe.family.value,
        backend.capabilities.server,
        framing_pin(
            settings.layout.value,
            settings.controls,
            settings.noul_controls,
            settings.score_controls,
            settings.content_free,
        ),
    )


def judge(
    planner: Planner,
    slots: SlotShare,
    state: Any,
    state_text: str,
    questions: Sequence[tuple[str, Question]],
    images: JudgmentImages,
    strategy: PrefixReuse,
    options: ReadOptions,
) -> Awaitable[Judgment]:
    """One judgment of checked questions about a checked state (``state`` as the caller gave
    it, ``state_text`` as the SDK renders it): planned and read here, or, for a backend whose
    server judges (``framing="remote"``), sent whole under one slot. Under telemetry
    (`typevet_async._telemetry`), in a ``typevet.judge`` span."""
    arguments = (planner, slots, state, state_text, questions, images, strategy, options)
    # A plain function that hands back the coroutine to await: the hot path (no telemetry)
    # costs one check and no coroutine layer of its own.
    if not telemetry.observing():
        return _judge(*arguments)
    return _observed_judge(
        planner, len(questions), state_text, functools.partial(_judge, *arguments)
    )


async def _observed_judge(
    planner: Planner, questions: int, state_text: str, judging: Callable[[], Awaitable[Judgment]]
) -> Judgment:
    """``judging`` (`_judge` with its arguments) in a ``typevet.judge`` span; called only
    there, so a call cancelled before it starts leaves no coroutine unawaited."""
    backend = planner.backend
    model = model_identity(backend.model, planner.probe.model_ids)
    with telemetry.judgment_span(backend.capabilities.server, model, questions, state_text) as span:
        judgment = await judging()
        telemetry.judged(span, judgment)
        return judgment


async def _judge(
    planner: Planner,
    slots: SlotShare,
    state: Any,
    state_text: str,
    questions: Sequence[tuple[str, Question]],
    images: JudgmentImages,
    strategy: PrefixReuse,
    options: ReadOptions,
) -> Judgment:
    backend, probe = planner.backend, planner.probe
    if backend.capabilities.framing != "remote":
        readings = None
        fitted = options.calibration is not None or options.prior is not None
        if options.permutations != 1 or fitted:
            readings = question_readings(questions, options, planner.settings)
            if fitted:
                check_fitted(planner, questions, readings, options)
        await planner.learn(state_text, questions)  # the tokenizer's verdicts, if new
        requests = planner.plan(state_text, questions, images, readings)
        priors, spent = await _content_free_priors(planner, slots, questions, strategy, options)
        judgment = await read_judgment(
            backend,
            probe,
            slots,
            requests,
            strategy,
            options,
            readings,
            planner.cached_reads,
            priors,
        )
        if spent == Usage():  # the common case: no prior read (or hit) by this judgment
            return judgment
        return attrs.evolve(judgment, usage=judgment.usage + spent)
    permutations = options.permutations
    rotated = (
        max(permutations.values(), default=1) if isinstance(permutations, Mapping) else permutations
    ) > 1
    if options.calibration is not None or options.prior is not None or rotated:
        raise ConfigurationError(
            f"{type(backend).__name__}'s server reads the questions itself: permutations, "
            "calibration maps and fitted priors apply where the SDK reads the logprobs; "
            "nothing was sent"
        )
    if not isinstance(backend, RemoteJudging):
        raise ConfigurationError(
            f"{type(backend).__name__} declares framing 'remote' but has no judge"
        )
    if images:
        raise InvalidInputError(
            f"{type(backend).__name__} does not send images yet; nothing was sent"
        )
    async with slots:
        return await backend.judge(state, questions, probe, max_retries=options.max_retries)


async def _content_free_priors(
    planner: Planner,
    slots: SlotShare,
    questions: Sequence[tuple[str, Question]],
    strategy: PrefixReuse,
    options: ReadOptions,
) -> tuple[dict[str, ContentFreePrior], Usage]:
    """`content_free_priors`, each state read as this judgment reads its question, under
    `ReadOptions.for_priors` (no map, no off-menu guard)."""
    questions = [q for q in questions if content_free_applies(q[1], planner.settings.content_free)]
    if not questions:
        return {}, Usage()
    unguarded = options.for_priors({question_id for question_id, _ in questions})
    readings = question_readings(questions, unguarded, planner.settings)

    async def answer_to(question_id: str, question: Question, state: str) -> Answered:
        asked = [(question_id, question)]
        await planner.learn(state, asked)
        requests = planner.plan(state, asked, NO_IMAGES, readings)
        judgment = await read_judgment(
            planner.backend,
            planner.probe,
            slots,
            requests,
            strategy,
            unguarded,
            readings,
            planner.cached_reads,
        )
        probabilities = tuple(judgment[question_id].probabilities.values())
        return probabilities, judgment.diagnostics[question_id].off_menu_mass, judgment.usage

    return await content_free_priors(planner.content_free_priors, questions, readings, answer_to)


async def _read_many(
    requests: list[ScoringRequest],
    strategy: PrefixReuse,
    score: Callable[[ScoringRequest], Awaitable[_Scored]],
) -> tuple[list[_Scored], Usage]:
    """Several requests, each read by ``score``, in the order ``strategy`` picks (`_schedule`),
    at once where it allows (`gather_in_order`): their results in request order, and their
    summed usage."""

    async def read_all(batch: list[ScoringRequest], offset: int) -> list[_Scored]:
        return await gather_in_order(
            batch, score, tag=lambda error, i: _name_question(error, requests[offset + i])
        )

    scored = await _schedule(requests, strategy, read_all)
    usage = scored[0].usage if scored else Usage()
    for item in scored[1:]:
        usage += item.usage
    return scored, usage


def _name_question(error: TypevetError, request: ScoringRequest) -> None:
    """An error of a read names its question (unless it already names one)."""
    if error.question_id is None:
        error.question_id = request.question_id


def _score(
    backend: Backend,
    probe: Probe,
    slots: SlotShare,
    request: ScoringRequest,
    options: ReadOptions,
    cached: CachedReads | None = None,
) -> Awaitable[_Scored]:
    """One request read, under one of the session's slots (through ``cached``, the session's
    read cache, if any), and interpreted (under telemetry, in a ``typevet.question`` span):
    the coroutine to await, with no layer of its own on the hot path."""
    if not telemetry.observing():
        return _score_read(backend, probe, slots, request, options, cached)
    scoring = functools.partial(_score_read, backend, probe, slots, request, options, cached)
    return _observed_score(request, scoring)


async def _observed_score(
    request: ScoringRequest, scoring: Callable[[], Awaitable[_Scored]]
) -> _Scored:
    """``scoring`` (`_score_read` with its arguments, for ``request``) in a
    ``typevet.question`` span; called only there, as `_observed_judge`'s."""
    with telemetry.question_span(request) as span:
        try:
            scored = await scoring()
        except OffMenuError:
            telemetry.off_menu_raised(request)
            raise
        telemetry.answered(span, request, scored.diagnostics)
        return scored


async def _score_read(
    backend: Backend,
    probe: Probe,
    slots: SlotShare,
    request: ScoringRequest,
    options: ReadOptions,
    cached: CachedReads | None = None,
) -> _Scored:
    """One request read, under one of the session's slots, and interpreted. With a read
    cache, a stored read (or one shared with the same read in flight) takes no slot."""
    if cached is not None:  # `_read` is what a miss sends
        read = await cached.read(
            request,
            functools.partial(_read, backend, probe, slots, request, options),
            policy=options.max_retries,
        )
        usage = (
            Usage(cache_hits=1)
            if read.cache == "hit"
            else Usage(read.prompt_tokens, read.cached_tokens, read.reads)
        )
    else:  # `_read` inline: the hot path without a cache keeps its cost (no frame more)
        if request.codes:
            read = await _read_codes(backend, probe, slots, request, options)
        else:
            async with slots:
                read = await backend.read(request, probe, max_retries=options.max_retries)
        usage = Usage(read.prompt_tokens, read.cached_tokens, read.reads)
    answer, diagnostics = interpret_read(
        request,
        read,
        off_menu_threshold=options.off_menu_threshold,
        raise_off_menu=options.raise_off_menu,
    )
    return _Scored(answer, diagnostics, usage)


async def _read(
    backend: Backend,
    probe: Probe,
    slots: SlotShare,
    request: ScoringRequest,
    options: ReadOptions,
) -> CandidateRead:
    """A read the cache did not have, made as `_score` makes one without a cache."""
    if request.codes:
        return await _read_codes(backend, probe, slots, request, options)
    async with slots:
        return await backend.read(request, probe, max_retries=options.max_retries)


async def _read_codes(
    backend: Backend,
    probe: Probe,
    slots: SlotShare,
    request: ScoringRequest,
    options: ReadOptions,
) -> CandidateRead:
    """A two-token code question's reads (`typevet_async._core.prompts.codes`): the first tokens at
    the answer position, then the seconds after each first token. Where the server reuses a
    cached prefix, the reads run one after another under one slot (each after-read then only
    evaluates its new tokens); elsewhere the after-reads run at once, a slot each."""

    async def read(one: ScoringRequest) -> CandidateRead:
        return await backend.read(one, probe, max_retries=options.max_retries)

    after = [after_first(request, first) for first in code_firsts(request.codes)]
    if backend.capabilities.prefix_reuse:
        async with slots:
            first = await read(request)
            return with_reads_after(first, [await read(one) for one in after])
    async with slots:
        first = await read(request)

    async def read_under_slot(one: ScoringRequest) -> CandidateRead:
        async with slots:
            return await read(one)

    return with_reads_after(first, await gather_in_order(after, read_under_slot))


def _from_cache(usage: Usage) -> bool:
    """Most of the read's prompt came from the server's cache (so it reuses prefixes)."""
    return usage.cached_tokens * 2 >= usage.prompt_tokens > 0


async def read_judgment(
    backend: Backend,
    probe: Probe,
    slots: SlotShare,
    requests: list[ScoringRequest],
    strategy: PrefixReuse,
    options: ReadOptions,
    readings: Mapping[str, Reading] | None = None,
    cached: CachedReads | None = None,
    priors: Mapping[str, ContentFreePrior] | None = None,
) -> Judgment:
    """Read every request (under ``strategy`` where the backend reuses prefixes; through
    ``cached``, the session's read cache, if any) and gather the answers in request order: a
    question read under rotations is settled from all its reads (`settle_question`), divided
    by its content-free prior (``priors``, by question id), and a calibration map applied or
    a fitted prior divided out."""
    if len(requests) == 1:  # one read (the common case): no closures, schedule or fan-out
        try:
            scored = [await _score(backend, probe, slots, requests[0], options, cached)]
        except TypevetError as error:
            _name_question(error, requests[0])
            raise
        usage = scored[0].usage
    else:  # several reads (or none)
        scored, usage = await _read_many(
            requests,
            strategy if backend.capabilities.prefix_reuse and requests else "off",
            lambda request: _score(backend, probe, slots, request, options, cached),
        )
    if readings is None and options.calibration is None and options.prior is None and not priors:
        return Judgment(
            {r.question_id: s.answer for r, s in zip(requests, scored, strict=True)},
            usage,
            {r.question_id: s.diagnostics for r, s in zip(requests, scored, strict=True)},
        )
    return _settled(requests, scored, usage, options, readings or {}, priors or {})


def _settled(
    requests: Sequence[ScoringRequest],
    scored: Sequence[_Scored],
    usage: Usage,
    options: ReadOptions,
    readings: Mapping[str, Reading],
    priors: Mapping[str, ContentFreePrior],
) -> Judgment:
    grouped: dict[str, list[tuple[ScoringRequest, _Scored]]] = {}
    for request, item in zip(requests, scored, strict=True):
        grouped.setdefault(request.question_id, []).append((request, item))
    calibration = options.calibration
    answers: dict[str, Answer] = {}
    diagnostics: dict[str, Diagnostics] = {}
    for question_id, reads in grouped.items():
        reading = readings.get(question_id, Reading())
        answers[question_id], diagnostics[question_id] = settle_question(
            reads[0][0].question,
            [(item.answer, item.diagnostics) for _, item in reads],
            [request.order for request, _ in reads],
            label_prior=reading.label_prior,
            prior=priors.get(question_id),
            calibrate=None
            if calibration is None
            else functools.partial(calibration.apply, question_id),
            calibration=None if calibration is None else calibration.describe(question_id),
        )
        if options.prior is not None:  # never with a map or a content-free prior (refused)
            answers[question_id], diagnostics[question_id] = options.prior.apply(
                question_id, reads[0][0].question, answers[question_id], diagnostics[question_id]
            )
    return Judgment(answers, usage, diagnostics)


ReadAll = Callable[[list[ScoringRequest], int], Awaitable[list[_Scored]]]


async def _schedule(
    requests: list[ScoringRequest], strategy: PrefixReuse, read_all: ReadAll
) -> list[_Scored]:
    """The reads in the order ``strategy`` picks (``read_all(batch, offset)`` reads a batch
    at once); results in request order."""
    if strategy == "off":
        return await read_all(requests, 0)
    alone = 2 if strategy in ("auto", "sequential") else 1
    scored: list[_Scored] = []
    for index in range(alone):
        scored += await read_all(requests[index : index + 1], index)
    if strategy == "auto":
        strategy = "sequential" if _from_cache(scored[-1].usage) else "first"
    if strategy == "sequential":
        # Each read finds the state in the slot the previous one left it in.
        for index in range(alone, len(requests)):
            scored += await read_all(requests[index : index + 1], index)
    elif len(requests) > alone:
        scored += await read_all(requests[alone:], alone)
    return scored
