"""``typevet-async serve``: a System One gateway (``POST /v1/systemone``) in front of a session.

An I/O shell over `typevet_async._core.systemone`. Built on **aiohttp.web**: aiohttp is already
the SDK's HTTP stack (the backends' client), so the gateway adds no server framework, runs on
the session's own event loop and shares its one dependency; aiohttp's server is well kept
(graceful shutdown, body limits, keep-alive) and needs no ASGI layer in between.

One `tv.Session` is opened in the app's startup and closed in its cleanup; every request is
judged on it. Routes:

- ``POST /v1/systemone``: a System One request (JSON, or ``multipart/form-data`` as the
  official client sends a request with image assets: a ``request`` part and one part per
  image; ``Content-Encoding`` zstd, gzip or identity) -> ``session.judge`` -> a System One
  response. Its ``model`` is the model the
  session serves: its pin, else the first model id the server's probe lists, else the
  request's own ``model``. A request's ``model`` is not checked against it: the gateway serves
  one model, whatever name a client sends (the official client sends its default name).
- ``GET /v1/models``: the System One model list, one entry: the served model; its
  ``release_date`` is a placeholder, the UTC date the gateway's probe succeeded.
- ``GET /healthz`` (always 200), ``GET /readyz`` (200 once the probe succeeded, else 503),
  ``GET /metrics`` (Prometheus, if ``prometheus_client`` is installed). These three take no
  key: they are for the orchestrator and the scraper.

Bearer keys (from a file, one per line, and/or a comma-separated environment variable) are
compared with `hmac.compare_digest` against every key; none configured means auth is off, and
the startup log line says so as a warning. Errors always have the System One shape
``{"detail": [{"loc", "msg", "type", "input"}]}``; a 500 never carries a traceback.
Access log lines (logger ``typevet_async.gateway.access``) carry method, path, status and
duration only: never the state, the questions or a key.

Shutdown (SIGTERM or SIGINT, `shutdown`): the listening socket closes at once, so a new
connection is refused; idle keep-alive connections close; requests in flight (judged or
waiting for a slot) finish and get their answers for up to ``shutdown_timeout`` seconds; past
it, the judgments still running are cancelled and each answers 503 (``Retry-After: 1``,
``Connection: close``); then the session closes and ``serve`` returns (the command exits 0).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import hmac
import logging
import math
import resource
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, cast

import anyio
import anyio.to_thread
import attrs
import orjson
from aiohttp import web

import typevet_async as tv
from typevet_async._convert import converter
from typevet_async._core.decoding import (
    BadEncodingError,
    BodyTooLargeError,
    BudgetExceededError,
    CpuClock,
    DecodeBudget,
    DecodeError,
    check_json_budget,
    decompress,
)
from typevet_async._core.systemone import (
    SystemOneCall,
    SystemOneValidationError,
    media_type,
    request_from_system_one,
    request_from_system_one_multipart,
    response_to_system_one,
    validation_detail,
)

try:
    import prometheus_client
except ImportError:  # pragma: no cover - without the serve extra
    prometheus_client = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_KEYS_ENV",
    "DEFAULT_MAX_BODY_BYTES",
    "BadEncodingError",
    "BodyTooLargeError",
    "GatewayConfig",
    "NoKeysError",
    "build_app",
    "decode_request",
    "decompress",
    "load_keys",
    "running",
    "serve",
    "shutdown",
]

log = logging.getLogger("typevet_async.gateway")
access_log = logging.getLogger("typevet_async.gateway.access")

DEFAULT_KEYS_ENV: Final = "TYPEVET_SERVE_KEYS"
DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024
#: The automatic queue's floor: a client's connection pool (commonly 32 to 64) is never shed.
MIN_AUTO_QUEUE: Final = 64
#: The automatic queue before a drain rate has been measured.
DEFAULT_AUTO_QUEUE: Final = 256
#: The automatic queue's ceiling.
MAX_AUTO_QUEUE: Final = 4096
#: Judgments the drain rate is measured over (the most recent).
_DRAIN_WINDOW: Final = 64


@attrs.frozen
class GatewayConfig:
    """How the gateway serves."""

    #: Bearer keys; empty: auth is off.
    keys: tuple[str, ...] = ()
    #: Requests judged at once.
    max_in_flight: int = 8
    #: Requests that may wait for a slot; one more is a 429. None (the default): as many as the
    #: measured drain rate serves within ``timeout`` (at least `MIN_AUTO_QUEUE`, and
    #: `DEFAULT_AUTO_QUEUE` before anything has been measured): a request is shed only when it
    #: would wait past its timeout anyway.
    max_queue: int | None = None
    #: Seconds per request, waiting for a slot included (None: no limit) -> 504.
    timeout: float | None = 60.0
    #: The largest body, compressed or not (decompressed bytes count too) -> 413.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Questions a request may ask -> 422 (OpenAI's Decisions API allows 400).
    max_questions: int = 400
    #: Image assets a request may carry -> 422.
    max_assets: int = 32
    #: JSON values a body may hold -> 422.
    max_items: int = 200_000
    #: Deepest nesting of a body's JSON -> 422 (a deeper state is no ticket).
    max_depth: int = 128
    #: CPU seconds one body's decode may use -> 422.
    decode_cpu_seconds: float = 2.0
    #: Bodies decoded at once, each in a worker thread off the event loop.
    decode_threads: int = 2
    #: Seconds a connection may go without sending a complete request head (idle keep-alive
    #: connections included) -> closed.
    idle_timeout: float = 15.0
    #: Seconds a request's body may take to arrive -> 408.
    body_timeout: float = 30.0
    #: Open connections at once; one more is answered 503 and closed at once. None: half the
    #: process's file-descriptor limit (at least 16), so accepting is never what runs out.
    max_connections: int | None = None

    def connection_cap(self) -> int:
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(16, soft // 2) if soft != resource.RLIM_INFINITY else 4096

    #: Seconds graceful shutdown waits for in-flight requests.
    shutdown_timeout: float = 30.0
    #: Seconds between probe attempts until the server is ready.
    probe_interval: float = 1.0

    def decode_budget(self) -> DecodeBudget:
        """What one body's decode may use: a ``request`` part and one part per asset."""
        return DecodeBudget(
            max_bytes=self.max_body_bytes,
            max_items=self.max_items,
            max_depth=self.max_depth,
            max_parts=self.max_assets + 1,
            cpu_seconds=self.decode_cpu_seconds,
        )


