"""The async session: one connection pool, the probe result, and bounded concurrent work.

A judgment plans every question before any request (bad input fails with nothing sent), then
reads the questions as tasks in one task group, each holding one slot of the session's
semaphore (in the order the prefix-reuse strategy picks), and gathers the answers in request
order. The first error in question order fails the judgment; its sibling reads are cancelled
with the task group, so no task outlives it. Generations share the same semaphore, and
`Session.judge_many` streams batches through `typevet_async.batch`.
"""

from __future__ import annotations

import os
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, Literal, Protocol

import aiohttp
import anyio
import attrs
import orjson
from jsonschema import Draft202012Validator

from typevet_async.backends.http import HttpClient, RetryPolicy
from typevet_async.backends.llama_cpp import (
    DEFAULT_TOP_K,
    DEFAULT_TOP_N,
    MAX_TOP_N,
    AsyncLlamaCpp,
    OnMissing,
)
from typevet_async.backends.vllm import AsyncVllm, LogprobsMode
from typevet_async.batch import BatchItem, Progress, judge_stream
from typevet_async.core.answers import Answer, Diagnostics, Judgment, Usage
from typevet_async.core.generation import ChatOutput, Generation, build_generation, check_output
from typevet_async.core.layouts import Layout
from typevet_async.core.questions import Choice, Noul, Question, Score
from typevet_async.core.readings import CandidateRead
from typevet_async.core.schemas import MAX_JSON_DEPTH, check_schema, json_depth
from typevet_async.core.scoring import Probe, ScoringRequest, interpret_read, plan_question
from typevet_async.errors import (
    ConfigurationError,
    DeadlineExceededError,
    GenerationError,
    InvalidInputError,
    JudgmentTimeoutError,
    QuestionError,
    SessionStateError,
    TypevetError,
    UnsupportedTemplateError,
)
from typevet_async.fanout import gather_in_order
from typevet_async.images import DEFAULT_MAX_IMAGE_BYTES, Image
from typevet_async.local import LocalServer, ServerOptions

__all__ = ["Backend", "Session"]

DEFAULT_MAX_CONCURRENCY = 4
DEFAULT_READ_TIMEOUT = 120.0
DEFAULT_MAX_TOKENS = 512
DEFAULT_MAX_IMAGES = 8
DEFAULT_MAX_RETRIES = 2

PrefixReuse = Literal["auto", "first", "sequential", "off"]
_Scored = tuple[Answer, Diagnostics, Usage]


class Backend(Protocol):
    """What a session needs from a backend: one probe, scoring reads, generations."""

    #: True when the SDK frames the raw prefix itself; False when the server applies its
    #: own chat template to plain user content.
    frames_prompt: bool
    #: Whether generation may take images.
    accepts_images: bool

    async def probe(self) -> Probe:
        """Classify the served template, find the controls' token ids and the vocabulary size.

        :raises BackendError: the server could not be read.
        """
        ...

    async def read(
        self, request: ScoringRequest, vocab_size: int, *, max_retries: int | None = None
    ) -> CandidateRead:
        """The candidates' full-vocabulary logprobs at the answer position of ``request``.

        :raises BackendError: the read failed, or its logprobs failed validation.
        """
        ...

    async def generate(
        self,
        prompt: str,
        schema: Any,
        images: Sequence[Image],
        max_tokens: int,
        *,
        max_retries: int | None = None,
    ) -> ChatOutput:
        """One schema-bound chat completion, as the server returned it.

        :raises BackendError: the request failed.
        """
        ...


def render_state(state: Any) -> str:
    """A string as it is; any other JSON value as compact JSON."""
    if isinstance(state, str):
        return state
    try:
        return orjson.dumps(state).decode()
    except TypeError as error:
        raise InvalidInputError(f"state must be a string or a JSON value: {error}") from None


