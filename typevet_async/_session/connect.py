"""Building what a `Session` talks to: `connect` turns one constructor's keywords into a
backend (one endpoint, or a fleet over one model's replicas) and the session's settings, and
`from_env` does the same from the ``TYPEVET_*`` variables and a command line's flags (read
by `typevet_async._session.configuration`, which declares every setting). `Session`'s constructors
are thin over these two.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from typevet_async._backends.base import Backend
from typevet_async._backends.embedded import ServerOptions, local_model_name
from typevet_async._backends.fleet import AsyncFleet
from typevet_async._backends.http import HttpSettings
from typevet_async._backends.llama_cpp import AsyncLlamaCpp, LlamaCppConfig
from typevet_async._backends.openai_compatible import (
    AsyncOpenAICompatible,
    OpenAICompatibleConfig,
)
from typevet_async._backends.openai_decisions import AsyncOpenAIDecisions, OpenAIDecisionsConfig
from typevet_async._backends.system_one import (
    SESSION_SETTINGS_REFUSED,
    AsyncSystemOne,
    SystemOneConfig,
)
from typevet_async._backends.vllm import AsyncVllm, VllmConfig
from typevet_async._errors import ConfigurationError
from typevet_async._options import check_argument, instance_of, optional, positive_int
from typevet_async._redaction import redact
from typevet_async._session.configuration import BY_NAME, FRAMING, read_settings
from typevet_async._session.settings import SessionSettings

__all__ = ["connect", "from_env", "local_server"]

#: The HTTP keywords the constructors took one by one before ``http=tv.HttpSettings(...)``:
#: still taken, with a DeprecationWarning, for one release.
LEGACY_HTTP: Final = ("api_key", "request_timeout", "max_retries", "trace_configs", "time_slice")

#: Builds one endpoint's backend from its URL (None: the embedded server), its own keywords
#: and the HTTP settings.
_Build = Callable[[str | None, Mapping[str, Any], HttpSettings], Backend]


def _remote(config: type[Any], client: type[Any]) -> _Build:
    def build(base: str | None, own: Mapping[str, Any], http: HttpSettings) -> Backend:
        return client(config(base_url=base, http=http, **own))  # type: ignore[no-any-return]

    return build


_BUILDERS: Final[Mapping[str, _Build]] = {
    "llama_cpp": _remote(LlamaCppConfig, AsyncLlamaCpp),
    "vllm": _remote(VllmConfig, AsyncVllm),
    "openai_compatible": _remote(OpenAICompatibleConfig, AsyncOpenAICompatible),
    "system_one": _remote(SystemOneConfig, AsyncSystemOne),
    "openai_decisions": _remote(OpenAIDecisionsConfig, AsyncOpenAIDecisions),
}

#: What each backend cannot do without, and why.
_REQUIRED: Final = {
    "vllm": (
        ("base_url", "vLLM has no embedded server"),
        ("model", "the name the vLLM server serves the model by"),
    ),
    "system_one": (("base_url", "a System One server has no embedded one"),),
    "openai_decisions": (("base_url", "a Decisions server has no embedded one"),),
    "openai_compatible": (("base_url", "the OpenAI-compatible server's API base"),),
}


def _own_keywords(kind: str) -> frozenset[str]:
    """The keywords of ``kind``'s backend config, by the declaration."""
    return frozenset(
        setting.name
        for setting in BY_NAME.values()
        if setting.home in ("backend", "connection")
        and kind in setting.backends
        and setting.name not in ("backend", "base_url", "local_model", "endpoint_slots")
    )


def http_settings(base: Any, fields: Mapping[str, Any]) -> HttpSettings:
    """``base`` (None: the defaults) with ``fields`` by name (``max_retries``: the retry
    policy's), each checked by `HttpSettings`' own rules."""
    check_argument("http", base, optional(instance_of(HttpSettings, "a tv.HttpSettings or None")))
    http = HttpSettings() if base is None else base
    changes = dict(fields)
    if "max_retries" in changes:
        changes["retry"] = attrs.evolve(http.retry, max_retries=changes.pop("max_retries"))
    return attrs.evolve(http, **changes)


def _legacy_http(options: dict[str, Any]) -> HttpSettings:
    """The session's `HttpSettings`: ``http=``, with the keywords of before it folded in."""
    legacy: dict[str, Any] = {name: options.pop(name) for name in LEGACY_HTTP if name in options}
    if legacy:
        named = ", ".join(f"{name}=..." for name in legacy)
        warnings.warn(
            f"{named}: give them as http=tv.HttpSettings(...) (max_retries as "
            "retry=tv.RetryPolicy(max_retries=...)); the separate keywords go in the next release",
            DeprecationWarning,
            stacklevel=4,
        )
    return http_settings(options.pop("http", None), legacy)


def _refuse_misplaced(kind: str, options: Mapping[str, Any]) -> None:
    """A keyword that is a setting of another backend, or a field of ``http``, named as such."""
    for name in options:
        setting = BY_NAME.get(name)
        if setting is None or setting.home == "session":
            continue
        if setting.home == "http":
            raise ConfigurationError(f"{name} is a field of http=tv.HttpSettings({name}=...)")
        backends = ", ".join(sorted(setting.backends))
        raise ConfigurationError(f"{name} applies to {backends}, not {kind}")
    refused = sorted(set(options) & SESSION_SETTINGS_REFUSED)
    if refused and kind not in FRAMING:
        raise ConfigurationError(
            f"{', '.join(refused)} cannot be set on a System One or Decisions session: the server "
            "frames and reads the questions itself"
        )


