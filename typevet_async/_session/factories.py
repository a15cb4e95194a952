"""`SessionFactories`, the session's ways in (``llama_cpp``, ``vllm``, ``openai_compatible``,
``system_one``, ``openai_decisions``, ``local``, ``from_env``), so the session's own module
holds only what a session does; the backends are built in `typevet_async._session.connect`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

import aiohttp

from typevet_async._backends.base import Backend
from typevet_async._backends.embedded import ServerOptions
from typevet_async._backends.http import DEFAULT_REQUEST_TIMEOUT
from typevet_async._backends.llama_cpp import OnMissing
from typevet_async._backends.retrying import DEFAULT_MAX_RETRIES
from typevet_async._backends.system_one import DEFAULT_MAX_BATCH_STATES
from typevet_async._backends.vllm import LogprobsMode
from typevet_async._concurrency.slicing import SLICE
from typevet_async._core.reading.chat_reads import ChatOnMissing
from typevet_async._session.connect import (
    HttpKeywords,
    from_env,
    llama_cpp,
    local_server,
    openai_compatible,
    openai_decisions,
    system_one,
    vllm,
)
from typevet_async._session.settings import SessionSettings

__all__ = ["SessionFactories"]


class SessionFactories:
    """`Session`'s ways in: a session on llama.cpp, vLLM or a System One server (one endpoint
    or a fleet), on the embedded server, or from the ``TYPEVET_*`` variables. A mixin, so the
    session's own module holds only what a session does."""

    if TYPE_CHECKING:

        def __init__(self, backend: Backend, settings: SessionSettings | None = None) -> None: ...

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
    ) -> Self:
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
        backend = llama_cpp(
            base_url,
            http,
            model=model,
            top_k=top_k,
            on_missing=on_missing,
            reproducible=reproducible,
            server=server,
        )
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
    ) -> Self:
        """A session on a vLLM server, pinned to ``model`` (every request names it).

        ``logprobs_mode``: see `VllmConfig`; the rest as in `Session.llama_cpp`.
        """
        http = HttpKeywords(
            api_key, request_timeout, max_retries, trace_configs, endpoint_slots, time_slice
        )
        backend = vllm(base_url, http, model=model, logprobs_mode=logprobs_mode)
        return cls(backend, SessionSettings.from_keywords(settings))

    @classmethod
    def openai_compatible(
        cls,
        base_url: str | Sequence[str],
        *,
        model: str | None = None,
        top_logprobs: int | None = None,
        on_missing: ChatOnMissing = "clamp",
        api_key: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        endpoint_slots: int | None = None,
        time_slice: float | None = SLICE,
        **settings: Any,
    ) -> Self:
        """A session on any OpenAI-compatible chat server (Ollama, LM Studio, SGLang, TGI,
        vLLM, llama.cpp's ``llama-server``, LiteLLM, a hosted provider): each question is one
        ``POST {base_url}/chat/completions`` with ``max_tokens: 1``, ``temperature: 0``,
        ``logprobs: true`` and ``top_logprobs``, its answer read from the candidates among the
        returned entries (``"A"`` and ``" A"`` both answer A, the likelier kept).

        :param base_url: the API's base as OpenAI's clients take it
            (``http://host:8000/v1``), or a list of replicas' bases.
        :param model: the model each request names (None: the first ``{base_url}/models``
            lists).
        :param top_logprobs: the first read's window (default 20, OpenAI's cap).
        :param on_missing: an option outside the window: ``"clamp"`` (the default, so that a
            server capped at 20 still answers: the window is widened up to the server's cap,
            then a missing option gets the lowest logprob returned and the answer is flagged
            ``truncated`` with how many were ``clamped``), ``"exact"`` (widen, then
            `CandidateMissingError` naming the cap) or ``"error"`` (fail at once). With every
            option in the window the answer is exact whichever the policy.

        The probe learns what the server gives (``session.probe``'s ``chat_server``): no
        logprobs at all is refused with `LogprobsUnavailableError` before any question is
        read. The rest as in `Session.llama_cpp`.
        """
        http = HttpKeywords(
            api_key, request_timeout, max_retries, trace_configs, endpoint_slots, time_slice
        )
        backend = openai_compatible(
            base_url, http, model=model, top_logprobs=top_logprobs, on_missing=on_missing
        )
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
        max_batch_states: int = DEFAULT_MAX_BATCH_STATES,
        **settings: Any,
    ) -> Self:
        """A session on a System One server (``POST /v1/systemone``): ``typevet-async serve``,
        vLLM's for its decision models, the hosted API.

        The server judges: one request a judgment (the state, every question), its answers
        checked and typed; ``judge_many`` and retries as on any backend. Generation and images
        are refused unsent; diagnostics are our own gateway's only.

        :param base_url: the server's root URL.
        :param model: the model each request names (None: the first ``GET /v1/models``
            lists); checked against that list at the probe.
        :param api_key: sent as ``Authorization: Bearer``.
        :param max_batch_states: the most states a ``judge_many`` batch request carries: the
            server's advertised ``max_states``, never more (an advertisement is its word).
        :param settings: `SessionSettings` by name (``max_concurrency``: requests in flight).
        :raises ConfigurationError: ``layout``, ``prefix_reuse`` or ``off_menu_threshold``
            given: the server frames and reads the questions, so they could not apply.
        """
        http = HttpKeywords(
            api_key, request_timeout, max_retries, trace_configs, endpoint_slots, time_slice
        )
        backend = system_one(
            base_url,
            http,
            model=model,
            session_settings=settings,
            max_batch_states=max_batch_states,
        )
        return cls(backend, SessionSettings.from_keywords(settings))

    @classmethod
    def openai_decisions(
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
    ) -> Self:
        """A session on a server of OpenAI's Decisions API (``POST /v1/decisions``), such as
        ``typevet-async serve``: each judgment is one request, its answers checked and typed
        as from `Session.system_one`; a question the server refuses raises `RefusalError`
        (the other answers ride on it). A Noul with criteria, images and generation are
        refused unsent.

        :param base_url: the server's root URL (``/v1/decisions`` is under it).
        :param model: as in `Session.system_one` (``GET /v1/models``: OpenAI's list or
            System One's).
        :raises ConfigurationError: as in `Session.system_one`.
        """
        http = HttpKeywords(
            api_key, request_timeout, max_retries, trace_configs, endpoint_slots, time_slice
        )
        backend = openai_decisions(base_url, http, model=model, session_settings=settings)
        return cls(backend, SessionSettings.from_keywords(settings))

    @classmethod
    def local(
        cls, model: str | None = None, *, server: ServerOptions | None = None, **options: Any
    ) -> Self:
        """A session on the embedded llama.cpp server with a local model.

        :param model: a local model's name (``tv.LOCAL_MODELS``): ``"gemma3-270m"`` (small and
            fast, a base model: answers near chance) or ``"qwen2.5-coder-1.5b"`` (a real
            instruction model, the ``qwen`` extra); default: ``TYPEVET_LOCAL_MODEL``, else
            ``"gemma3-270m"``. Assembled into the cache folder on first use.
        :param server: how to start the server (its ``model`` is the one served; not both).

        The server starts when the session opens and stops when it closes. ``options`` are
        those of `Session.llama_cpp`.
        """
        return cls.llama_cpp(None, server=local_server(model, server), **options)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        flags: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> Self:
        """A session configured by ``TYPEVET_*`` variables.

        ``TYPEVET_BACKEND`` (``llama_cpp``, the default, ``vllm``, ``system_one`` or
        ``openai_compatible``), ``TYPEVET_BASE_URL`` (unset with llama_cpp: the embedded
        server; required otherwise),
        ``TYPEVET_MODEL`` (required for vllm), ``TYPEVET_LOCAL_MODEL`` (the embedded server's
        model, by name),
        ``TYPEVET_API_KEY``, ``TYPEVET_MAX_CONCURRENCY``.

        :param environ: the variables (default: ``os.environ``).
        :param flags: a command line's values of the same settings, by name (``backend``,
            ``base_url``, ``local_model``, ``model``, ``api_key``, ``max_concurrency``; None:
            not given): each wins over its variable, and a refusal names the flag with it.
        :param settings: other `SessionSettings` by name (``cache``, ``layout``, ...; not
            ``max_concurrency``, the variables' and flags').
        :raises ConfigurationError: naming the setting that is missing or wrong.
        """
        backend, from_variables = from_env(os.environ if environ is None else environ, flags)
        fixed = {"max_concurrency": "TYPEVET_MAX_CONCURRENCY (or --max-concurrency)"}
        return cls(backend, from_variables.with_keywords(settings, fixed=fixed))
