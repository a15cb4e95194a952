"""Every setting of a session, declared once (`SETTINGS`): its name, default, help, the rule of
its value written as text, and the backends it applies to.

A setting has one name at every door: the Python keyword ``top_k=``, the variable
``TYPEVET_TOP_K`` and the command line's ``--top-k``. The variables are read by `read_settings`
(for `Session.from_env`), the command line's options are derived by
`typevet_async._apps.cli.arguments.session_flags`, and the configuration guide's table is
`settings_table`. The Python keywords are the constructors' (`Common` and each backend's
`TypedDict` below); a test holds the three doors and the guide to this declaration.
Settings that are objects (a read cache, trace hooks) have a Python door only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, Required, TypedDict

import attrs

from typevet_async._backends.embedded import ServerOptions
from typevet_async._backends.http import (
    DEFAULT_KEEPALIVE,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_REQUEST_TIMEOUT,
    HttpSettings,
)
from typevet_async._backends.local_models import DEFAULT_LOCAL_MODEL, LOCAL_MODELS
from typevet_async._backends.retrying import DEFAULT_MAX_RETRIES
from typevet_async._backends.system_one import DEFAULT_MAX_BATCH_STATES
from typevet_async._concurrency.slicing import SLICE
from typevet_async._core.prompts.controls import (
    DEFAULT_CONTROLS,
    Controls,
    NoulControls,
    ScoreControls,
)
from typevet_async._core.prompts.layouts import Layout
from typevet_async._core.statistics.batch_calibration import MIN_BATCH_ITEMS
from typevet_async._core.statistics.batch_judgments import BatchCalibration, calibration_window
from typevet_async._core.statistics.calibration import CalibrationMap
from typevet_async._core.statistics.content_free import ContentFree
from typevet_async._core.statistics.fitted_prior import FittedPrior
from typevet_async._errors import ConfigurationError
from typevet_async._options import (
    Validator,
    api_key,
    check_argument,
    non_empty_text,
    non_negative_int,
    positive_int,
    positive_number,
    probability_or_none,
)
from typevet_async._session.images import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGES
from typevet_async._session.read_cache import ReadCache
from typevet_async._session.settings import (
    DEFAULT_BATCH_CALIBRATION,
    DEFAULT_BATCH_CALIBRATION_WINDOW,
    DEFAULT_CONTENT_FREE,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NOUL_CONTROLS,
    DEFAULT_SCORE_CONTROLS,
    Permutations,
    PrefixReuse,
)

__all__ = [
    "BACKENDS",
    "BY_NAME",
    "FRAMING",
    "SETTINGS",
    "Chat",
    "Common",
    "Flags",
    "LlamaCpp",
    "Local",
    "Remote",
    "Setting",
    "SystemOne",
    "URLs",
    "Vllm",
    "read_settings",
    "settings_table",
]

#: The backends ``TYPEVET_BACKEND`` (and ``--backend``) names: each a `Session` constructor.
BACKENDS: Final = ("llama_cpp", "vllm", "system_one", "openai_compatible", "openai_decisions")
#: The backends that frame and read the questions here (a System One or Decisions server
#: does both itself: `SESSION_SETTINGS_REFUSED`).
FRAMING: Final = frozenset({"llama_cpp", "vllm", "openai_compatible"})
_ALL: Final = frozenset(BACKENDS)

#: Reads a setting's text (a variable's or a flag's) as its value; the second argument names
#: where the text came from, for the error.
Reader = Callable[[str, str], Any]
#: What a setting's default is when each backend has its own.
BACKEND_DEFAULT: Final = "the backend's"


def _refuse(source: str, wanted: str, text: str) -> ConfigurationError:
    return ConfigurationError(f"{source} must be {wanted}, got {text!r}")


def _number(convert: Callable[[str], Any], wanted: str, validator: Validator) -> Reader:
    """Text as a number, then held to ``validator`` (the record's own rule)."""

    def read(text: str, source: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise _refuse(source, wanted, text) from None
        check_argument(source, value, validator)
        return value

    return read


def _text(validator: Validator) -> Reader:
    def read(text: str, source: str) -> str:
        check_argument(source, text, validator)
        return text

    return read


def _none_or(reader: Reader) -> Reader:
    """``none`` (any case) is None; anything else is ``reader``'s."""
    return lambda text, source: None if text.strip().lower() == "none" else reader(text, source)


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def _boolean(text: str, source: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE | _FALSE:
        raise _refuse(source, "true or false (1/0, yes/no, on/off)", text)
    return word in _TRUE


def _choice(choices: Sequence[str]) -> Reader:
    def read(text: str, source: str) -> str:
        if text not in choices:
            raise _refuse(source, "one of " + ", ".join(map(repr, choices)), text)
        return text

    return read


def _urls(text: str, source: str) -> str | list[str]:
    """One URL, or a comma-separated list of replicas (a fleet)."""
    urls = [part.strip() for part in text.split(",")]
    for each in urls:
        check_argument(source, each, non_empty_text)
    return urls[0] if len(urls) == 1 else urls


def _file(source: str, text: str) -> bytes:
    """A file a setting's text names, read whole."""
    try:
        return Path(text).read_bytes()
    except OSError as error:
        raise ConfigurationError(
            f"{source} {text}: cannot read it: {error.strerror or error}"
        ) from None


def _calibration(text: str, source: str) -> CalibrationMap:
    """A calibration map's file."""
    return CalibrationMap.from_json(_file(source, text))


def _prior(text: str, source: str) -> FittedPrior:
    """A fitted prior's file."""
    return FittedPrior.from_json(_file(source, text))


_positive_int = _number(int, "a positive integer", positive_int)
_positive_number = _number(float, "a positive number", positive_number)

Home = Literal["connection", "backend", "http", "session"]


@attrs.frozen(kw_only=True)
class Setting:
    """One setting. ``read`` None: the value is an object, given in Python only."""

    name: str
    home: Home
    help: str
    default: Any
    read: Reader | None
    backends: frozenset[str] = _ALL
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    #: How Python spells it, where that is not the keyword ``name=``.
    python: str | None = None

    @property
    def variable(self) -> str:
        return "TYPEVET_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def keyword(self) -> str:
        if self.python is not None:
            return self.python
        if self.home == "http":
            return f"http=tv.HttpSettings({self.name}=)"
        return f"{self.name}="

    @property
    def switch(self) -> bool:
        """A yes or no (a command line's ``--name`` and ``--no-name``)."""
        return self.read is _boolean

    def named(self, flags: bool) -> str:
        """Where a missing setting is given: its variable, and its flag when there are flags."""
        shown = self.flag if self.switch else f"{self.flag} {self.metavar or 'VALUE'}"
        return f"{shown} (or {self.variable})" if flags else self.variable


def _setting(name: str, home: Home, default: Any, read: Reader | None, **more: Any) -> Setting:
    return Setting(name=name, home=home, default=default, read=read, help=_HELP[name], **more)


def _chosen(name: str, home: Home, default: Any, choices: Sequence[str], **more: Any) -> Setting:
    return _setting(name, home, default, _choice(choices), choices=tuple(choices), **more)


#: What each setting is, in the words ``--help`` and the guide show.
_HELP: Final = {
    "backend": "the server's kind: which constructor builds the session (openai_compatible: "
    "any /chat/completions server with top_logprobs, its base URL the API's base)",
    "base_url": "the server's URL, or a comma-separated list of one model's replicas (a "
    "fleet); unset with llama_cpp: the embedded llama.cpp server starts here (about 10 s)",
    "local_model": "the embedded server's model (llama_cpp without a base URL): gemma3-270m, "
    "a small base model, or qwen2.5-coder-1.5b, an instruction model (the qwen extra)",
    "model": "the model each request names (required with vllm; unset: the server's own)",
    "top_k": "logprobs asked for on a first read (default: by the menu's size)",
    "on_missing": "an option outside the read's window: exact (widen until read), clamp (the "
    "lowest logprob, flagged) or error (default: llama_cpp exact, openai_compatible clamp)",
    "reproducible": "no prompt cache and one read at a time, so answers repeat bit for bit",
    "server": "how to start the embedded server (tv.ServerOptions)",
    "logprobs_mode": "what vLLM's logprobs are",
    "top_logprobs": "the first read's window (default 20, OpenAI's cap)",
    "max_batch_states": "the most states a judge_many batch request carries (at most the "
    "server's advertised cap)",
    "endpoint_slots": "with several URLs: the most reads one endpoint takes at once (default: "
    "what it declares)",
    "http": "how the client talks HTTP (tv.HttpSettings); its fields are settings of their own",
    "api_key": "a bearer token",
    "request_timeout": "seconds for one HTTP request (waiting for a pooled connection excluded)",
    "max_retries": "retries of a transient failure (connection errors, timeouts, 408, 429, "
    "5xx); 0: none",
    "retry": "the retries' backoff (tv.RetryPolicy); its max_retries is a setting of its own",
    "max_connections": "connections open at once to one server",
    "keepalive": "seconds an idle pooled connection is kept",
    "max_response_bytes": "the largest reply body taken",
    "verify_tls": "verify the server's TLS certificate",
    "time_slice": "seconds of the SDK's CPU work before its reads yield to the event loop; "
    "none: never yield",
    "trace_configs": "aiohttp trace hooks",
    "max_concurrency": "requests in flight at once, across every call of the session",
    "layout": "how prompts are framed: typevet, or the Jev gateway's fused or split",
    "controls": "the options' controls: letters (A, B, ...) or digits (0, 1, ...)",
    "noul_controls": "how a Noul is asked: words (Yes/No) or letters",
    "score_controls": "how a Score is asked: letters or scale (1..n)",
    "content_free": "content-free calibration of all questions, scores only, or off",
    "off_menu_threshold": "flag answers whose off-menu mass exceeds it; none: off",
    "raise_off_menu": "raise OffMenuError past off_menu_threshold instead of flagging",
    "max_images": "the most images one judgment or generation takes",
    "max_image_bytes": "the largest image taken",
    "prefix_reuse": "how a judgment's questions share a cached prefix",
    "max_tokens": "the token limit of a generation, unless the call gives one",
    "permutations": "read each question under K rotations of its options and average them (a "
    "mapping by question id: Python only)",
    "label_prior": "with permutations: divide out the positions' prior first",
    "calibration": "a calibration map (typevet-async calibrate) applied to every answer; as "
    "text, its file",
    "prior": "a fitted prior (typevet-async fit-prior) divided out of every answer; as text, "
    "its file",
    "cache": "a read cache (tv.MemoryReadCache, tv.SqliteReadCache; evaluate: --cache PATH)",
    "batch_calibration": "judge_many divides out each question's batch prior (the mean of its "
    "answers over the batch): a list whole, a stream after a warm-up; not with content_free "
    "or calibration",
    "batch_calibration_window": "a stream's warm-up under batch_calibration, in records (at "
    f"least {MIN_BATCH_ITEMS})",
}
_LLAMA: Final = frozenset({"llama_cpp"})
_ON_MISSING: Final = frozenset({"llama_cpp", "openai_compatible"})
_LOGPROBS_MODES: Final = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")
_MAX_RETRIES: Final = "http=tv.HttpSettings(retry=tv.RetryPolicy(max_retries=))"
_PROBABILITY: Final = _none_or(_number(float, "a number in [0, 1]", probability_or_none))
_LAYOUTS: Final = [layout.value for layout in Layout]

#: Every setting of a session, in the order the guide and ``--help`` show them.
SETTINGS: Final[tuple[Setting, ...]] = (
    # which server
    _chosen("backend", "connection", "llama_cpp", BACKENDS, python="Session.llama_cpp(...), ..."),
    _setting("base_url", "connection", None, _urls, metavar="URL", python="base_url"),
    _chosen(
        "local_model",
        "connection",
        DEFAULT_LOCAL_MODEL,
        sorted(LOCAL_MODELS),
        backends=_LLAMA,
        python="Session.local(model)",
    ),
    _setting("model", "connection", None, _text(non_empty_text), metavar="MODEL"),
    # how the backend reads
    _setting("top_k", "backend", None, _positive_int, backends=_LLAMA, metavar="K"),
    _chosen(
        "on_missing", "backend", BACKEND_DEFAULT, ("exact", "clamp", "error"), backends=_ON_MISSING
    ),
    _setting("reproducible", "backend", False, _boolean, backends=_LLAMA),
    _setting("server", "backend", None, None, backends=_LLAMA),
    _chosen(
        "logprobs_mode", "backend", "raw_logprobs", _LOGPROBS_MODES, backends=frozenset({"vllm"})
    ),
    _setting(
        "top_logprobs",
        "backend",
        None,
        _positive_int,
        backends=frozenset({"openai_compatible"}),
        metavar="N",
    ),
    _setting(
        "max_batch_states",
        "backend",
        DEFAULT_MAX_BATCH_STATES,
        _positive_int,
        backends=frozenset({"system_one"}),
        metavar="N",
    ),
    _setting("endpoint_slots", "backend", None, _positive_int, metavar="N"),
    # HTTP
    _setting("http", "http", None, None, python="http="),
    _setting("api_key", "http", None, _text(api_key), metavar="KEY"),
    _setting(
        "request_timeout", "http", DEFAULT_REQUEST_TIMEOUT, _positive_number, metavar="SECONDS"
    ),
    _setting(
        "max_retries",
        "http",
        DEFAULT_MAX_RETRIES,
        _number(int, "an integer >= 0", non_negative_int),
        metavar="N",
        python=_MAX_RETRIES,
    ),
    _setting("retry", "http", "tv.RetryPolicy()", None),
    _setting("max_connections", "http", DEFAULT_MAX_CONNECTIONS, _positive_int, metavar="N"),
    _setting("keepalive", "http", DEFAULT_KEEPALIVE, _positive_number, metavar="SECONDS"),
    _setting(
        "max_response_bytes", "http", DEFAULT_MAX_RESPONSE_BYTES, _positive_int, metavar="BYTES"
    ),
    _setting("verify_tls", "http", True, _boolean),
    _setting("time_slice", "http", SLICE, _none_or(_positive_number), metavar="SECONDS"),
    _setting("trace_configs", "http", (), None),
    # the session
    _setting("max_concurrency", "session", DEFAULT_MAX_CONCURRENCY, _positive_int, metavar="N"),
    _chosen("layout", "session", "typevet", _LAYOUTS, backends=FRAMING),
    _chosen("controls", "session", DEFAULT_CONTROLS, ("letters", "digits")),
    _chosen("noul_controls", "session", DEFAULT_NOUL_CONTROLS, ("letters", "words")),
    _chosen("score_controls", "session", DEFAULT_SCORE_CONTROLS, ("letters", "scale")),
    _chosen("content_free", "session", DEFAULT_CONTENT_FREE, ("off", "scores", "all")),
    _setting("off_menu_threshold", "session", None, _PROBABILITY, backends=FRAMING, metavar="P"),
    _setting("raise_off_menu", "session", False, _boolean),
    _setting("max_images", "session", DEFAULT_MAX_IMAGES, _positive_int, metavar="N"),
    _setting("max_image_bytes", "session", DEFAULT_MAX_IMAGE_BYTES, _positive_int, metavar="BYTES"),
    _chosen(
        "prefix_reuse", "session", "auto", ("auto", "first", "sequential", "off"), backends=FRAMING
    ),
    _setting("max_tokens", "session", DEFAULT_MAX_TOKENS, _positive_int, metavar="N"),
    _setting("permutations", "session", 1, _positive_int, metavar="K"),
    _setting("label_prior", "session", False, _boolean),
    _setting("calibration", "session", None, _calibration, metavar="FILE"),
    _setting("prior", "session", None, _prior, metavar="FILE"),
    _setting("cache", "session", None, None),
    _chosen(
        "batch_calibration", "session", DEFAULT_BATCH_CALIBRATION, ("off", "on"), backends=FRAMING
    ),
    _setting(
        "batch_calibration_window",
        "session",
        DEFAULT_BATCH_CALIBRATION_WINDOW,
        _number(int, f"an integer >= {MIN_BATCH_ITEMS}", calibration_window),
        backends=FRAMING,
        metavar="N",
    ),
)

#: `SETTINGS` by name.
BY_NAME: Final = {setting.name: setting for setting in SETTINGS}


def read_settings(
    environ: Mapping[str, str], flags: Mapping[str, Any] | None
) -> dict[str, tuple[Any, str]]:
    """The settings the ``TYPEVET_*`` variables give, each overridden by a command line's flag
    of the same setting (``flags``, by name; None: not given): value and where it came from,
    by name. An empty variable is not given.

    :raises ConfigurationError: a flag that names no setting, or a value its rule refuses,
        naming the variable or flag.
    """
    if flags is not None and not isinstance(flags, Mapping):
        raise ConfigurationError(f"flags must be a mapping of setting to value, got {flags!r}")
    textual = [setting for setting in SETTINGS if setting.read is not None]
    unknown = sorted(set(flags or {}) - {setting.name for setting in textual}, key=str)
    if unknown:
        names = sorted(setting.name for setting in textual)
        raise ConfigurationError(f"flags names no setting {unknown}: the settings are {names}")
    given: dict[str, tuple[Any, str]] = {}
    for setting in textual:
        assert setting.read is not None
        flag = (flags or {}).get(setting.name)
        # A variable is taken as it is (a key with a newline is refused, not trimmed).
        text: str | None = None if flag is None else str(flag)
        source = setting.variable if flag is None else setting.flag
        if text is None:
            text = environ.get(setting.variable) or None
        if text is not None:
            given[setting.name] = (setting.read(text, source), source)
    return given


def _shown(value: Any) -> str:
    return (
        "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def settings_table() -> str:
    """The configuration guide's table of every setting, from `SETTINGS`."""
    rows = [
        "| Python | variable | flag | default | applies to | what it is |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for setting in SETTINGS:
        text = setting.read is not None
        applies = "all" if setting.backends == _ALL else ", ".join(sorted(setting.backends))
        variable, flag = (f"`{setting.variable}`", f"`{setting.flag}`") if text else ("", "")
        default = f"`{_shown(setting.default)}`"
        cells = (f"`{setting.keyword}`", variable, flag, default, applies, setting.help)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


# -- the Python door: each constructor's keywords ------------------------------------------

#: A server's URL, or one model's replicas' (a fleet).
URLs = str | Sequence[str]
#: A command line's values of the settings, by name (None: no command line).
Flags = Mapping[str, Any] | None


class Common(TypedDict, total=False):
    """The keywords every `Session` constructor takes: the HTTP client, a fleet's slots and
    the `SessionSettings` (each a setting of `SETTINGS`)."""

    http: HttpSettings | None
    endpoint_slots: int | None
    max_concurrency: int
    layout: Layout | str
    controls: Controls
    noul_controls: NoulControls
    score_controls: ScoreControls
    content_free: ContentFree | bool
    off_menu_threshold: float | None
    raise_off_menu: bool
    max_images: int
    max_image_bytes: int
    prefix_reuse: PrefixReuse
    max_tokens: int
    permutations: Permutations
    label_prior: bool
    calibration: CalibrationMap | None
    prior: FittedPrior | None
    cache: ReadCache | None
    batch_calibration: BatchCalibration | bool
    batch_calibration_window: int


class Local(Common, total=False):
    """`Session.local`'s keywords."""

    top_k: int | None
    on_missing: Literal["exact", "clamp", "error"]
    reproducible: bool
    server: ServerOptions | None


class LlamaCpp(Local, total=False):
    """`Session.llama_cpp`'s keywords."""

    model: str | None


class Vllm(Common, total=False):
    """`Session.vllm`'s keywords."""

    model: Required[str]
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"]


class Chat(Common, total=False):
    """`Session.openai_compatible`'s keywords."""

    model: str | None
    top_logprobs: int | None
    on_missing: Literal["exact", "clamp", "error"]


class Remote(Common, total=False):
    """`Session.openai_decisions`' keywords."""

    model: str | None


class SystemOne(Remote, total=False):
    """`Session.system_one`'s keywords."""

    max_batch_states: int
