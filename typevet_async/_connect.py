"""Building what a `Session` talks to: one endpoint or a fleet of them for each backend, the
one mapping from ``TYPEVET_*`` variables (and a command line's flags) to a session, and
`SessionFactories`, the session's ways in (``llama_cpp``, ``vllm``, ``system_one``,
``openai_decisions``, ``local``, ``from_env``), so the session's own module holds only what a
session does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Self

import aiohttp
import attrs

from typevet_async._backends.base import Backend
from typevet_async._backends.embedded import ServerOptions, local_model_name
from typevet_async._backends.fleet import AsyncFleet
from typevet_async._backends.http import DEFAULT_REQUEST_TIMEOUT, HttpSettings
from typevet_async._backends.llama_cpp import AsyncLlamaCpp, LlamaCppConfig, OnMissing
from typevet_async._backends.openai_decisions import AsyncOpenAIDecisions, OpenAIDecisionsConfig
from typevet_async._backends.retrying import DEFAULT_MAX_RETRIES, RetryPolicy
from typevet_async._backends.system_one import (
    DEFAULT_MAX_BATCH_STATES,
    SESSION_SETTINGS_REFUSED,
    AsyncSystemOne,
    SystemOneConfig,
)
from typevet_async._backends.vllm import AsyncVllm, LogprobsMode, VllmConfig
from typevet_async._errors import ConfigurationError
from typevet_async._options import api_key, optional, positive_int, sequence_of
from typevet_async._redaction import redact
from typevet_async._settings import DEFAULT_MAX_CONCURRENCY, SessionSettings
from typevet_async._slicing import SLICE

__all__ = [
    "ENV_SETTINGS",
    "EnvSetting",
    "HttpKeywords",
    "SessionFactories",
    "from_env",
    "llama_cpp",
    "local_server",
    "openai_decisions",
    "system_one",
    "vllm",
]


@attrs.frozen
class HttpKeywords:
    """The factories' keywords of how to reach the server(s), the same for every backend;
    checked when built (a key with a trailing newline, say, would otherwise fail as a raw
    error at the first request). The numbers are checked by `HttpSettings` and `RetryPolicy`."""

    api_key: str | None = attrs.field(default=None, validator=api_key)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES
    trace_configs: Sequence[aiohttp.TraceConfig] = attrs.field(
        default=(),
        validator=sequence_of(aiohttp.TraceConfig, "a list or tuple of aiohttp.TraceConfig"),
    )
    endpoint_slots: int | None = attrs.field(default=None, validator=optional(positive_int))
    time_slice: float | None = SLICE

    def settings(self) -> HttpSettings:
        return HttpSettings(
            api_key=self.api_key,
            request_timeout=self.request_timeout,
            retry=RetryPolicy(max_retries=self.max_retries),
            trace_configs=self.trace_configs,
            time_slice=self.time_slice,
        )


def _endpoints(
    base_url: str | Sequence[str], build: Callable[[str], Backend], http: HttpKeywords
) -> Backend:
    """One backend at ``base_url``, or, for a list of URLs, an `AsyncFleet` over one backend
    per URL (each built by ``build``, all with the same settings).

    :raises ConfigurationError: an empty or repeated URL list, a URL that is not one,
        ``endpoint_slots`` for a single endpoint.
    """
    if isinstance(base_url, str):
        _one_endpoint(http)
        return build(base_url)
    if not isinstance(base_url, Sequence) or not base_url:
        raise ConfigurationError(
            f"base_url must be a URL or a non-empty list of URLs, got {base_url!r}"
        )
    urls = list(base_url)
    for each in urls:  # each is a URL by its backend config's rule, checked as it is built
        if not isinstance(each, str) or not each.strip():
            raise ConfigurationError(f"each base_url must be a non-empty string, got {each!r}")
    if len({each.rstrip("/") for each in urls}) != len(urls):
        raise ConfigurationError(f"base_url lists an endpoint twice: {[redact(u) for u in urls]}")
    if len(urls) == 1:
        return _endpoints(urls[0], build, http)
    members = [(redact(each.rstrip("/")), build(each)) for each in urls]
    return AsyncFleet(
        members, retry=RetryPolicy(max_retries=http.max_retries), endpoint_slots=http.endpoint_slots
    )


def _one_endpoint(http: HttpKeywords) -> None:
    if http.endpoint_slots is not None:
        raise ConfigurationError("endpoint_slots applies to a session over several URLs")


def llama_cpp(
    base_url: str | Sequence[str] | None,
    http: HttpKeywords,
    *,
    model: str | None = None,
    top_k: int | None = None,
    on_missing: OnMissing = "exact",
    reproducible: bool = False,
    server: ServerOptions | None = None,
) -> Backend:
    """`Session.llama_cpp`'s backend: the embedded server (``base_url`` None), one server or
    a fleet of replicas."""
    settings = http.settings()

    def build(base: str | None) -> AsyncLlamaCpp:
        config = LlamaCppConfig(
            base_url=base,
            server=server,
            model=model,
            http=settings,
            top_k=top_k,
            on_missing=on_missing,
            reproducible=reproducible,
        )
        return AsyncLlamaCpp(config)

    if base_url is None:  # the embedded server: one endpoint
        _one_endpoint(http)
        return build(None)
    return _endpoints(base_url, build, http)


def vllm(
    base_url: str | Sequence[str], http: HttpKeywords, *, model: str, logprobs_mode: LogprobsMode
) -> Backend:
    """`Session.vllm`'s backend: one server or a fleet of replicas."""
    settings = http.settings()

    def build(base: str) -> AsyncVllm:
        return AsyncVllm(
            VllmConfig(base_url=base, model=model, logprobs_mode=logprobs_mode, http=settings)
        )

    return _endpoints(base_url, build, http)