def connect(
    kind: str, base_url: str | Sequence[str] | None, options: Mapping[str, Any]
) -> tuple[Backend, SessionSettings]:
    """The backend and settings of ``Session.<kind>(base_url, **options)``: one endpoint, the
    embedded server (llama_cpp, ``base_url`` None) or a fleet (a list of URLs).

    :raises ConfigurationError: a keyword of the wrong type or value, another backend's, or
        an unknown one, named.
    """
    rest = dict(options)
    http = _legacy_http(rest)
    slots = rest.pop("endpoint_slots", None)
    check_argument("endpoint_slots", slots, optional(positive_int))
    own = {name: rest.pop(name) for name in _own_keywords(kind) if name in rest}
    _refuse_misplaced(kind, rest)
    if kind == "vllm" and own.get("model") is None:
        raise ConfigurationError("Session.vllm needs model=: the name the server serves it by")
    settings = SessionSettings.from_keywords(rest)
    build = _BUILDERS[kind]
    if base_url is None and kind == "llama_cpp":  # the embedded server: one endpoint
        _one_endpoint(slots)
        return build(None, own, http), settings
    if base_url is None:
        raise ConfigurationError(f"Session.{kind} needs a base_url: it has no embedded server")
    return _endpoints(base_url, lambda base: build(base, own, http), http, slots), settings


def _endpoints(
    base_url: str | Sequence[str],
    build: Callable[[str], Backend],
    http: HttpSettings,
    slots: int | None,
) -> Backend:
    """One backend at ``base_url``, or, for a list of URLs, an `AsyncFleet` over one backend
    per URL (each built by ``build``, all with the same settings).

    :raises ConfigurationError: an empty or repeated URL list, a URL that is not one,
        ``endpoint_slots`` for a single endpoint.
    """
    if isinstance(base_url, str):
        _one_endpoint(slots)
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
        return _endpoints(urls[0], build, http, slots)
    members = [(redact(each.rstrip("/")), build(each)) for each in urls]
    return AsyncFleet(members, retry=http.retry, endpoint_slots=slots)


def _one_endpoint(slots: int | None) -> None:
    if slots is not None:
        raise ConfigurationError("endpoint_slots applies to a session over several URLs")


def local_server(model: str | None, server: ServerOptions | None) -> ServerOptions:
    """`Session.local`'s embedded server: ``server``, else the local model ``model`` names
    (default: ``TYPEVET_LOCAL_MODEL``, else the default local model)."""
    if server is None:
        return ServerOptions(model=model or local_model_name(os.environ))
    if model is not None:
        raise ConfigurationError("give the local model as model= or in server=, not both")
    return server


# -- the environment -----------------------------------------------------------------------


def from_env(
    environ: Mapping[str, str], flags: Mapping[str, Any] | None, keywords: Mapping[str, Any]
) -> tuple[Backend, SessionSettings]:
    """The backend and settings the ``TYPEVET_*`` variables describe, each overridden by a
    command line's flag of the same setting (``flags``, by name; None: not given), with the
    Python-only ``keywords`` (a read cache, ``http``, ...). A refusal names the variable or
    flag; one that is missing names the flag too when there are flags.

    :raises ConfigurationError: naming the setting that is missing, wrong, given twice (a
        keyword and a variable or flag) or not one of the chosen backend's.
    """
    given = read_settings(environ, flags)
    for name in keywords:
        if name in given:
            raise ConfigurationError(f"{name} comes from {given[name][1]} here, not a keyword")
    values = {name: value for name, (value, _) in given.items()}
    kind = values.pop("backend", "llama_cpp")
    base_url = values.pop("base_url", None)
    # The embedded server's model; a variable set for it is left alone with a URL.
    local = values.pop("local_model", None)
    missing = [(name, why) for name, why in _REQUIRED.get(kind, ()) if name not in given]
    if missing:
        by_flag = given["backend"][1].startswith("--")
        chosen_by = f"--backend {kind}" if by_flag else f"TYPEVET_BACKEND={kind}"
        needs = " and ".join(BY_NAME[name].named(flags is not None) for name, _ in missing)
        why = f": {missing[0][1]}" if len(missing) == 1 else ""
        raise ConfigurationError(f"{chosen_by} needs {needs}{why}")
    for name in values:
        setting = BY_NAME[name]
        if kind not in setting.backends:
            backends = ", ".join(sorted(setting.backends))
            raise ConfigurationError(f"{given[name][1]} applies to {backends}, not {kind}")
    fields = {name: values.pop(name) for name in list(values) if BY_NAME[name].home == "http"}
    options = {**values, **keywords, "http": http_settings(keywords.get("http"), fields)}
    if kind == "llama_cpp" and base_url is None and options.get("server") is None:
        named = {"TYPEVET_LOCAL_MODEL": local or ""}  # checked: a name it knows
        options["server"] = ServerOptions(model=local_model_name(named))
    return connect(kind, base_url, options)