class NoKeysError(tv.ConfigurationError):
    """A key source was named but yields no key: auth is off only when asked for."""


def load_keys(
    keys_file: Path | None, keys_env: str | None, environ: Mapping[str, str]
) -> tuple[str, ...]:
    """The keys of ``keys_file`` (one per line, blank lines and ``#`` comments skipped) and of
    the variable ``keys_env`` (comma-separated).

    :raises OSError: the file cannot be read.
    :raises NoKeysError: the file or the variable is named but holds no key (an empty file,
        one of blank lines, an unset or blank variable): starting with auth off because a key
        file came out empty is the mistake this refuses.
    """
    keys: list[str] = []
    if keys_file is not None:
        from_file = [
            line.strip()
            for line in keys_file.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
        if not from_file:
            raise NoKeysError(
                f"--keys-file {keys_file} holds no key (only blank lines or comments)"
            )
        keys.extend(from_file)
    if keys_env:
        from_env = [k.strip() for k in environ.get(keys_env, "").split(",") if k.strip()]
        if not from_env:
            state = "is not set" if keys_env not in environ else "holds no key"
            raise NoKeysError(f"--keys-env {keys_env}: the variable {state}")
        keys.extend(from_env)
    return tuple(dict.fromkeys(keys))


# -- responses ------------------------------------------------------------------------------


def _error(
    status: int,
    loc: list[str | int],
    msg: str,
    kind: str,
    *,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return _json(status, {"detail": [validation_detail(loc, msg, kind)]}, headers=headers)


def _json(status: int, body: Any, *, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


#: SDK errors -> (status, detail type); the first match wins (subclasses before bases).
_ERROR_STATUS: Final[tuple[tuple[type[BaseException], int, str], ...]] = (
    (tv.UnsupportedTemplateError, 501, "unsupported_template"),
    (tv.DeadlineExceededError, 504, "timeout"),
    (tv.RequestTimeoutError, 504, "upstream_timeout"),
    (tv.InvalidInputError, 422, "value_error"),
    (tv.ServerError, 502, "upstream_error"),
    (tv.TransportError, 502, "upstream_unreachable"),
    (tv.ProtocolError, 502, "upstream_protocol_error"),
    (tv.OffMenuError, 502, "off_menu"),
    (tv.SessionStateError, 503, "unavailable"),
)


# -- the application ------------------------------------------------------------------------


@attrs.define
class _Metrics:
    requests: Any
    latency: Any
    errors: Any
    reads: Any
    in_flight: Any
    registry: Any

    @classmethod
    def create(cls) -> _Metrics | None:
        if prometheus_client is None:  # pragma: no cover
            return None
        registry = prometheus_client.CollectorRegistry()
        p = prometheus_client
        return cls(
            requests=p.Counter(
                "typevet_gateway_requests", "Requests by route and status", ["route", "status"],
                registry=registry,
            ),
            latency=p.Histogram(
                "typevet_gateway_request_seconds", "Request latency by route", ["route"],
                registry=registry,
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            ),
            errors=p.Counter(
                "typevet_gateway_errors", "Failed judgments by error type", ["type"],
                registry=registry,
            ),
            reads=p.Counter(
                "typevet_gateway_upstream_reads", "Scoring reads sent upstream", registry=registry
            ),
            in_flight=p.Gauge(
                "typevet_gateway_in_flight", "Requests being judged", registry=registry
            ),
            registry=registry,
        )  # fmt: skip


@attrs.define
class _State:
    config: GatewayConfig
    slots: asyncio.Semaphore
    #: Bodies decoded at once (worker threads).
    decoders: anyio.CapacityLimiter
    metrics: _Metrics | None
    #: Requests judged or waiting for a slot.
    admitted: int = 0
    ready: bool = False
    served_model: str | None = None
    ready_date: str | None = None
    probe_task: asyncio.Task[None] | None = None
    #: The handler tasks judging now (those the shutdown cuts off past its timeout).
    judging: set[asyncio.Task[Any]] = attrs.Factory(set)
    #: Set once the shutdown timeout passed: the judgments still running answer 503.
    cut_off: bool = False
    #: When the most recent judgments ended (monotonic seconds), for the drain rate.
    finished: collections.deque[float] = attrs.Factory(
        lambda: collections.deque(maxlen=_DRAIN_WINDOW)
    )

    def drain_rate(self) -> float | None:
        """Judgments ended per second over the recent window (None: too few to tell)."""
        if len(self.finished) < 2:
            return None
        span = max(time.monotonic(), self.finished[-1]) - self.finished[0]
        return (len(self.finished) - 1) / span if span > 0 else None

    def queue_limit(self) -> int:
        """Requests that may wait for a slot now."""
        if self.config.max_queue is not None:
            return self.config.max_queue
        rate = self.drain_rate()
        if rate is None or self.config.timeout is None:
            return DEFAULT_AUTO_QUEUE
        return int(min(MAX_AUTO_QUEUE, max(MIN_AUTO_QUEUE, rate * self.config.timeout)))

    def retry_after(self) -> float:
        """Seconds until a place in the queue is likely free, from the drain rate (1 s before
        anything is measured), between 1 and 60."""
        rate = self.drain_rate()
        if rate is None:
            return 1.0
        excess = self.admitted - (self.config.max_in_flight + self.queue_limit()) + 1
        return min(60.0, max(1.0, excess / rate))


SESSION: Final = web.AppKey("session", tv.Session)
STATE: Final = web.AppKey("state", _State)


def _authorized(header: str | None, keys: Sequence[str]) -> bool:
    if header is None:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    # aiohttp reads header bytes that are not UTF-8 as surrogates: they can match no key
    given = token.strip().encode("utf-8", "surrogateescape")
    matched = False
    for key in keys:  # every key is compared: the time does not tell which one matched
        matched |= hmac.compare_digest(given, key.encode())
    return matched


def _route_of(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def _access(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    state = request.app[STATE]
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as error:
        status = error.status
        raise
    except asyncio.CancelledError:
        status = 499  # the client went away
        raise
    finally:
        elapsed = time.perf_counter() - started
        access_log.info("%s %s %d %.1fms", request.method, request.path, status, elapsed * 1000)
        if state.metrics is not None:
            route = _route_of(request)
            state.metrics.requests.labels(route, str(status)).inc()
            state.metrics.latency.labels(route).observe(elapsed)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own HTTP errors (404, 405, ...) and any bug, in the System One error shape."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        kind = "too_large" if error.status == 413 else "http_error"
        return _error(error.status, ["request"], error.reason, kind)
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return _error(500, ["server"], "internal server error", "internal_error")


@web.middleware
async def _auth(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    keys = request.app[STATE].config.keys
    guarded = keys and request.path.startswith("/v1/")
    if guarded and not _authorized(request.headers.get("Authorization"), keys):
        return _error(
            401,
            ["header", "authorization"],
            "a valid bearer key is required: Authorization: Bearer KEY",
            "unauthorized",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return await handler(request)


async def _read_raw(request: web.Request, cap: int, body_timeout: float) -> bytes | web.Response:
    """The body as it came (compressed or not), at most ``cap`` bytes."""
    too_large = _error(413, ["body"], f"the body exceeds the {cap}-byte limit", "too_large")
    if request.content_length is not None and request.content_length > cap:
        return too_large
    try:
        async with asyncio.timeout(body_timeout):
            return await request.read()  # client_max_size is ``cap``: aiohttp raises 413 past it
    except web.HTTPRequestEntityTooLarge:
        return too_large
    except TimeoutError:
        return _error(
            408, ["body"], f"the body did not arrive within {body_timeout:g} s", "timeout",
            headers={"Connection": "close"},
        )  # fmt: skip


def decode_request(
    raw: bytes, encoding: str, content_type: str, config: GatewayConfig
) -> tuple[SystemOneCall, list[tv.Image]] | web.Response:
    """A body as the request it holds and its images, decoded within ``config``'s budget:
    pure and CPU-bound, so the gateway runs it in a worker thread (the event loop serves
    everyone else meanwhile), and every step stops at a limit instead of running long.

    :raises DecodeError: past the budget, or an encoding that does not decode.
    :raises SystemOneValidationError: not a System One request, or past a count limit.
    :raises InvalidInputError: an image that is not one.
    """
    budget = config.decode_budget()
    clock = CpuClock(budget.cpu_seconds)
    body = decompress(raw, encoding, budget, clock)
    media = media_type(content_type)
    if media == "multipart/form-data":
        call = request_from_system_one_multipart(
            body, content_type, budget=budget, clock=clock, max_assets=config.max_assets,
            max_questions=config.max_questions,
        )  # fmt: skip
    elif media.startswith("multipart/"):
        return _error(
            415, ["header", "content-type"],
            f"Content-Type {media!r} is not accepted: send application/json or "
            "multipart/form-data",
            "unsupported_media_type",
        )  # fmt: skip
    else:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise SystemOneValidationError(
                [validation_detail(["body"], f"not valid JSON: {error}", "json_invalid")]
            ) from None
        check_json_budget(data, budget, clock)
        call = request_from_system_one(
            data, max_assets=config.max_assets, max_questions=config.max_questions
        )
    clock.check()
    return call, [tv.Image.from_bytes(image, mime) for mime, image in call.images]


def _decode_error(error: DecodeError) -> web.Response:
    if isinstance(error, BodyTooLargeError):
        return _error(413, ["body"], str(error), "too_large")
    if isinstance(error, BadEncodingError):
        return _error(415, ["header", "content-encoding"], str(error), "unsupported_encoding")
    limit = error.limit if isinstance(error, BudgetExceededError) else "body"
    return _json(
        422,
        {
            "detail": [
                validation_detail(["body"], str(error), "budget_exceeded", None, {"limit": limit})
            ]
        },
    )


async def _systemone(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    session = request.app[SESSION]
    config = state.config
    raw = await _read_raw(request, config.max_body_bytes, config.body_timeout)
    if isinstance(raw, web.Response):
        return raw
    try:
        decoded = await anyio.to_thread.run_sync(
            decode_request,
            raw,
            request.headers.get("Content-Encoding", ""),
            request.headers.get("Content-Type", ""),
            config,
            limiter=state.decoders,
        )
    except DecodeError as error:
        if state.metrics is not None:
            state.metrics.errors.labels(type(error).__name__).inc()
        return _decode_error(error)
    except SystemOneValidationError as error:
        if state.metrics is not None:
            state.metrics.errors.labels("SystemOneValidationError").inc()
        return _json(422, {"detail": error.detail})
    except tv.InvalidInputError as error:
        return _sdk_error(state, error)
    if isinstance(decoded, web.Response):
        return decoded
    call, images = decoded
    if state.admitted >= config.max_in_flight + state.queue_limit():
        wait = state.retry_after()
        retry = {"Retry-After": str(math.ceil(wait)), "retry-after-ms": str(round(wait * 1000))}
        return _error(
            429, ["server"], f"too many requests in flight: retry in {wait:.1f} s",
            "rate_limited", headers=retry,
        )  # fmt: skip
    state.admitted += 1
    task = asyncio.current_task()
    if task is not None:
        state.judging.add(task)
    try:
        async with asyncio.timeout(config.timeout):
            async with state.slots:
                if state.metrics is not None:
                    state.metrics.in_flight.inc()
                try:
                    judgment = await session.judge(call.state, call.questions, images=images)
                finally:
                    if state.metrics is not None:
                        state.metrics.in_flight.dec()
    except asyncio.CancelledError:
        if not state.cut_off or task is None:
            raise  # the client went away (or a cancellation that is not the shutdown's)
        task.uncancel()
        if state.metrics is not None:
            state.metrics.errors.labels("ShutdownCutOff").inc()
        return _error(
            503, ["server"],
            f"the gateway shut down before the judgment ended (it waits "
            f"{config.shutdown_timeout}s for in-flight requests): retry elsewhere or later",
            "unavailable", headers={"Retry-After": "1", "Connection": "close"},
        )  # fmt: skip
    except TimeoutError as error:
        if isinstance(error, tv.TypevetError):
            return _sdk_error(state, error)
        if state.metrics is not None:
            state.metrics.errors.labels("Timeout").inc()
        return _error(
            504, ["server"], f"the request outlived the gateway's {config.timeout}s timeout",
            "timeout",
        )  # fmt: skip
    except tv.TypevetError as error:
        return _sdk_error(state, error)
    finally:
        state.admitted -= 1
        state.finished.append(time.monotonic())
        if task is not None:
            state.judging.discard(task)
    if state.metrics is not None:
        state.metrics.reads.inc(judgment.usage.reads)
    model = state.served_model or _served_model(session) or call.model
    return _json(
        200,
        response_to_system_one(
            judgment,
            model,
            score_criteria=call.score_criteria,
            extension=_extension(judgment),
        ),
    )


#: Upstream statuses that refuse the request as it was built from the client's input (vLLM:
#: "not a multimodal model" for images; llama.cpp: a prompt past the context): 422, the
#: request's own problem, not a 5xx that System One clients retry (they retry every 5xx).
_UPSTREAM_REFUSALS: Final = frozenset({400, 413, 422})


def _upstream_message(body: str) -> str:
    """What a model server's error body says: its ``error.message`` (OpenAI's shape, both
    servers'), else the body's start."""
    with contextlib.suppress(orjson.JSONDecodeError):
        data = orjson.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message
    return body[:500]


def _sdk_error(state: _State, error: BaseException) -> web.Response:
    if state.metrics is not None:
        state.metrics.errors.labels(type(error).__name__).inc()
    if isinstance(error, tv.ServerError) and error.status in _UPSTREAM_REFUSALS:
        return _error(
            422, ["body"],
            f"the model server refused the request (HTTP {error.status}): "
            f"{_upstream_message(error.body)}",
            "upstream_refused",
        )  # fmt: skip
    for kind, status, detail_type in _ERROR_STATUS:
        if isinstance(error, kind):
            loc: list[str | int] = ["body"] if status == 422 else ["upstream"]
            question_id = getattr(error, "question_id", None)
            if status == 422 and question_id is not None:
                loc = ["body", "questions", str(question_id)]
            message = f"{type(error).__name__}: {error}"
            if status >= 500:
                # The details name the model server's address: the log has them, the client
                # gets what failed and what it means for it.
                log.warning("judgment failed: %s", message)
                message = _upstream_failure(error, detail_type)
            return _error(status, loc, message, detail_type)
    log.error("judgment failed: %s", type(error).__name__)
    return _error(500, ["server"], "internal server error", "internal_error")


def _extension(judgment: tv.Judgment) -> dict[str, Any]:
    """The ``typevet`` extension of a response: the judgment's usage and diagnostics, less
    the endpoint that answered (an upstream address behind the gateway)."""
    extension: dict[str, Any] = converter.unstructure(judgment)
    for diagnostics in extension.get("diagnostics", {}).values():
        diagnostics.pop("endpoint", None)
    return extension


def _upstream_failure(error: BaseException, detail_type: str) -> str:
    """What a client is told of a failure behind the gateway: its kind, never the upstream's
    address or its text (both are in the gateway's log)."""
    status = getattr(error, "status", None)
    said = f" (HTTP {status})" if isinstance(status, int) else ""
    what = {
        "upstream_error": f"the model server answered with an error{said}",
        "upstream_unreachable": "the model server could not be reached",
        "upstream_protocol_error": "the model server's reply was not what its protocol says",
        "upstream_timeout": "the model server did not answer in time",
        "off_menu": "the model's answer fell off the question's options",
        "unsupported_template": "the model server's chat template cannot be judged",
        "timeout": "the judgment outlived its deadline",
        "unavailable": "the gateway's session is not open",
    }.get(detail_type, "the judgment failed")
    return f"{type(error).__name__}: {what}; retry later (details are in the gateway's log)"


def model_alias(name: str | None) -> str | None:
    """The name clients see for a served model: a model id that is a local file's path (the
    embedded llama.cpp server lists its GGUF's) is shown by its file name, without ``.gguf``."""
    if name is None or ("/" not in name and "\\" not in name and not name.endswith(".gguf")):
        return name
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return base.removesuffix(".gguf") or None


def _served_model(session: tv.Session) -> str | None:
    return model_alias(session.backend.model)


async def _models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if not state.ready:
        return _error(503, ["server"], "the model server is not ready yet", "unavailable")
    session = request.app[SESSION]
    name = state.served_model or "default"
    backend = type(session.backend).__name__
    return _json(
        200,
        {
            "models": [
                {
                    "name": name,
                    "description": f"{name}, served by typevet-async through {backend}",
                    "release_date": state.ready_date,
                }
            ]
        },
    )


async def _healthz(request: web.Request) -> web.StreamResponse:
    return _json(200, {"status": "ok"})


async def _readyz(request: web.Request) -> web.StreamResponse:
    if request.app[STATE].ready:
        return _json(200, {"status": "ready"})
    return _error(503, ["server"], "the model server has not been probed yet", "unavailable")


async def _metrics(request: web.Request) -> web.StreamResponse:
    metrics = request.app[STATE].metrics
    if metrics is None:  # pragma: no cover
        return _error(404, ["request"], "metrics need prometheus_client", "not_found")
    assert prometheus_client is not None
    return web.Response(
        body=prometheus_client.generate_latest(metrics.registry),
        headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST},
    )


#: Longest wait between two probes of a server that is not ready.
_PROBE_BACKOFF_MAX: Final = 30.0


async def _probe_until_ready(app: web.Application) -> None:
    """Probe until the server is ready, however long: a refusal (a template the SDK cannot
    judge, a model that is not served) is logged and probed again too, with backoff, since
    whoever runs the model server may fix it while the gateway runs."""
    state, session = app[STATE], app[SESSION]
    wait = state.config.probe_interval
    while True:
        try:
            probe = await session.probe()
        except tv.TypevetError as error:
            refused = not isinstance(error, tv.BackendError)
            log.log(
                logging.ERROR if refused else logging.WARNING,
                "probe %s, retrying in %.1fs: %s: %s",
                "refused (not ready)" if refused else "failed", wait, type(error).__name__, error,
            )  # fmt: skip
            await asyncio.sleep(wait)
            wait = min(wait * 2, max(_PROBE_BACKOFF_MAX, state.config.probe_interval))
            continue
        state.served_model = model_alias(
            session.backend.model or (probe.model_ids[0] if probe.model_ids else None)
        )
        state.ready_date = datetime.datetime.now(datetime.UTC).date().isoformat()
        state.ready = True
        log.info("ready: serving model %r", state.served_model)
        return


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state, session = app[STATE], app[SESSION]
    await session.open()
    state.probe_task = asyncio.create_task(_probe_until_ready(app))
    try:
        yield
    finally:
        state.probe_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await state.probe_task
        await session.aclose()


def build_app(session: tv.Session, config: GatewayConfig | None = None) -> web.Application:
    """The gateway's application over ``session`` (unopened: the app opens and closes it)."""
    config = config or GatewayConfig()
    app = web.Application(
        client_max_size=config.max_body_bytes, middlewares=[_access, _errors, _auth]
    )
    app[SESSION] = session
    app[STATE] = _State(
        config,
        asyncio.Semaphore(config.max_in_flight),
        anyio.CapacityLimiter(config.decode_threads),
        _Metrics.create(),
    )
    app.cleanup_ctx.append(_lifecycle)
    app.router.add_post("/v1/systemone", _systemone)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    return app


#: Seconds aiohttp itself waits for a handler past the gateway's own cut-off: a backstop (by
#: then every judgment has answered 503; only a request whose body is still arriving is left).
_SHUTDOWN_GRACE: Final = 5.0
_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
#: Seconds the server reads and drops an unread body after answering (aiohttp's default: 10).
_LINGERING_TIME: Final = 2.0


def runner_options(config: GatewayConfig) -> dict[str, Any]:
    """The `web.AppRunner` options the gateway needs: it decompresses bodies itself (with a
    cap) and writes its own access log."""
    return {
        "auto_decompress": False,
        "access_log": None,
        "shutdown_timeout": config.shutdown_timeout + _SHUTDOWN_GRACE,
        # a connection that sends no complete request head for this long is closed: an idle
        # keep-alive one, and one that trickles its head (aiohttp's default is an hour)
        "keepalive_timeout": config.idle_timeout,
        # after an error answered before its body was read (a 408, a 413), the rest of the
        # body is read and dropped for at most this long, then the connection closes
        "lingering_time": _LINGERING_TIME,
        # a client that goes away cancels its judgment (its reads stop; the log says 499)
        "handler_cancellation": True,
    }


_BUSY_BODY: Final = orjson.dumps(
    {"detail": [validation_detail(
        ["server"], "too many open connections: retry shortly", "unavailable"
    )]}
)  # fmt: skip
#: What a connection past the cap gets before it is closed.
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Type: application/json\r\nContent-Length: "
    + str(len(_BUSY_BODY)).encode()
    + b"\r\n\r\n"
    + _BUSY_BODY
)


class _Busy(asyncio.Protocol):
    """A connection past the cap: answered 503 and closed, never read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_BUSY)
        transport.close()


class _ConnectionCap:
    """The server's protocol factory, at most ``cap`` connections open at once."""

    def __init__(self, server: web.Server, cap: int) -> None:
        self.server, self.cap = server, cap

    def __call__(self) -> asyncio.BaseProtocol:
        if len(self.server.connections) >= self.cap:
            return _Busy()
        return self.server()


class _Runner(web.AppRunner):
    """An `AppRunner` whose sites accept at most ``cap`` connections at once."""

    def __init__(self, app: web.Application, cap: int, **options: Any) -> None:
        super().__init__(app, **options)
        self.cap = cap

    @property
    def server(self) -> web.Server | None:
        inner = super().server
        # the sites call it as their protocol factory; a server of its own duck type
        return None if inner is None else cast("web.Server", _ConnectionCap(inner, self.cap))


def app_runner(app: web.Application, config: GatewayConfig) -> web.AppRunner:
    """The runner the gateway serves ``app`` with: its options, and the connection cap."""
    return _Runner(app, config.connection_cap(), **runner_options(config))


@contextlib.asynccontextmanager
async def running(
    session: tv.Session, config: GatewayConfig | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[str]:
    """The gateway over ``session`` on a free port of ``host``, in this process and this event
    loop (for tests, benchmarks, or embedding it beside other work): its URL while the block
    runs; cleaned up (the session closed) when it ends. No signal handling: that is `serve`'s."""
    config = config or GatewayConfig()
    runner = app_runner(build_app(session, config), config)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, 0).start()
        yield _bound_url(runner)
    finally:
        await runner.cleanup()


def _bound_url(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def shutdown(runner: web.AppRunner, state: _State) -> None:
    """Stop the gateway gracefully: close the listening sockets (a new connection is refused
    from here on) and idle keep-alive connections, let the requests in flight finish for up to
    ``shutdown_timeout`` seconds, then cut the judgments still running off (each answers 503
    with ``Retry-After`` and ``Connection: close``), and close the session."""
    timeout = state.config.shutdown_timeout
    log.info("shutting down: draining %d requests in flight (up to %ss)", state.admitted, timeout)
    cleanup = asyncio.create_task(runner.cleanup())
    done, _ = await asyncio.wait({cleanup}, timeout=timeout)
    if not done:
        state.cut_off = True
        log.warning("shutdown timeout: cutting %d judgments off with a 503", len(state.judging))
        for task in list(state.judging):
            task.cancel()
    await cleanup


async def serve(
    session: tv.Session,
    config: GatewayConfig,
    host: str,
    port: int,
    *,
    started: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT (or until ``stop`` is set), then `shutdown`.

    ``started`` is called with the URL once the port listens (the bound port, when ``port`` is
    0). A second signal during the shutdown is logged and changes nothing: the shutdown
    timeout already bounds it.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()

    def signalled(signum: signal.Signals) -> None:
        if stop.is_set():
            log.warning("%s: the shutdown is already under way", signum.name)
        else:
            log.info("%s: shutting down", signum.name)
            stop.set()

    for signum in _SIGNALS:  # from the start: a signal while the session opens stops it too
        loop.add_signal_handler(signum, signalled, signum)
    try:
        app = build_app(session, config)
        runner = app_runner(app, config)
        await runner.setup()
        try:
            if not stop.is_set():
                await web.TCPSite(runner, host, port).start()
                _log_serving(_bound_url(runner), config)
                if started is not None:
                    started(_bound_url(runner))
                await stop.wait()
        finally:
            await shutdown(runner, app[STATE])
    finally:
        for signum in _SIGNALS:
            loop.remove_signal_handler(signum)
    log.info("stopped")


def _log_serving(url: str, config: GatewayConfig) -> None:
    if config.keys:
        log.info("serving System One on %s (%d bearer keys)", url, len(config.keys))
    else:
        log.warning(
            "serving System One on %s WITH AUTH OFF: no bearer keys configured, anyone who "
            "reaches this port can use the model",
            url,
        )