def system_one(
    base_url: str | Sequence[str],
    http: HttpKeywords,
    *,
    model: str | None,
    session_settings: Mapping[str, Any],
    max_batch_states: int = DEFAULT_MAX_BATCH_STATES,
) -> Backend:
    """`Session.system_one`'s backend, once none of ``session_settings`` is one the server's
    own framing would ignore (`SESSION_SETTINGS_REFUSED`)."""
    refused = sorted(set(session_settings) & SESSION_SETTINGS_REFUSED)
    if refused:
        raise ConfigurationError(
            f"{', '.join(refused)} cannot be set on a System One or Decisions session: the server "
            "frames and reads the questions itself"
        )
    settings = http.settings()

    def build(base: str) -> AsyncSystemOne:
        config = SystemOneConfig(base_url=base, model=model, http=settings)
        return AsyncSystemOne(attrs.evolve(config, max_batch_states=max_batch_states))

    return _endpoints(base_url, build, http)


def openai_decisions(
    base_url: str | Sequence[str],
    http: HttpKeywords,
    *,
    model: str | None,
    session_settings: Mapping[str, Any],
) -> Backend:
    """`Session.openai_decisions`' backend; it refuses what a System One session refuses (the
    server frames and reads the questions itself: `SESSION_SETTINGS_REFUSED`)."""
    system_one(base_url, http, model=model, session_settings=session_settings)  # the checks
    settings = http.settings()

    def build(base: str) -> AsyncOpenAIDecisions:
        config = OpenAIDecisionsConfig(base_url=base, model=model, http=settings)
        return AsyncOpenAIDecisions(config)

    return _endpoints(base_url, build, http)


def local_server(model: str | None, server: ServerOptions | None) -> ServerOptions:
    """`Session.local`'s embedded server: ``server``, else the local model ``model`` names
    (default: ``TYPEVET_LOCAL_MODEL``, else the default local model)."""
    if server is None:
        return ServerOptions(model=model or local_model_name(os.environ))
    if model is not None:
        raise ConfigurationError("give the local model as model= or in server=, not both")
    return server


# -- the environment -----------------------------------------------------------------------


@attrs.frozen
class EnvSetting:
    """A connection setting: its variable, and its flag as the command line names it."""

    variable: str
    flag: str


