"""The async session: one connection pool, the probe result, and bounded concurrent reads.

A judgment plans every question before any request (bad input fails with nothing sent), then
reads the questions as tasks in one task group, each holding one slot of the session's
semaphore, and gathers the answers in request order. The first error in question order fails
the judgment; its sibling reads are cancelled with the task group, so no task outlives it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

import aiohttp
import anyio
import orjson

from typevet_async.backends.http import HttpClient
from typevet_async.backends.llama_cpp import DEFAULT_TOP_K, AsyncLlamaCpp
from typevet_async.core.answers import Answer, Diagnostics, Judgment, Usage
from typevet_async.core.questions import Choice, Noul, Question, Score
from typevet_async.core.readings import CandidateRead
from typevet_async.core.scoring import Probe, ScoringRequest, interpret_read, plan_question
from typevet_async.errors import (
    ConfigurationError,
    InvalidInputError,
    JudgmentTimeoutError,
    QuestionError,
    SessionStateError,
    TypevetError,
    UnsupportedTemplateError,
)
from typevet_async.local import LocalServer, ServerOptions

__all__ = ["ScoringBackend", "Session"]

DEFAULT_MAX_CONCURRENCY = 4
DEFAULT_READ_TIMEOUT = 120.0


class ScoringBackend(Protocol):
    """What a session needs from a backend: one probe, then scoring reads."""

    async def probe(self) -> Probe:
        """Classify the served template, find the controls' token ids and the vocabulary size.

        :raises BackendError: the server could not be read.
        """
        ...

    async def read(self, request: ScoringRequest, vocab_size: int) -> CandidateRead:
        """The candidates' full-vocabulary logprobs at the answer position of ``request``.

        :raises BackendError: the read failed, or its logprobs failed validation.
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
        backend: ScoringBackend,
        http: HttpClient | None = None,
        *,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        model: str | None = None,
        server: LocalServer | None = None,
    ) -> None:
        self.backend = backend
        self.max_concurrency = _positive_int("max_concurrency", max_concurrency)
        self.model = model
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
        _server: LocalServer | None = None,
    ) -> Session:
        """A session on a llama.cpp server.

        :param top_k: logprobs asked for on the first read; a read that misses a candidate
            is repeated with a larger K, up to the whole vocabulary (never estimated).
        :param reproducible: bit-identical answers under the same server: no prompt cache
            and one read at a time (``max_concurrency`` is then 1). See the README for cost.
        :param model: if given, the server must serve a model of that id or alias.
        """
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
        )
        backend = AsyncLlamaCpp(http, top_k=top_k, cache_prompt=not reproducible)
        return cls(backend, http, max_concurrency=concurrency, model=model, server=_server)

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

        ``TYPEVET_BACKEND`` (``llama_cpp``, the default), ``TYPEVET_BASE_URL`` (unset: the
        embedded server), ``TYPEVET_MODEL``, ``TYPEVET_API_KEY``, ``TYPEVET_MAX_CONCURRENCY``.
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
            raise ConfigurationError(
                "TYPEVET_BACKEND=vllm is not available in this version; use llama_cpp"
            )
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
        timeout: float | None = None,
    ) -> Judgment:
        """Ask every question about ``state``; answers come back in request order.

        :param state: a string, or any JSON value (rendered as compact JSON).
        :param timeout: seconds for the whole judgment, probe included.
        :raises InvalidInputError: bad questions or state; nothing was sent.
        :raises UnsupportedTemplateError: the server's template is not native Gemma 4 or 3.
        :raises JudgmentTimeoutError: ``timeout`` passed; every read was cancelled.
        :raises BackendError: the first failing question's error, in question order.
        """
        self._require_open()
        checked = _checked_questions(questions)
        state_text = render_state(state)
        try:
            with anyio.fail_after(timeout):
                return await self._judge(state_text, checked)
        except TypevetError:
            raise
        except TimeoutError:
            raise JudgmentTimeoutError(
                f"the judgment did not finish within {timeout} s; its reads were cancelled"
            ) from None

    async def _judge(self, state_text: str, checked: list[tuple[str, Question]]) -> Judgment:
        probe = await self.probe()
        if not probe.family.is_native:
            raise UnsupportedTemplateError(
                f"the served chat template is {probe.family.value}, not a native Gemma 4 or "
                f"Gemma 3 template; judgments need the model's own turn markers",
                family=probe.family.value,
                rendered=probe.rendered_template,
            )
        requests = [
            plan_question(question_id, question, state_text, probe.family, probe.control_ids)
            for question_id, question in checked
        ]
        outcomes: list[tuple[Answer, Diagnostics, Usage] | Exception | None] = [None] * len(
            requests
        )

        async def score(index: int, request: ScoringRequest, scope: anyio.CancelScope) -> None:
            try:
                async with self._slots:
                    read = await self.backend.read(request, probe.vocab_size)
                answer, diagnostics = interpret_read(request, read)
                usage = Usage(read.prompt_tokens, read.cached_tokens, read.reads)
                outcomes[index] = (answer, diagnostics, usage)
            except Exception as error:  # cancellation is not an Exception: it propagates
                if isinstance(error, TypevetError):
                    error.question_id = request.question_id
                outcomes[index] = error
                scope.cancel()

        async with anyio.create_task_group() as group:
            for index, request in enumerate(requests):
                group.start_soon(score, index, request, group.cancel_scope)

        for outcome in outcomes:  # the first error in question order, not in time order
            if isinstance(outcome, Exception):
                raise outcome
        answers: dict[str, Answer] = {}
        diagnostics: dict[str, Diagnostics] = {}
        usage = Usage()
        for request, outcome in zip(requests, outcomes, strict=True):
            if not isinstance(outcome, tuple):
                raise RuntimeError(f"no outcome for question {request.question_id!r}")
            answers[request.question_id], diagnostics[request.question_id], read_usage = outcome
            usage += read_usage
        return Judgment(answers, usage, diagnostics)

    def _require_open(self) -> None:
        if self._state != "open":
            raise SessionStateError(f"the session is {self._state}; use 'async with' to open it")
