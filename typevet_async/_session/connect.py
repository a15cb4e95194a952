"""Building what a `Session` talks to: one endpoint or a fleet of them for each backend, the
one mapping from ``TYPEVET_*`` variables (and a command line's flags) to a session, and
the backends `SessionFactories` (`typevet_async._session.factories`) builds sessions on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import aiohttp
import attrs

from typevet_async._backends.base import Backend
from typevet_async._backends.embedded import ServerOptions, local_model_name
from typevet_async._backends.fleet import AsyncFleet
from typevet_async._backends.http import DEFAULT_REQUEST_TIMEOUT, HttpSettings
from typevet_async._backends.llama_cpp import AsyncLlamaCpp, LlamaCppConfig, OnMissing
from typevet_async._backends.openai_compatible import (
    AsyncOpenAICompatible,
    OpenAICompatibleConfig,
)
from typevet_async._backends.openai_decisions import AsyncOpenAIDecisions, OpenAIDecisionsConfig
from typevet_async._backends.retrying import DEFAULT_MAX_RETRIES, RetryPolicy
from typevet_async._backends.system_one import (
    DEFAULT_MAX_BATCH_STATES,
    SESSION_SETTINGS_REFUSED,
    AsyncSystemOne,
    SystemOneConfig,
)
from typevet_async._backends.vllm import AsyncVllm, LogprobsMode, VllmConfig
from typevet_async._concurrency.slicing import SLICE
from typevet_async._core.reading.chat_reads import ChatOnMissing
from typevet_async._errors import ConfigurationError
from typevet_async._options import api_key, optional, positive_int, sequence_of
from typevet_async._redaction import redact
from typevet_async._session.settings import DEFAULT_MAX_CONCURRENCY, SessionSettings

__all__ = [
    "BACKENDS",
    "ENV_SETTINGS",
    "EnvSetting",
    "HttpKeywords",
    "from_env",
    "llama_cpp",
    "local_server",
    "openai_compatible",
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


def openai_compatible(
    base_url: str | Sequence[str],
    http: HttpKeywords,
    *,
    model: str | None = None,
    top_logprobs: int | None = None,
    on_missing: ChatOnMissing = "clamp",
) -> Backend:
    """`Session.openai_compatible`'s backend: one server or a fleet of replicas."""
    settings = http.settings()

    def build(base: str) -> AsyncOpenAICompatible:
        config = OpenAICompatibleConfig(
            base_url=base,
            model=model,
            top_logprobs=top_logprobs,
            on_missing=on_missing,
            http=settings,
        )
        return AsyncOpenAICompatible(config)

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
    "vllm": (
        ("base_url", "vLLM has no embedded server"),
        ("model", "the name the vLLM server serves the model by"),
    ),
    "system_one": (("base_url", "a System One server has no embedded one"),),
    "openai_compatible": (("base_url", "the OpenAI-compatible server's API base"),),
}
#: The backends ``TYPEVET_BACKEND`` (and ``--backend``) names.
BACKENDS: Final = ("llama_cpp", "vllm", "system_one", "openai_compatible")


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
    if backend not in BACKENDS:
        raise ConfigurationError(
            f"{named('backend')} must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}"
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
    if backend == "openai_compatible":
        assert base_url is not None
        return openai_compatible(base_url, http, model=model), settings
    # The embedded server's model: the flag's, else the variable's, else the default.
    local = {"TYPEVET_LOCAL_MODEL": given["local_model"] or ""}
    server = None if base_url is not None else ServerOptions(model=local_model_name(local))
    return llama_cpp(base_url, http, model=model, server=server), settings
