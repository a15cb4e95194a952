"""The async session: a facade over one backend that orchestrates and delegates.

It holds the backend (which owns its configuration, HTTP pool and, for the embedded server,
the server's lifecycle), the session's settings, the probe result (read once) and the one
semaphore every read and generation of the session shares. Judgments run through
`judging`, generations through `generating`, batches through `batch` (this package's
modules). Nothing here knows which backend it holds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Self, Unpack, overload

import anyio

from typevet_async._backends.base import Backend
from typevet_async._concurrency.resources import AsyncResource
from typevet_async._core.generation.records import Generation
from typevet_async._core.prompts.layouts import refuse_jev_lookalikes
from typevet_async._core.prompts.questions import Question, check_questions
from typevet_async._core.reading.answers import Judgment
from typevet_async._core.reading.batch_records import Progress
from typevet_async._core.reading.probe import Probe, check_requested_model
from typevet_async._core.statistics.batch_judgments import BatchCalibration, alone
from typevet_async._core.statistics.calibration import CalibrationMap
from typevet_async._core.statistics.fitted_prior import FittedPrior
from typevet_async._core.statistics.read_plan import ReadPlan
from typevet_async._core.wires.jsonvalues import render_state
from typevet_async._errors import ConfigurationError, SessionStateError, TypevetError
from typevet_async._options import UNSET, Unset, check_argument, optional, positive_number
from typevet_async._session import configuration as keywords
from typevet_async._session.batch import BatchStream, judge_stream
from typevet_async._session.coalescing import Coalescer, batch_options
from typevet_async._session.connect import connect, from_env, local_server
from typevet_async._session.deadlines import call_deadline
from typevet_async._session.fair_slots import FairSlots
from typevet_async._session.generating import (
    checked_prompts,
    generate_in_order,
    generate_settled,
    plan_generations,
)
from typevet_async._session.images import NO_IMAGES, Image, JudgmentImages, check_judgment_images
from typevet_async._session.judging import (
    judge,
    question_readings,
    refuse_content_free,
    served_pins,
)
from typevet_async._session.planning import Planner
from typevet_async._session.prior_fitting import fitted_prior
from typevet_async._session.settings import (
    BatchOptions,
    GenerateKeywords,
    GenerationKeywords,
    GenerationOptions,
    Permutations,
    ReadOptions,
    SessionSettings,
    refuse_batch_calibration_with,
)

__all__ = ["Session"]


class Session(AsyncResource):
    """An open connection to one model server, for judgments and schema-bound generations.

    Build one with a constructor below (or from any `Backend` and `SessionSettings`), and use
    it as an async context manager. Every call of the session shares its ``max_concurrency``.
    Each keyword is a setting (the configuration guide's table): a bad one is named.
    """

    def __init__(self, backend: Backend, settings: SessionSettings | None = None) -> None:
        self._backend = backend
        self._settings = settings if settings is not None else SessionSettings()
        if not isinstance(self._settings, SessionSettings):
            raise ConfigurationError(
                f"settings must be a tv.SessionSettings or None, got {type(settings).__name__}"
            )
        limit = backend.capabilities.max_concurrency
        slots = self._settings.max_concurrency
        # Shared fairly between the judgments that wait (round-robin, `FairSlots`); built on
        # asyncio futures, uncontended as cheap as asyncio's own semaphore, which the hot path
        # needs (every read takes a slot).
        self._slots = FairSlots(slots if limit is None else min(slots, limit))
        self._state: Literal["unopened", "open", "closed"] = "unopened"
        #: The event loop the session was opened in: its pool and tasks belong to that loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probe: Probe | None = None
        self._planner: Planner | None = None
        self._probe_lock = anyio.Lock(fast_acquire=True)

    def __repr__(self) -> str:
        return (
            f"Session({self._backend!r}, max_concurrency={self._settings.max_concurrency}, "
            f"state={self._state!r})"
        )

    @classmethod
    def llama_cpp(
        cls, base_url: keywords.URLs | None, **options: Unpack[keywords.LlamaCpp]
    ) -> Self:
        """A session on a llama.cpp server, replicas of one (a list), or None: the embedded."""
        return cls(*connect("llama_cpp", base_url, options))

    @classmethod
    def vllm(cls, base_url: keywords.URLs, **options: Unpack[keywords.Vllm]) -> Self:
        """A session on a vLLM server, pinned to ``model`` (every request names it)."""
        return cls(*connect("vllm", base_url, options))

    @classmethod
    def openai_compatible(cls, base_url: keywords.URLs, **options: Unpack[keywords.Chat]) -> Self:
        """A session on any OpenAI-compatible server's API base that returns ``logprobs``."""
        return cls(*connect("openai_compatible", base_url, options))

    @classmethod
    def system_one(cls, base_url: keywords.URLs, **options: Unpack[keywords.SystemOne]) -> Self:
        """A session on a System One server (``POST /v1/systemone``), which judges itself."""
        return cls(*connect("system_one", base_url, options))

    @classmethod
    def openai_decisions(cls, base_url: keywords.URLs, **options: Unpack[keywords.Remote]) -> Self:
        """A session on a server of OpenAI's Decisions API (``POST /v1/decisions``)."""
        return cls(*connect("openai_decisions", base_url, options))

    @classmethod
    def local(cls, model: str | None = None, **options: Unpack[keywords.Local]) -> Self:
        """A session on the embedded llama.cpp server with a local model (``LOCAL_MODELS``)."""
        server = local_server(model, options.pop("server", None))
        return cls(*connect("llama_cpp", None, {**options, "server": server}))

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, flags: keywords.Flags = None, **more: Any
    ) -> Self:
        """A session the ``TYPEVET_*`` variables (default: ``os.environ``), each overridden by
        its ``flags`` value (by name; None: not given), and Python-only settings describe."""
        return cls(*from_env(os.environ if environ is None else environ, flags, more))

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def settings(self) -> SessionSettings:
        return self._settings

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        """Open the backend (its pool; the embedded server, if any). Safe to call twice."""
        if self._state == "closed":
            raise SessionStateError("cannot reopen a closed session")
        if self._state == "open":
            self._require_open()  # opened in this loop, not another
            return
        await self._backend.open()
        self._loop = asyncio.get_running_loop()
        self._state = "open"

    async def aclose(self) -> None:
        """Close the backend. Safe to call twice."""
        if self._state == "closed":
            return
        self._state = "closed"
        with anyio.CancelScope(shield=True):
            await self._backend.aclose()

    def _require_open(self, *, in_loop: bool = True) -> None:
        """:raises SessionStateError: the session is not open, or was opened in another event
        loop (its connections belong to that one). ``in_loop=False``: the caller may be outside
        any loop (`judge_many` builds its stream synchronously; each record checks again)."""
        if self._state != "open":
            raise SessionStateError(f"the session is {self._state}; use 'async with' to open it")
        try:
            loop = asyncio.get_running_loop()  # one C call: cheap enough for every call
        except RuntimeError:
            if in_loop:
                raise
            return
        if loop is not self._loop:
            raise SessionStateError(
                "the session was opened in another event loop (each asyncio.run starts a new "
                "one); open and use a session inside one event loop"
            )

    async def probe(self) -> Probe:
        """The served template's family, the controls' token ids and the vocabulary size.

        Read once per session, however many calls start at the same moment.
        """
        self._require_open()
        if self._probe is not None:  # read once: no lock after that
            return self._probe
        async with self._probe_lock:
            if self._probe is None:
                probe = await self._backend.probe()
                self._planner = Planner(self._backend, probe, self._settings)
                self._probe = probe
            return self._probe

    async def read_plan(
        self,
        questions: Mapping[str, Question],
        *,
        permutations: Permutations | Unset = UNSET,
        label_prior: bool | Unset = UNSET,
        calibration: CalibrationMap | Unset | None = UNSET,
        prior: FittedPrior | Unset | None = UNSET,
    ) -> ReadPlan:
        """How `judge` reads ``questions`` under these options (as `judge` takes them), and
        what a calibration map or prior fitted on those reads is pinned to. Probes the server (once
        per session); reads nothing.

        :raises QuestionError: bad questions, or options they cannot be read under.
        :raises ConfigurationError: an option of the wrong type or value.
        """
        checked = self._checked_questions(questions)
        options = ReadOptions.for_call(
            self._settings,
            off_menu_threshold=UNSET,
            raise_off_menu=UNSET,
            permutations=permutations,
            label_prior=label_prior,
            calibration=calibration,
            prior=prior,
        )
        readings = question_readings(checked, options, self._settings)
        probe = await self.probe()
        pins = served_pins(self._backend, probe, checked, self._settings)
        return ReadPlan(
            readings,
            pins,
            options.permutations,
            options.label_prior,
            options.calibration,
            options.prior,
        )

    async def _ready_planner(self) -> tuple[Probe, Planner]:
        probe = await self.probe()
        assert self._planner is not None  # set with the probe
        return probe, self._planner

    # -- judging -------------------------------------------------------------------------

    async def judge(
        self,
        state: Any,
        questions: Mapping[str, Question],
        *,
        images: Image | Sequence[Image] = (),
        question_images: Mapping[str, Image | Sequence[Image]] | None = None,
        timeout: float | None = None,
        model: str | None = None,
        off_menu_threshold: float | Unset | None = UNSET,
        raise_off_menu: bool | Unset = UNSET,
        max_retries: int | Unset = UNSET,
        permutations: Permutations | Unset = UNSET,
        label_prior: bool | Unset = UNSET,
        calibration: CalibrationMap | Unset | None = UNSET,
        prior: FittedPrior | Unset | None = UNSET,
    ) -> Judgment:
        """Ask every question about ``state``; answers come back in request order.

        :param state: a string, or any JSON value (rendered as compact JSON).
        :param images: images the questions are about (the server must declare vision),
            shown before the state in every question's reads.
        :param question_images: a question's own images, by question id: shown after the
            state, just before its instructions, in that question's reads only. Together
            with ``images`` at most the session's ``max_images``.
        :param timeout: seconds for the whole judgment, probe included (None: no deadline).
        :param model: if given, must be the session's pinned model.
        :param off_menu_threshold: overrides the session's for this judgment (None: off);
            ``raise_off_menu`` and ``max_retries`` likewise (`UNSET`: the session's).
        :param permutations: read each question under this many cyclic rotations of its
            options (at most one per option; a mapping: by question id, others 1) and average
            them; ``label_prior`` divides out the positions' prior first (`UNSET`: the
            session's). Each rotation is a read.
        :param calibration: a `CalibrationMap` for these answers (None: none; `UNSET`: the
            session's); the diagnostics keep the raw probabilities.
        :param prior: a `FittedPrior` (`fit_prior`) divided out of these answers (None: none;
            `UNSET`: the session's); the diagnostics keep the raw probabilities and the prior.
            Not with a calibration map, nor on a question ``content_free`` divides.
        :raises InvalidInputError: bad questions, state, images, model or option; nothing was
            sent.
        :raises CalibrationError: the map (or prior) was not fitted for this model, template
            family, server kind, prompt framing, question or reading; nothing was sent.
        :raises UnsupportedTemplateError: the SDK frames prompts and the server's template is
            degraded (its turn markers are not the model's special tokens) or cannot be
            framed.
        :raises DeadlineExceededError: ``timeout`` passed; every read was cancelled.
        :raises BackendError: the first failing question's error, in question order.

        Under ``batch_calibration`` a judgment is a batch of one, left as read (its
        diagnostics' ``batch_prior_skipped`` says so): `judge_many` divides a batch.
        """
        self._require_open()
        check_requested_model(self._backend.model, model)
        checked = self._checked_questions(questions)
        settings = self._settings
        state_text = render_state(state)
        shown = check_judgment_images(
            images,
            question_images,
            checked,
            max_images=settings.max_images,
            max_bytes=settings.max_image_bytes,
        )
        options = ReadOptions.for_call(
            settings,
            off_menu_threshold=off_menu_threshold,
            raise_off_menu=raise_off_menu,
            max_retries=max_retries,
            timeout=timeout,
            permutations=permutations,
            label_prior=label_prior,
            calibration=calibration,
            prior=prior,
        )
        judgment = await self._judge_checked(state, state_text, checked, shown, options)
        return judgment if settings.batch_calibration == "off" else alone(judgment)

    async def _judge_checked(
        self,
        state: Any,
        state_text: str,
        checked: Sequence[tuple[str, Question]],
        images: JudgmentImages,
        options: ReadOptions,
    ) -> Judgment:
        """`judge` once its arguments are checked (a batch checks them once, not per record)."""
        arguments = (self._slots.share(), state, state_text, checked, images)
        reuse = self._settings.prefix_reuse
        planner = self._planner  # set with the probe: once probed, no lock and no await
        if planner is not None and options.timeout is None:  # the hot path: no context either
            return await judge(planner, *arguments, reuse, options)
        with call_deadline(options.timeout, "the judgment"):
            _, planner = await self._ready_planner()
            return await judge(planner, *arguments, reuse, options)

    def judge_many(
        self,
        records: Iterable[Any] | AsyncIterable[Any],
        questions: Mapping[str, Question],
        *,
        ordered: bool = True,
        fail_fast: bool = False,
        max_in_flight: int | Unset = UNSET,
        window: int | Unset = UNSET,
        on_progress: Callable[[Progress], None] | None = None,
        record_timeout: float | None = None,
        model: str | None = None,
        off_menu_threshold: float | Unset | None = UNSET,
        raise_off_menu: bool | Unset = UNSET,
        max_retries: int | Unset = UNSET,
        permutations: Permutations | Unset = UNSET,
        label_prior: bool | Unset = UNSET,
        calibration: CalibrationMap | Unset | None = UNSET,
        batch_calibration: BatchCalibration | bool | Unset = UNSET,
        prior: FittedPrior | Unset | None = UNSET,
    ) -> BatchStream:
        """Judge every record, streaming `BatchItem`s: an async iterator (`BatchStream`).

        The session's probe is read before the first record; its error (a wrong model pin, an
        unreachable server) is raised from the first ``anext``. A record's exception becomes
        its item and the batch goes on (an SDK error as itself, a bug as a `BatchRecordError`);
        an error the same for every record (the template, the configuration, the
        questions, the session's state) is raised once and the rest cancelled; so is an error
        of ``records`` itself (after the items already pulled) or of ``on_progress``.
        Stopping early is safe without ``aclosing``: ``aclose()``, garbage collection or a
        cancelled ``anext`` cancel the reads in flight (see the batch guide).

        :param records: states, or ``(id, state)`` tuples; any iterable or async iterable
            (not a string, bytes or mapping). Nothing materialises the input: at most
            ``window`` records are pulled ahead.
        :param ordered: yield in input order (default) or as completed.
        :param fail_fast: raise the first error item (in completion order) and cancel the
            rest, instead of yielding it.
        :param max_in_flight: records judged at once (`UNSET`: the session's
            ``max_concurrency``, or a System One server's batch cap if larger: records are
            then sent in batch requests, see the System One guide); their reads (requests)
            still share the session's cap.
        :param window: records in flight or waiting to be yielded (`UNSET`: 4 x
            ``max_in_flight``).
        :param on_progress: called with a `Progress` after every record (in the batch's own
            task).
        :param record_timeout: seconds for each record's judgment, and for the probe the
            batch starts with (None: no deadline).
        :param model: as `judge` (checked once, at the call); so are ``off_menu_threshold``,
            ``raise_off_menu``, ``max_retries``, ``permutations``, ``label_prior``,
            ``calibration`` and ``prior`` (a map or prior that does not fit is raised once,
            from the first ``anext``).
        :param batch_calibration: ``"on"``: divide each question's batch prior out of its
            answers (`UNSET`: the session's ``batch_calibration``; see the batch calibration
            guide). A list or tuple of records (any input with a length) is held until every
            record is judged, then divided whole; any other input holds its first
            ``batch_calibration_window`` records, then divides each later answer by the
            running prior. Error items pass through untouched and count for nothing.
        :raises InvalidInputError: bad questions, options or ``records`` (a string, bytes, a
            mapping, not iterable), at the call (nothing was sent).
        :raises ConfigurationError: batch calibration with ``content_free`` or a calibration
            map, or on a session whose server judges (System One, Decisions), at the call.
        """
        self._require_open(in_loop=False)
        check_requested_model(self._backend.model, model)
        checked = self._checked_questions(questions)
        batch = BatchOptions.for_call(
            self._settings,
            max_in_flight=max_in_flight,
            window=window,
            ordered=ordered,
            fail_fast=fail_fast,
            on_progress=on_progress,
            batch_calibration=batch_calibration,
        )
        check_argument("record_timeout", record_timeout, optional(positive_number))
        # Resolved here, at the call, once: not at the first record, nor for every record.
        options = ReadOptions.for_call(
            self._settings,
            off_menu_threshold=off_menu_threshold,
            raise_off_menu=raise_off_menu,
            max_retries=max_retries,
            timeout=record_timeout,
            permutations=permutations,
            label_prior=label_prior,
            calibration=calibration,
            prior=prior,
        )
        self._check_batch_calibration(batch, options)
        given = (max_in_flight is not UNSET, window is not UNSET)
        return self._stream(records, checked, batch, options, given)

    def _check_batch_calibration(self, batch: BatchOptions, options: ReadOptions) -> None:
        """:raises ConfigurationError: batch calibration where it cannot apply: with a
        content-free prior, a calibration map or a fitted prior, or on a session whose server
        judges."""
        refuse_batch_calibration_with(
            batch.batch_calibration, self._settings.content_free, options.calibration, options.prior
        )
        if batch.batch_calibration == "on" and self._backend.capabilities.framing == "remote":
            raise ConfigurationError(
                f"batch_calibration='on' on {type(self._backend).__name__}: its server reads the "
                "questions itself (start a gateway with --batch-calibration to divide its batch "
                "route's answers); nothing was sent"
            )

    async def fit_prior(
        self,
        states: Iterable[Any] | AsyncIterable[Any],
        questions: Mapping[str, Question],
        *,
        max_in_flight: int | Unset = UNSET,
        on_progress: Callable[[Progress], None] | None = None,
        record_timeout: float | None = None,
        max_retries: int | Unset = UNSET,
        permutations: Permutations | Unset = UNSET,
        label_prior: bool | Unset = UNSET,
    ) -> FittedPrior:
        """A prior for ``questions`` fitted on unlabelled ``states`` (batch calibration's, kept
        for later judgments: give it as ``prior=``): each question's mean answer over the
        states, judged as `judge_many` judges them (``states`` as its ``records``) without a
        calibration map, a prior or the off-menu guard, under the session's framing and these
        rotations. A question the states do not vary, or fewer states than its floor
        (`min_batch_items`: 16, or 2 per option if more), gets no prior:
        its entry says why, and its answers are later left as read. Pinned as a map is (model,
        template family, server kind, framing, each question and its reading).

        :raises InvalidInputError: bad questions, options or ``states``; a question the
            session's ``content_free`` divides, or a server that judges itself (nothing sent).
        :raises TypevetError: the first state that failed (the rest are cancelled).
        """
        self._require_open()
        checked = self._checked_questions(questions)
        if self._backend.capabilities.framing == "remote":
            raise ConfigurationError(
                f"{type(self._backend).__name__}'s server reads the questions itself: a prior "
                "is fitted and applied where the SDK reads the logprobs; nothing was sent"
            )
        refuse_content_free(checked, self._settings, "a fitted prior")
        options = ReadOptions.for_call(
            self._settings,
            off_menu_threshold=None,
            raise_off_menu=False,
            permutations=permutations,
            label_prior=label_prior,
            calibration=None,
            prior=None,
        )
        readings = question_readings(checked, options, self._settings)
        with call_deadline(record_timeout, "the prior's probe"):
            probe = await self.probe()
        stream = self.judge_many(
            states,
            questions,
            fail_fast=True,
            max_in_flight=max_in_flight,
            on_progress=on_progress,
            record_timeout=record_timeout,
            max_retries=max_retries,
            off_menu_threshold=None,
            raise_off_menu=False,
            permutations=options.permutations,
            label_prior=options.label_prior,
            calibration=None,
            prior=None,
            batch_calibration="off",  # the prior is fitted on the answers as read
        )
        pins = served_pins(self._backend, probe, checked, self._settings)
        return await fitted_prior(stream, checked, readings, pins)

    def _stream(
        self,
        records: Iterable[Any] | AsyncIterable[Any],
        checked: tuple[tuple[str, Question], ...],
        batch: BatchOptions,
        options: ReadOptions,
        given: tuple[bool, bool],
    ) -> BatchStream:
        """`judge_many`'s stream once its arguments are checked: the probe first (and the
        batch's options for a server that takes batch requests, `_coalescing`), then each
        record judged with the questions and options checked once."""

        async def probe_once() -> BatchOptions:
            with call_deadline(options.timeout, "the batch's probe"):
                await self.probe()
            return batch_options(self._backend, batch, given=given)

        coalescer = Coalescer(
            self._backend,
            self._slots,
            self.probe,
            self._require_open,
            checked,
            options,
            lambda state, o: self._judge_checked(state, render_state(state), checked, NO_IMAGES, o),
        )
        return judge_stream(
            records,
            coalescer.judge,
            batch,
            ordered=batch.ordered,
            fail_fast=batch.fail_fast,
            on_progress=batch.on_progress,
            prepare=probe_once,
            questions=checked if batch.batch_calibration == "on" else None,
        )

    def _checked_questions(
        self, questions: Mapping[str, Question]
    ) -> tuple[tuple[str, Question], ...]:
        """The questions checked, and under a Jev layout no two options that read alike."""
        checked = check_questions(questions)
        if self._settings.layout.is_jev:
            refuse_jev_lookalikes(checked)
        return checked

    # -- schema-bound generation ---------------------------------------------------------

    async def generate(
        self, prompt: str, *, schema: Any, **options: Unpack[GenerateKeywords]
    ) -> Generation:
        """Generate one JSON value that passes ``schema`` (JSON Schema Draft 2020-12).

        The schema is checked before any request; the output is always parsed and validated
        on the client, since server grammars do not enforce every keyword.

        :param max_tokens: the token limit (`UNSET`: the session's ``max_tokens``).
        :raises SchemaError: the schema is malformed or needs a remote document.
        :raises TruncatedOutputError: the token limit cut the output off.
        :raises OutputValidationError: the output does not pass the schema (``.path``,
            ``.value``, ``.raw``).
        :raises GenerationError: empty output, or output that is not JSON.
        :raises DeadlineExceededError: ``timeout`` passed.
        """
        [generation] = await self.generate_many([prompt], schema=schema, **options)
        return generation

    @overload
    async def generate_many(
        self,
        prompts: Sequence[str],
        *,
        schema: Any,
        return_exceptions: Literal[False] = False,
        **options: Unpack[GenerationKeywords],
    ) -> list[Generation]: ...

    @overload
    async def generate_many(
        self,
        prompts: Sequence[str],
        *,
        schema: Any,
        return_exceptions: Literal[True],
        **options: Unpack[GenerationKeywords],
    ) -> list[Generation | TypevetError]: ...

    async def generate_many(
        self,
        prompts: Sequence[str],
        *,
        schema: Any,
        images: Image | Sequence[Image] = (),
        max_tokens: int | Unset = UNSET,
        max_in_flight: int | Unset = UNSET,
        return_exceptions: bool = False,
        timeout: float | None = None,
        model: str | None = None,
        max_retries: int | Unset = UNSET,
    ) -> list[Generation] | list[Generation | TypevetError]:
        """One generation per prompt, in request order, under the session's concurrency cap.

        :param max_in_flight: this call's generations at once (`UNSET`: the session's cap,
            which holds in any case).
        :param return_exceptions: put each failure in its place (its ``prompt_index`` says
            which). Without it the first failure cancels the rest, and the error raised is
            the first in request order among those that failed before they were cancelled.
        """
        self._require_open()
        check_requested_model(self._backend.model, model)
        options = GenerationOptions.for_call(
            self._settings,
            max_tokens=max_tokens,
            max_in_flight=max_in_flight,
            max_retries=max_retries,
            timeout=timeout,
            return_exceptions=return_exceptions,
        )
        requests, validator = plan_generations(
            self._backend, self._settings, checked_prompts(prompts), schema, images, options
        )
        with call_deadline(options.timeout, "the generations"):
            await self.probe()
            if options.return_exceptions:
                return await generate_settled(
                    self._backend, self._slots.share(), requests, validator, options
                )
            return await generate_in_order(
                self._backend, self._slots.share(), requests, validator, options
            )
