"""The async session: a facade over one backend that orchestrates and delegates.

It holds the backend (which owns its configuration, HTTP pool and, for the embedded server,
the server's lifecycle), the session's settings, the probe result (read once) and the one
semaphore every read and generation of the session shares. Judgments run through
`typevet_async._judging`, generations through `typevet_async._generating`, batches through
`typevet_async._batch`. Nothing here knows which backend it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import (
    AsyncIterable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, Literal, TypedDict, Unpack, overload

import aiohttp
import anyio

from typevet_async import _connect as connect
from typevet_async._backends.base import Backend
from typevet_async._backends.embedded import ServerOptions
from typevet_async._backends.http import DEFAULT_REQUEST_TIMEOUT
from typevet_async._backends.llama_cpp import OnMissing
from typevet_async._backends.retrying import DEFAULT_MAX_RETRIES
from typevet_async._backends.vllm import LogprobsMode
from typevet_async._batch import BatchStream, Progress, judge_stream
from typevet_async._connect import HttpKeywords
from typevet_async._core.answers import Judgment
from typevet_async._core.calibration import CalibrationMap
from typevet_async._core.generation import Generation
from typevet_async._core.jsonvalues import check_text, render_state
from typevet_async._core.layouts import jev_option_descriptions
from typevet_async._core.probe import Probe, check_requested_model
from typevet_async._core.questions import Question, check_questions, refuse_lookalike_options
from typevet_async._errors import (
    ConfigurationError,
    DeadlineExceededError,
    InvalidInputError,
    SessionStateError,
    TypevetError,
)
from typevet_async._fair_slots import FairSlots
from typevet_async._generating import generate_in_order, generate_settled, plan_generations
from typevet_async._images import Image, check_images
from typevet_async._judging import Planner, judge
from typevet_async._options import (
    UNSET,
    Unset,
)
from typevet_async._settings import (
    BatchOptions,
    GenerationOptions,
    Permutations,
    ReadOptions,
    SessionSettings,
)
from typevet_async._slicing import SLICE

__all__ = ["Session"]


def _checked_prompts(prompts: Any) -> Sequence[str]:
    """``prompts`` as a list once each string in it can be sent (the rest of the checks are
    `plan_generations`'); nothing is sent before this passes."""
    if isinstance(prompts, str):
        raise InvalidInputError("prompts must be a sequence of strings, not one string")
    if not isinstance(prompts, Iterable):
        raise InvalidInputError(
            f"prompts must be a sequence of strings, got {type(prompts).__name__}"
        )
    listed = list(prompts)
    for index, prompt in enumerate(listed):
        if isinstance(prompt, str):
            check_text(prompt, f"prompt {index}")
    return listed


def _refuse_jev_lookalikes(checked: Sequence[tuple[str, Question]]) -> None:
    """The Jev layouts show an option's description in place of its label: two options must
    not read the same there either."""
    for question_id, question in checked:
        refuse_lookalike_options(question_id, question, jev_option_descriptions(question))


class _GenerationKeywords(TypedDict, total=False):
    """The keywords of `Session.generate_many` besides ``schema`` and ``return_exceptions``."""

    images: Image | Sequence[Image]
    max_tokens: int | Unset
    max_in_flight: int | Unset
    timeout: float | None
    model: str | None
    max_retries: int | Unset


@contextlib.contextmanager
def _deadline(timeout: float | None, what: str) -> Iterator[None]:
    """``timeout`` seconds for a whole call; past it, `DeadlineExceededError`. No timeout, no
    cancel scope."""
    if timeout is None:
        yield
        return
    try:
        with anyio.fail_after(timeout):
            yield
    except TypevetError:
        raise  # a RequestTimeoutError is a TimeoutError too: it stays what it is
    except TimeoutError:
        raise DeadlineExceededError(
            f"{what} did not finish within {timeout} s; its requests were cancelled"
        ) from None


class Session:
    """An open connection to one model server, for judgments and schema-bound generations.

    Build one with `Session.llama_cpp`, `Session.vllm`, `Session.local` or `Session.from_env`
    (or from any `Backend` and `SessionSettings`), and use it as an async context manager.
    Every call of the session shares its ``max_concurrency``.
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

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def settings(self) -> SessionSettings:
        return self._settings

    # -- the ways in -------------------------------------------------------------------------

    @classmethod
    def llama_cpp(
        cls,
        base_url: str | Sequence[str] | None,
        *,
        model: str | None = None,
        top_k: int | None = None,
        on_missing: OnMissing = "exact",
        reproducible: bool = False,
        server: ServerOptions | None = None,
        api_key: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        endpoint_slots: int | None = None,
        time_slice: float | None = SLICE,
        **settings: Any,
    ) -> Session:
        """A session on a llama.cpp server at ``base_url`` (None: the embedded ``server``), or
        on several replicas of one model (a list of URLs: see "At scale" in the README).

        ``model``, ``top_k``, ``on_missing``, ``reproducible`` and ``server``: see
        `LlamaCppConfig`. ``reproducible`` reads one question at a time whatever
        ``max_concurrency`` says.

        :param request_timeout: seconds for one HTTP request (waiting for a pooled connection
            excluded).
        :param max_retries: retries of a transient failure (connection errors, timeouts,
            HTTP 408, 429, 5xx), with exponential backoff and jitter, honouring Retry-After;
            0 turns retries off; a call may override it.
        :param trace_configs: aiohttp trace hooks.
        :param time_slice: seconds of the SDK's own CPU work one event-loop iteration may run
            before its reads yield to the loop's other tasks and timers (default 1 ms: an async
            web app's handlers keep running while it judges); None never yields, for a loop
            that runs nothing else (a batch pipeline saves the slices' little CPU).
        :param settings: `SessionSettings` by name (``max_concurrency``, ``layout``, the
            off-menu guard, image caps, ``prefix_reuse``, ``max_tokens``).
        :raises ConfigurationError: an option of the wrong type or value, or an unknown one,
            named.
        """
        http = HttpKeywords(
            api_key, request_timeout, max_retries, trace_configs, endpoint_slots, time_slice
        )
        backend = connect.llama_cpp(
            base_url, http, model=model, top_k=top_k, on_missing=on_missing,
            reproducible=reproducible, server=server,
        )  # fmt: skip
        return cls(backend, SessionSettings.from_keywords(settings))

    @classmethod
    def vllm(
        cls,
        base_url: str | Sequence[str],
        *,
        model: str,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        api_key: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        endpoint_slots: int | None = None,
        time_slice: float | None = SLICE,
        **settings: Any,
    ) -> Session:
        """A session on a vLLM server, pinned to ``model`` (every request names it).

        ``logprobs_mode``: see `VllmConfig`; the rest as in `Session.llama_cpp`.
        """
        http = HttpKeywords(
            api_key, request_timeout, max_retries, trace_configs, endpoint_slots, time_slice
        )
        backend = connect.vllm(base_url, http, model=model, logprobs_mode=logprobs_mode)
        return cls(backend, SessionSettings.from_keywords(settings))

    @classmethod
    def system_one(
        cls,
        base_url: str | Sequence[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        endpoint_slots: int | None = None,
        time_slice: float | None = SLICE,
        **settings: Any,
    ) -> Session:
        """A session on a System One server (``POST /v1/systemone``): ``typevet-async serve``,
        vLLM's for its decision models, the hosted API.

        The server judges: each judgment is one request carrying the state and every question,
        and the answers are rebuilt from the probabilities it returns, after checking them.
        ``judge``, ``judge_many``, the typed answers, errors and retries work as on any
        backend; generation and images are refused unsent; diagnostics are those our own
        gateway sends (none from another server).

        :param base_url: the server's root URL.
        :param model: the model each request names (None: the first ``GET /v1/models``
            lists); checked against that list at the probe.
        :param api_key: sent as ``Authorization: Bearer``.
        :param settings: `SessionSettings` by name (``max_concurrency`` bounds the requests
            in flight).
        :raises ConfigurationError: ``layout``, ``prefix_reuse`` or ``off_menu_threshold``
            given: the server frames and reads the questions, so they could not apply.
        """
        http = HttpKeywords(
            api_key, request_timeout, max_retries, trace_configs, endpoint_slots, time_slice
        )
        backend = connect.system_one(base_url, http, model=model, session_settings=settings)
        return cls(backend, SessionSettings.from_keywords(settings))

    @classmethod
    def local(
        cls, model: str | None = None, *, server: ServerOptions | None = None, **options: Any
    ) -> Session:
        """A session on the embedded llama.cpp server with a local model.

        :param model: a local model's name (``tv.LOCAL_MODELS``): ``"gemma3-270m"`` (small and
            fast, a base model: answers near chance) or ``"qwen2.5-coder-1.5b"`` (a real
            instruction model, the ``qwen`` extra); default: ``TYPEVET_LOCAL_MODEL``, else
            ``"gemma3-270m"``. Assembled into the cache folder on first use.
        :param server: how to start the server (its ``model`` is the one served; not both).

        The server starts when the session opens and stops when it closes. ``options`` are
        those of `Session.llama_cpp`.
        """
        return cls.llama_cpp(None, server=connect.local_server(model, server), **options)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, flags: Mapping[str, Any] | None = None
    ) -> Session:
        """A session configured by ``TYPEVET_*`` variables.

        ``TYPEVET_BACKEND`` (``llama_cpp``, the default, ``vllm`` or ``system_one``),
        ``TYPEVET_BASE_URL`` (unset with llama_cpp: the embedded server; required otherwise),
        ``TYPEVET_MODEL`` (required for vllm), ``TYPEVET_LOCAL_MODEL`` (the embedded server's
        model, by name),
        ``TYPEVET_API_KEY``, ``TYPEVET_MAX_CONCURRENCY``.

        :param environ: the variables (default: ``os.environ``).
        :param flags: a command line's values of the same settings, by name (``backend``,
            ``base_url``, ``local_model``, ``model``, ``api_key``, ``max_concurrency``; None:
            not given): each wins over its variable, and a refusal names the flag with it.
        :raises ConfigurationError: naming the setting that is missing or wrong.
        """
        environ = os.environ if environ is None else environ
        return cls(*connect.from_env(environ, flags))

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

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
        timeout: float | None = None,
        model: str | None = None,
        off_menu_threshold: float | Unset | None = UNSET,
        raise_off_menu: bool | Unset = UNSET,
        max_retries: int | Unset = UNSET,
        permutations: Permutations | Unset = UNSET,
        label_prior: bool | Unset = UNSET,
        calibration: CalibrationMap | Unset | None = UNSET,
    ) -> Judgment:
        """Ask every question about ``state``; answers come back in request order.

        :param state: a string, or any JSON value (rendered as compact JSON).
        :param images: images the questions are about (the server must declare vision).
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
        :raises InvalidInputError: bad questions, state, images, model or option; nothing was
            sent.
        :raises CalibrationError: the map was not fitted for this model, template family,
            server kind, question or reading; nothing was sent.
        :raises UnsupportedTemplateError: the SDK frames prompts and the server's template is
            degraded (its turn markers are not the model's special tokens) or cannot be
            framed.
        :raises DeadlineExceededError: ``timeout`` passed; every read was cancelled.
        :raises BackendError: the first failing question's error, in question order.
        """
        self._require_open()
        check_requested_model(self._backend.model, model)
        checked = check_questions(questions)
        settings = self._settings
        if settings.layout.is_jev:
            _refuse_jev_lookalikes(checked)
        state_text = render_state(state)
        images = check_images(
            images, max_images=settings.max_images, max_bytes=settings.max_image_bytes
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
        )
        return await self._judge_checked(state, state_text, checked, images, options)

    async def _judge_checked(
        self,
        state: Any,
        state_text: str,
        checked: Sequence[tuple[str, Question]],
        images: tuple[Image, ...],
        options: ReadOptions,
    ) -> Judgment:
        """`judge` once its arguments are checked (a batch checks them once, not per record)."""
        arguments = (self._slots.share(), state, state_text, checked, images)
        reuse = self._settings.prefix_reuse
        planner = self._planner  # set with the probe: once probed, no lock and no await
        if planner is not None and options.timeout is None:  # the hot path: no context either
            return await judge(planner, *arguments, reuse, options)
        with _deadline(options.timeout, "the judgment"):
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
        timeout: float | None = None,
        max_retries: int | Unset = UNSET,
        permutations: Permutations | Unset = UNSET,
        label_prior: bool | Unset = UNSET,
        calibration: CalibrationMap | Unset | None = UNSET,
    ) -> BatchStream:
        """Judge every record, streaming `BatchItem`s: an async iterator (`BatchStream`).

        Before the first record it reads the session's probe (once per session); if that
        fails (a wrong model pin, an unreachable server), its error is raised from the first
        ``anext`` and nothing is judged. Then any exception while judging a record becomes
        that record's item and the batch goes on: an SDK error as itself, anything else (a
        bug) as a `BatchRecordError` whose ``__cause__`` it is. An error that would be the
        same for every record (`UnsupportedTemplateError`, `ConfigurationError`,
        `QuestionError`, `SessionStateError`) is raised once instead, and the rest is
        cancelled. An exception raised by ``records`` itself is raised as itself, after the
        items of every record already pulled; so is one from ``on_progress`` (at once).

        Stopping early is safe without ``contextlib.aclosing``: the caller's task is never
        part of the batch's task group. ``aclose()`` cancels the in-flight reads at once;
        without it they are cancelled when the iterator is garbage-collected (in CPython, as
        soon as its last reference goes). A cancelled ``anext`` cancels them too.

        :param records: states, or ``(id, state)`` tuples; any iterable or async iterable
            (not a string, bytes or mapping). Nothing materialises the input: at most
            ``window`` records are pulled ahead.
        :param ordered: yield in input order (default) or as completed.
        :param fail_fast: raise the first error item (in completion order) and cancel the
            rest, instead of yielding it.
        :param max_in_flight: records judged at once (`UNSET`: the session's
            ``max_concurrency``); their reads still share the session's cap.
        :param window: records in flight or waiting to be yielded (`UNSET`: 4 x
            ``max_in_flight``).
        :param on_progress: called with a `Progress` after every record (in the batch's own
            task).
        :param timeout: seconds per record's judgment, and for the probe the batch starts with.
        :param permutations: as `judge`; ``label_prior`` and ``calibration`` likewise (a map
            that does not fit is raised once, from the first ``anext``).
        :raises InvalidInputError: bad questions, options or ``records`` (a string, bytes, a
            mapping, not iterable), at the call (nothing was sent).
        """
        self._require_open(in_loop=False)
        checked = check_questions(questions)
        if self._settings.layout.is_jev:
            _refuse_jev_lookalikes(checked)
        batch = BatchOptions.for_call(
            self._settings,
            max_in_flight=max_in_flight,
            window=window,
            ordered=ordered,
            fail_fast=fail_fast,
            on_progress=on_progress,
        )
        # Checked here, at the call, not at the first record, nor again for every record.
        options = ReadOptions.for_call(
            self._settings,
            off_menu_threshold=UNSET,
            raise_off_menu=UNSET,
            max_retries=max_retries,
            timeout=timeout,
            permutations=permutations,
            label_prior=label_prior,
            calibration=calibration,
        )

        async def probe_once() -> None:
            with _deadline(options.timeout, "the batch's probe"):
                await self.probe()

        async def judge_one(state: Any) -> Judgment:
            self._require_open()
            return await self._judge_checked(state, render_state(state), checked, (), options)

        return judge_stream(
            records,
            judge_one,
            batch,
            ordered=batch.ordered,
            fail_fast=batch.fail_fast,
            on_progress=batch.on_progress,
            prepare=probe_once,
        )

    # -- schema-bound generation ---------------------------------------------------------

    async def generate(
        self,
        prompt: str,
        *,
        schema: Any,
        images: Image | Sequence[Image] = (),
        max_tokens: int | Unset = UNSET,
        timeout: float | None = None,
        model: str | None = None,
        max_retries: int | Unset = UNSET,
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
        [generation] = await self.generate_many(
            [prompt],
            schema=schema,
            images=images,
            max_tokens=max_tokens,
            timeout=timeout,
            model=model,
            max_retries=max_retries,
        )
        return generation

    @overload
    async def generate_many(
        self,
        prompts: Sequence[str],
        *,
        schema: Any,
        return_exceptions: Literal[False] = False,
        **options: Unpack[_GenerationKeywords],
    ) -> list[Generation]: ...

    @overload
    async def generate_many(
        self,
        prompts: Sequence[str],
        *,
        schema: Any,
        return_exceptions: Literal[True],
        **options: Unpack[_GenerationKeywords],
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
            self._backend, self._settings, _checked_prompts(prompts), schema, images, options
        )
        with _deadline(options.timeout, "the generations"):
            await self.probe()
            if options.return_exceptions:
                return await generate_settled(
                    self._backend, self._slots.share(), requests, validator, options
                )
            return await generate_in_order(
                self._backend, self._slots.share(), requests, validator, options
            )