def _checked_questions(questions: Any) -> list[tuple[str, Question]]:
    if not isinstance(questions, Mapping) or not questions:
        raise QuestionError("questions must be a non-empty mapping of id to question")
    checked: list[tuple[str, Question]] = []
    for question_id, question in questions.items():
        if not isinstance(question_id, str) or not question_id.strip():
            raise QuestionError(f"question ids must be non-empty strings, got {question_id!r}")
        if not isinstance(question, Noul | Choice | Score):
            error = QuestionError(
                f"expected a Noul, Choice or Score, got {type(question).__name__}"
            )
            error.question_id = question_id
            raise error
        checked.append((question_id, question))
    return checked


def _interpret_output(output: ChatOutput, validator: Draft202012Validator) -> Generation:
    check_output(output)
    try:
        value = orjson.loads(output.content)  # refuses NaN and Infinity, which JSON does not have
    except orjson.JSONDecodeError as error:
        raise GenerationError(f"output is not valid JSON: {error}", raw=output.content) from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise GenerationError(f"output nests deeper than {MAX_JSON_DEPTH}", raw=output.content)
    return build_generation(output, value, validator)


class Unset:
    """The default of a per-call override: fall back to the session's setting."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset()


@attrs.frozen
class _Guard:
    """A judgment's own settings (the session's unless the call overrides them)."""

    threshold: float | None
    raise_error: bool
    max_retries: int | None = None


def _question_id(request: ScoringRequest) -> str:
    return request.question_id


def _from_cache(usage: Usage) -> bool:
    """Most of the read's prompt came from the server's cache (so it reuses prefixes)."""
    return usage.cached_tokens * 2 >= usage.prompt_tokens > 0


def compact_json(value: Any) -> str:
    """Compact JSON as the Jev gateway sends it: no spaces, UTF-8 kept as is."""
    return orjson.dumps(value).decode()


def _retries(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"max_retries must be an integer >= 0, got {value!r}")
    return value


def _threshold(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ConfigurationError(f"off_menu_threshold must be in [0, 1] or None, got {value!r}")
    return float(value)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
    return value


class Session:
    """An open connection to one model server, for judgments.

    Build one with `Session.llama_cpp`, `Session.local` or `Session.from_env`, and use it as
    an async context manager. Every judgment of the session shares its ``max_concurrency``.
    """

    def __init__(
        self,
        backend: Backend,
        http: HttpClient | None = None,
        *,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        model: str | None = None,
        server: LocalServer | None = None,
        layout: Layout | str = Layout.TYPEVET,
        off_menu_threshold: float | None = None,
        raise_off_menu: bool = False,
        max_images: int = DEFAULT_MAX_IMAGES,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
        prefix_reuse: PrefixReuse = "auto",
    ) -> None:
        """Prefer the factories; the settings below are shared by all of them.

        :param layout: ``"typevet"`` (the default framing), or the Jev gateway's ``"fused"``
            or ``"split"``.
        :param off_menu_threshold: flag answers whose off-menu mass exceeds it (and with
            ``raise_off_menu`` raise `OffMenuError`); a judgment may override both.
        :param max_images: most images one judgment may take; ``max_image_bytes`` per image.
        :param prefix_reuse: on llama.cpp, how a judgment's questions share the cached state:
            ``"auto"`` (default) reads the first two alone and goes on one at a time if the
            second came from the server's prompt cache, else reads the rest at once;
            ``"sequential"``, ``"first"`` (first alone, rest at once) and ``"off"`` (all at
            once) force a strategy. The README has the figures.
        """
        self.backend = backend
        self.max_concurrency = _positive_int("max_concurrency", max_concurrency)
        self.model = model
        try:
            self.layout = Layout(layout)
        except ValueError:
            raise ConfigurationError(
                f"layout must be 'typevet', 'fused' or 'split', got {layout!r}"
            ) from None
        self.off_menu_threshold = _threshold(off_menu_threshold)
        self.raise_off_menu = bool(raise_off_menu)
        self.max_images = _positive_int("max_images", max_images)
        self.max_image_bytes = _positive_int("max_image_bytes", max_image_bytes)
        if prefix_reuse not in ("auto", "first", "sequential", "off"):
            raise ConfigurationError(
                f"prefix_reuse must be 'auto', 'first', 'sequential' or 'off', got {prefix_reuse!r}"
            )
        self.prefix_reuse: PrefixReuse = prefix_reuse
        self._http = http
        self._server = server
        self._state = "unopened"
        self._probe: Probe | None = None
        self._probe_lock = anyio.Lock()
        self._slots = anyio.Semaphore(self.max_concurrency)

    def __repr__(self) -> str:
        return (
            f"Session({self.backend!r}, max_concurrency={self.max_concurrency}, "
            f"state={self._state!r})"
        )

    @classmethod
    def llama_cpp(
        cls,
        base_url: str,
        *,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        model: str | None = None,
        api_key: str | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        top_k: int = DEFAULT_TOP_K,
        reproducible: bool = False,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        max_retries: int = DEFAULT_MAX_RETRIES,
        on_missing: OnMissing = "exact",
        top_n: int = DEFAULT_TOP_N,
        _server: LocalServer | None = None,
        **settings: Any,
    ) -> Session:
        """A session on a llama.cpp server.

        :param top_k: logprobs asked for on the first read; a read that misses a candidate
            is repeated with a larger K, up to the whole vocabulary (never estimated).
        :param reproducible: bit-identical answers under the same server: no prompt cache
            and one read at a time (``max_concurrency`` is then 1). See the README for cost.
        :param model: if given, the server must serve a model of that id or alias.
        :param max_retries: retries of a transient failure (connection errors, timeouts,
            HTTP 408, 429, 5xx), with exponential backoff and jitter, honouring Retry-After;
            0 turns retries off; a call may override it.
        :param on_missing: ``"exact"`` (escalate until every candidate is read), ``"clamp"``
            (Jev: read the top ``top_n`` once; a missing candidate gets the lowest logprob
            returned and the answer is flagged ``truncated``) or ``"error"``.
        :param settings: layout, off-menu guard, image caps, prefix reuse: see `Session`.
        """
        if on_missing not in ("exact", "clamp", "error"):
            raise ConfigurationError(
                f"on_missing must be 'exact', 'clamp' or 'error', got {on_missing!r}"
            )
        if not isinstance(top_n, int) or not 1 <= top_n <= MAX_TOP_N:
            raise ConfigurationError(f"top_n must be 1..{MAX_TOP_N}, got {top_n!r}")
        if not isinstance(top_k, int) or top_k < 1:
            raise ConfigurationError(f"top_k must be a positive integer, got {top_k!r}")
        if read_timeout <= 0:
            raise ConfigurationError(f"read_timeout must be positive, got {read_timeout!r}")
        concurrency = 1 if reproducible else _positive_int("max_concurrency", max_concurrency)
        http = HttpClient(
            base_url,
            api_key=api_key,
            read_timeout=read_timeout,
            max_connections=max(concurrency, 1) + 4,
            trace_configs=trace_configs,
            retry=RetryPolicy(max_retries=_retries(max_retries)),
        )
        backend = AsyncLlamaCpp(
            http,
            top_k=top_k,
            cache_prompt=not reproducible,
            on_missing=on_missing,
            top_n=top_n,
        )
        return cls(
            backend, http, max_concurrency=concurrency, model=model, server=_server, **settings
        )

    @classmethod
    def vllm(
        cls,
        base_url: str,
        *,
        model: str,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        api_key: str | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        max_retries: int = DEFAULT_MAX_RETRIES,
        **settings: Any,
    ) -> Session:
        """A session on a vLLM server, pinned to ``model`` (every request names it).

        :param logprobs_mode: the server's ``--logprobs-mode``. With ``raw_logprobs`` (the
            default, and what we recommend) or ``processed_logprobs`` the off-menu mass is
            exact; with a ``*_logits`` mode it is reported as unknown (None).
        """
        if not isinstance(model, str) or not model:
            raise ConfigurationError("a vLLM session needs the served model id: model=...")
        if logprobs_mode not in (
            "raw_logprobs",
            "processed_logprobs",
            "raw_logits",
            "processed_logits",
        ):
            raise ConfigurationError(f"unknown logprobs_mode {logprobs_mode!r}")
        if read_timeout <= 0:
            raise ConfigurationError(f"read_timeout must be positive, got {read_timeout!r}")
        concurrency = _positive_int("max_concurrency", max_concurrency)
        http = HttpClient(
            base_url,
            api_key=api_key,
            read_timeout=read_timeout,
            max_connections=concurrency + 4,
            trace_configs=trace_configs,
            retry=RetryPolicy(max_retries=_retries(max_retries)),
        )
        backend = AsyncVllm(http, model, logprobs_mode=logprobs_mode)
        return cls(backend, http, max_concurrency=concurrency, model=model, **settings)

    @classmethod
    def local(
        cls,
        *,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        server_options: ServerOptions | None = None,
        **settings: Any,
    ) -> Session:
        """A session on the embedded llama.cpp server with the bundled Gemma 3 270M model.

        The server starts when the session opens and stops when it closes.
        ``settings`` are those of `Session.llama_cpp`.
        """
        server = LocalServer(server_options)
        return cls.llama_cpp(
            "http://127.0.0.1", max_concurrency=max_concurrency, _server=server, **settings
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Session:
        """A session configured by ``TYPEVET_*`` variables.

        ``TYPEVET_BACKEND`` (``llama_cpp``, the default, or ``vllm``), ``TYPEVET_BASE_URL``
        (unset with llama_cpp: the embedded server), ``TYPEVET_MODEL`` (required for vllm),
        ``TYPEVET_API_KEY``, ``TYPEVET_MAX_CONCURRENCY``.
        """
        env = os.environ if environ is None else environ
        backend = env.get("TYPEVET_BACKEND", "llama_cpp").strip() or "llama_cpp"
        raw_concurrency = env.get("TYPEVET_MAX_CONCURRENCY", str(DEFAULT_MAX_CONCURRENCY))
        try:
            concurrency = int(raw_concurrency)
        except ValueError:
            raise ConfigurationError(
                f"TYPEVET_MAX_CONCURRENCY must be a positive integer, got {raw_concurrency!r}"
            ) from None
        model = env.get("TYPEVET_MODEL") or None
        api_key = env.get("TYPEVET_API_KEY") or None
        base_url = env.get("TYPEVET_BASE_URL") or None
        if backend == "vllm":
            if base_url is None or model is None:
                raise ConfigurationError(
                    "TYPEVET_BACKEND=vllm needs TYPEVET_BASE_URL and TYPEVET_MODEL"
                )
            return cls.vllm(base_url, model=model, max_concurrency=concurrency, api_key=api_key)
        if backend != "llama_cpp":
            raise ConfigurationError(
                f"TYPEVET_BACKEND must be 'llama_cpp' or 'vllm', got {backend!r}"
            )
        if base_url is None:
            return cls.local(max_concurrency=concurrency, model=model, api_key=api_key)
        return cls.llama_cpp(base_url, max_concurrency=concurrency, model=model, api_key=api_key)

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
        if self._state == "closed":
            raise SessionStateError("cannot reopen a closed session")
        if self._state == "open":
            return
        if self._server is not None and self._http is not None:
            self._http.base_url = await self._server.start()
        if self._http is not None:
            await self._http.open()
        self._state = "open"

    async def aclose(self) -> None:
        """Close the pool and stop the embedded server, if any. Safe to call twice."""
        if self._state == "closed":
            return
        self._state = "closed"
        with anyio.CancelScope(shield=True):
            if self._http is not None:
                await self._http.aclose()
            if self._server is not None:
                await self._server.stop()

    # -- judging -------------------------------------------------------------------------

    async def probe(self) -> Probe:
        """The served template's family, the controls' token ids and the vocabulary size.

        Read once per session, however many judgments start at the same moment.
        """
        self._require_open()
        async with self._probe_lock:
            if self._probe is None:
                probe = await self.backend.probe()
                if self.model is not None and self.model not in probe.model_ids:
                    raise ConfigurationError(
                        f"the session is pinned to model {self.model!r}, the server serves "
                        f"{list(probe.model_ids)!r}"
                    )
                self._probe = probe
            return self._probe

    async def judge(
        self,
        state: Any,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        timeout: float | None = None,
        model: str | None = None,
        off_menu_threshold: float | Unset | None = UNSET,
        raise_off_menu: bool | None = None,
        max_retries: int | None = None,
    ) -> Judgment:
        """Ask every question about ``state``; answers come back in request order.

        :param state: a string, or any JSON value (rendered as compact JSON).
        :param images: images the questions are about (the server must declare vision).
        :param off_menu_threshold: overrides the session's for this judgment (None: off).
        :param max_retries: overrides the session's retries of transient failures.
        :param timeout: seconds for the whole judgment, probe included.
        :param model: if given, must be the session's pinned model.
        :raises InvalidInputError: bad questions, state or model; nothing was sent.
        :raises UnsupportedTemplateError: the server's template is not native Gemma 4 or 3.
        :raises JudgmentTimeoutError: ``timeout`` passed; every read was cancelled.
        :raises BackendError: the first failing question's error, in question order.
        """
        self._require_open()
        self._check_model(model)
        checked = _checked_questions(questions)
        state_text = render_state(state)
        images = self._checked_images(images)
        guard = _Guard(
            self.off_menu_threshold
            if isinstance(off_menu_threshold, Unset)
            else _threshold(off_menu_threshold),
            self.raise_off_menu if raise_off_menu is None else bool(raise_off_menu),
            None if max_retries is None else _retries(max_retries),
        )
        try:
            with anyio.fail_after(timeout):
                return await self._judge(state_text, checked, images, guard)
        except TypevetError:
            raise
        except TimeoutError:
            raise JudgmentTimeoutError(
                f"the judgment did not finish within {timeout} s; its reads were cancelled"
            ) from None

    async def _judge(
        self,
        state_text: str,
        checked: list[tuple[str, Question]],
        images: tuple[Image, ...],
        guard: _Guard,
    ) -> Judgment:
        probe = await self.probe()
        frames = self.backend.frames_prompt
        family = probe.family if frames else None
        if family is not None and not family.is_native:
            raise UnsupportedTemplateError(
                f"the served chat template is {family.value}, not a native Gemma 4 or "
                f"Gemma 3 template; judgments need the model's own turn markers",
                family=family.value,
                rendered=probe.rendered_template,
            )
        if images and not probe.vision:
            raise InvalidInputError(
                "the server does not declare vision (/props modalities); images were refused "
                "before any scoring read"
            )
        requests = [
            plan_question(
                question_id,
                question,
                state_text,
                family=family,
                control_ids=probe.control_ids,
                layout=self.layout,
                encode=compact_json,
                images=images,
                media_marker=probe.media_marker if frames else None,
                max_candidates=probe.max_candidates,
            )
            for question_id, question in checked
        ]

        async def score(request: ScoringRequest) -> _Scored:
            async with self._slots:
                read = await self.backend.read(
                    request, probe.vocab_size, max_retries=guard.max_retries
                )
            answer, diagnostics = interpret_read(
                request,
                read,
                off_menu_threshold=guard.threshold,
                raise_off_menu=guard.raise_error,
            )
            return answer, diagnostics, Usage(read.prompt_tokens, read.cached_tokens, read.reads)

        outcomes = await self._read_all(requests, score, frames)
        answers: dict[str, Answer] = {}
        diagnostics: dict[str, Diagnostics] = {}
        usage = Usage()
        for request, outcome in zip(requests, outcomes, strict=True):
            assert not isinstance(outcome, Exception)  # gather_in_order raised it
            answers[request.question_id], diagnostics[request.question_id], read_usage = outcome
            usage += read_usage
        return Judgment(answers, usage, diagnostics)

    async def _read_all(
        self,
        requests: list[ScoringRequest],
        score: Callable[[ScoringRequest], Awaitable[_Scored]],
        frames: bool,
    ) -> list[_Scored | Exception]:
        """Read a judgment's questions under the prefix-reuse strategy (llama.cpp only)."""
        strategy = self.prefix_reuse if frames and len(requests) > 1 else "off"
        if strategy == "off":
            return await gather_in_order(requests, score, label=_question_id)
        alone = 2 if strategy in ("auto", "sequential") else 1
        outcomes: list[_Scored | Exception] = []
        for request in requests[:alone]:
            outcomes += await gather_in_order([request], score, label=_question_id)
        rest = requests[alone:]
        if strategy == "auto":
            second = outcomes[-1]
            assert not isinstance(second, Exception)
            strategy = "sequential" if _from_cache(second[2]) else "first"
        if strategy == "sequential":
            # Each read finds the state in the slot the previous one left it in.
            for request in rest:
                outcomes += await gather_in_order([request], score, label=_question_id)
        elif rest:
            outcomes += await gather_in_order(rest, score, label=_question_id)
        return outcomes

    def _checked_images(self, images: Sequence[Image]) -> tuple[Image, ...]:
        if isinstance(images, Image):
            images = (images,)
        checked = tuple(images)
        if len(checked) > self.max_images:
            raise InvalidInputError(
                f"{len(checked)} images, but this session takes at most {self.max_images}"
            )
        for image in checked:
            if not isinstance(image, Image):
                raise InvalidInputError(f"images must be tv.Image, got {type(image).__name__}")
            if len(image.data) > self.max_image_bytes:
                raise InvalidInputError(
                    f"an image of {len(image.data)} bytes exceeds this session's "
                    f"{self.max_image_bytes}-byte cap"
                )
        return checked

    # -- streaming batches ----------------------------------------------------------------

    def judge_many(
        self,
        records: Iterable[Any] | AsyncIterable[Any],
        questions: Mapping[str, Question],
        *,
        ordered: bool = True,
        fail_fast: bool = False,
        concurrency: int | None = None,
        window: int | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
    ) -> AsyncIterator[BatchItem]:
        """Judge every record, streaming `BatchItem`s (see `typevet_async.batch`).

        :param records: states, or ``(id, state)`` tuples; any iterable or async iterable.
            Nothing materialises the input: memory stays bounded by ``window``.
        :param ordered: yield in input order (default) or as completed.
        :param fail_fast: raise the first error and cancel the rest, instead of yielding it.
        :param concurrency: judgments in flight (default: the session's cap; reads still
            share the session's cap).
        :param window: records in flight or waiting to be yielded (default 4 x concurrency).
        :param on_progress: called with a `Progress` after every record.
        :param timeout: seconds per record's judgment.
        """
        self._require_open()
        checked = dict(_checked_questions(questions))
        workers = self.max_concurrency if concurrency is None else concurrency
        _positive_int("concurrency", workers)

        async def judge_one(state: Any) -> Judgment:
            return await self.judge(state, checked, timeout=timeout, max_retries=max_retries)

        return judge_stream(
            records,
            judge_one,
            concurrency=workers,
            ordered=ordered,
            fail_fast=fail_fast,
            window=window,
            on_progress=on_progress,
        )

    # -- schema-bound generation ---------------------------------------------------------

    async def generate(
        self,
        prompt: str,
        *,
        schema: Any,
        images: Sequence[Image] = (),
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout: float | None = None,
        model: str | None = None,
        max_retries: int | None = None,
    ) -> Generation:
        """Generate one JSON value that passes ``schema`` (JSON Schema Draft 2020-12).

        The schema is checked before any request; the output is always parsed and validated
        on the client, since server grammars do not enforce every keyword.

        :raises SchemaError: the schema is malformed or needs a remote document.
        :raises TruncatedOutputError: the token limit cut the output off.
        :raises OutputValidationError: the output does not pass the schema (``.path``,
            ``.value``, ``.raw``).
        :raises GenerationError: empty output, or output that is not JSON.
        :raises DeadlineExceededError: ``timeout`` passed.
        """
        results = await self.generate_many(
            [prompt],
            schema=schema,
            images=images,
            max_tokens=max_tokens,
            timeout=timeout,
            model=model,
            max_retries=max_retries,
        )
        result = results[0]
        assert isinstance(result, Generation)
        return result

    async def generate_many(
        self,
        prompts: Sequence[str],
        *,
        schema: Any,
        images: Sequence[Image] = (),
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_concurrency: int | None = None,
        return_exceptions: bool = False,
        timeout: float | None = None,
        model: str | None = None,
        max_retries: int | None = None,
    ) -> list[Generation | TypevetError]:
        """One generation per prompt, in request order, under the session's concurrency cap.

        :param max_concurrency: a lower cap for this call (the session's cap still holds).
        :param return_exceptions: put each failure in its place instead of raising the first
            (in request order) and cancelling the rest.
        """
        self._require_open()
        self._check_model(model)
        validator = check_schema(schema)
        items = self._checked_prompts(prompts, images, max_tokens)
        retries = None if max_retries is None else _retries(max_retries)
        call_slots = anyio.Semaphore(
            _positive_int("max_concurrency", max_concurrency) if max_concurrency else len(items)
        )

        async def one(item: tuple[int, str]) -> Generation:
            async with call_slots, self._slots:
                output = await self.backend.generate(
                    item[1], schema, images, max_tokens, max_retries=retries
                )
            return _interpret_output(output, validator)

        try:
            with anyio.fail_after(timeout):
                await self.probe()
                outcomes = await gather_in_order(
                    items, one, fail_fast=not return_exceptions, label=lambda i: f"prompt {i[0]}"
                )
        except TypevetError:
            raise
        except TimeoutError:
            raise DeadlineExceededError(
                f"the generations did not finish within {timeout} s; their requests were cancelled"
            ) from None
        results: list[Generation | TypevetError] = []
        for outcome in outcomes:
            if isinstance(outcome, Exception) and not isinstance(outcome, TypevetError):
                raise outcome
            results.append(outcome)
        return results

    def _checked_prompts(
        self, prompts: Sequence[str], images: Sequence[Image], max_tokens: int
    ) -> list[tuple[int, str]]:
        if isinstance(prompts, str):
            raise InvalidInputError("prompts must be a sequence of strings, not one string")
        items = list(enumerate(prompts))
        if not items:
            raise InvalidInputError("prompts is empty")
        for index, prompt in items:
            if not isinstance(prompt, str) or not prompt.strip():
                raise InvalidInputError(f"prompt {index} must be a non-empty string")
        if images and not self.backend.accepts_images:
            raise InvalidInputError(
                f"{type(self.backend).__name__} generation does not take images; nothing was sent"
            )
        for image in images:
            if not isinstance(image, Image):
                raise InvalidInputError(f"images must be tv.Image, got {type(image).__name__}")
        _positive_int("max_tokens", max_tokens)
        return items

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model:
            raise ConfigurationError(
                f"this session is pinned to model {self.model!r}; a call for {model!r} was "
                "refused before any request"
            )

    def _require_open(self) -> None:
        if self._state != "open":
            raise SessionStateError(f"the session is {self._state}; use 'async with' to open it")