#: Every connection setting ``from_env`` reads, by name: the one mapping of variables (and a
#: command line's flags) to a session.
ENV_SETTINGS: Final = {
    "backend": EnvSetting("TYPEVET_BACKEND", "--backend"),
    "base_url": EnvSetting("TYPEVET_BASE_URL", "--base-url URL"),
    "local_model": EnvSetting("TYPEVET_LOCAL_MODEL", "--local-model NAME"),
    "model": EnvSetting("TYPEVET_MODEL", "--model MODEL"),
    "api_key": EnvSetting("TYPEVET_API_KEY", "--api-key KEY"),
    "max_concurrency": EnvSetting("TYPEVET_MAX_CONCURRENCY", "--max-concurrency N"),
}

#: What each backend cannot do without, and why.
_REQUIRED: Final = {
    "vllm": (("base_url", "vLLM has no embedded server"),
             ("model", "the name the vLLM server serves the model by")),
    "system_one": (("base_url", "a System One server has no embedded one"),),
}  # fmt: skip


def from_env(
    environ: Mapping[str, str], flags: Mapping[str, Any] | None = None
) -> tuple[Backend, SessionSettings]:
    """The backend and settings the ``TYPEVET_*`` variables describe, each overridden by a
    command line's flag of the same setting (``flags``, by `ENV_SETTINGS` name; None: not
    given). A refusal names the flag too when there are flags.

    :raises ConfigurationError: naming the setting that is missing or wrong.
    """
    if flags is not None and not isinstance(flags, Mapping):
        raise ConfigurationError(f"flags must be a mapping of setting to value, got {flags!r}")
    unknown = sorted(set(flags or {}) - set(ENV_SETTINGS), key=str)
    if unknown:
        raise ConfigurationError(
            f"flags names no setting {unknown}: the settings are {sorted(ENV_SETTINGS)}"
        )
    given: dict[str, str | None] = {}
    for name, setting in ENV_SETTINGS.items():
        flag = (flags or {}).get(name)
        # A variable is taken as it is (a key with a newline is refused, not trimmed).
        given[name] = str(flag) if flag is not None else environ.get(setting.variable) or None

    def named(name: str) -> str:
        setting = ENV_SETTINGS[name]
        return setting.variable if flags is None else f"{setting.flag} (or {setting.variable})"

    backend = (given["backend"] or "").strip() or "llama_cpp"
    if backend not in ("llama_cpp", "vllm", "system_one"):
        raise ConfigurationError(
            f"{named('backend')} must be 'llama_cpp', 'vllm' or 'system_one', got {backend!r}"
        )
    missing = [(name, why) for name, why in _REQUIRED.get(backend, ()) if given[name] is None]
    if missing:
        by_flag = flags is not None and (flags.get("backend") is not None)
        chosen_by = f"--backend {backend}" if by_flag else f"TYPEVET_BACKEND={backend}"
        needs = " and ".join(named(name) for name, _ in missing)
        raise ConfigurationError(
            f"{chosen_by} needs {needs}{f': {missing[0][1]}' if len(missing) == 1 else ''}"
        )
    raw = given["max_concurrency"] or str(DEFAULT_MAX_CONCURRENCY)
    try:
        concurrency = int(raw)
    except ValueError:
        raise ConfigurationError(
            f"{named('max_concurrency')} must be a positive integer, got {raw!r}"
        ) from None
    settings = SessionSettings.from_keywords({"max_concurrency": concurrency})
    http = HttpKeywords(api_key=given["api_key"])
    base_url, model = given["base_url"], given["model"]
    if backend == "vllm":
        assert base_url is not None
        assert model is not None
        return vllm(base_url, http, model=model, logprobs_mode="raw_logprobs"), settings
    if backend == "system_one":
        assert base_url is not None
        return system_one(base_url, http, model=model, session_settings={}), settings
    # The embedded server's model: the flag's, else the variable's, else the default.
    local = {"TYPEVET_LOCAL_MODEL": given["local_model"] or ""}
    server = None if base_url is not None else ServerOptions(model=local_model_name(local))
    return llama_cpp(base_url, http, model=model, server=server), settings


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
        backend = system_one(base_url, http, model=model, session_settings=settings,
                             max_batch_states=max_batch_states)  # fmt: skip
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

        ``TYPEVET_BACKEND`` (``llama_cpp``, the default, ``vllm`` or ``system_one``),
        ``TYPEVET_BASE_URL`` (unset with llama_cpp: the embedded server; required otherwise),
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
