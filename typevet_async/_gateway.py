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
import contextlib
import datetime
import hmac
import logging
import signal
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import orjson
from aiohttp import web

import typevet_async as tv
from typevet_async._convert import converter
from typevet_async._core.systemone import (
    SystemOneCall,
    SystemOneValidationError,
    media_type,
    request_from_system_one,
    request_from_system_one_multipart,
    response_to_system_one,
    validation_detail,
)

try:  # the official client compresses its bodies with zstd when it can
    if sys.version_info >= (3, 14):
        from compression.zstd import ZstdDecompressor, ZstdError
    else:
        from backports.zstd import ZstdDecompressor, ZstdError
    HAVE_ZSTD = True
except ImportError:  # pragma: no cover - without the serve extra
    HAVE_ZSTD = False

try:
    import prometheus_client
except ImportError:  # pragma: no cover - without the serve extra
    prometheus_client = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_KEYS_ENV",
    "DEFAULT_MAX_BODY_BYTES",
    "GatewayConfig",
    "build_app",
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
#: Decompressed bytes produced per step while inflating a body (the cap is checked after each).
_CHUNK: Final = 64 * 1024


@attrs.frozen
class GatewayConfig:
    """How the gateway serves."""

    #: Bearer keys; empty: auth is off.
    keys: tuple[str, ...] = ()
    #: Requests judged at once.
    max_in_flight: int = 8
    #: Requests that may wait for a slot; one more is a 429.
    max_queue: int = 16
    #: Seconds per request, waiting for a slot included (None: no limit) -> 504.
    timeout: float | None = 60.0
    #: The largest body, compressed or not (decompressed bytes count too) -> 413.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Seconds graceful shutdown waits for in-flight requests.
    shutdown_timeout: float = 30.0
    #: Seconds between probe attempts until the server is ready.
    probe_interval: float = 1.0


def load_keys(
    keys_file: Path | None, keys_env: str | None, environ: Mapping[str, str]
) -> tuple[str, ...]:
    """The keys of ``keys_file`` (one per line, blank lines and ``#`` comments skipped) and of
    the variable ``keys_env`` (comma-separated).

    :raises OSError: the file cannot be read.
    """
    keys: list[str] = []
    if keys_file is not None:
        for line in keys_file.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    if keys_env:
        keys.extend(k.strip() for k in environ.get(keys_env, "").split(",") if k.strip())
    return tuple(dict.fromkeys(keys))


class BodyTooLargeError(Exception):
    """A body (or what it decompresses to) beyond the cap."""


class BadEncodingError(Exception):
    """A ``Content-Encoding`` not accepted, or a body that does not decode."""


def decompress(body: bytes, encoding: str, cap: int) -> bytes:
    """``body`` decoded from ``encoding`` (zstd, gzip or identity), at most ``cap`` bytes.

    Inflation stops as soon as the output passes ``cap``: a zip bomb costs ``cap`` bytes.

    :raises BodyTooLargeError: the output would pass ``cap``.
    :raises BadEncodingError: another encoding, or a body that is not of its encoding.
    """
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    out = bytearray()
    if encoding in ("gzip", "x-gzip"):
        inflater = zlib.decompressobj(wbits=31)
        data = body
        try:
            while data and not inflater.eof:
                out += inflater.decompress(data, _CHUNK)
                if len(out) > cap:
                    raise BodyTooLargeError
                data = inflater.unconsumed_tail
            out += inflater.flush()
        except zlib.error as error:
            raise BadEncodingError(f"not a gzip body: {error}") from None
        if not inflater.eof:
            raise BadEncodingError("the gzip body is cut short")
    elif encoding == "zstd" and HAVE_ZSTD:
        data = body
        try:
            while True:
                unzstd = ZstdDecompressor()
                while not unzstd.eof:
                    out += unzstd.decompress(data, _CHUNK)
                    data = b""
                    if len(out) > cap:
                        raise BodyTooLargeError
                    if unzstd.needs_input:
                        break
                if not unzstd.eof:
                    raise BadEncodingError("the zstd body is cut short")
                data = unzstd.unused_data  # a body may hold several frames
                if not data:
                    break
        except ZstdError as error:
            raise BadEncodingError(f"not a zstd body: {error}") from None
    else:
        accepted = "zstd, gzip or identity" if HAVE_ZSTD else "gzip or identity"
        raise BadEncodingError(f"Content-Encoding {encoding!r} is not accepted: send {accepted}")
    if len(out) > cap:
        raise BodyTooLargeError
    return bytes(out)


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


SESSION: Final = web.AppKey("session", tv.Session)
STATE: Final = web.AppKey("state", _State)


def _authorized(header: str | None, keys: Sequence[str]) -> bool:
    if header is None:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    given = token.strip().encode()
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


async def _read_body(request: web.Request, cap: int) -> bytes | web.Response:
    too_large = _error(413, ["body"], f"the body exceeds the {cap}-byte limit", "too_large")
    if request.content_length is not None and request.content_length > cap:
        return too_large
    try:
        raw = await request.read()  # client_max_size is ``cap``: aiohttp raises 413 past it
    except web.HTTPRequestEntityTooLarge:
        return too_large
    try:
        return decompress(raw, request.headers.get("Content-Encoding", ""), cap)
    except BodyTooLargeError:
        return too_large
    except BadEncodingError as error:
        return _error(415, ["header", "content-encoding"], str(error), "unsupported_encoding")


async def _systemone(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    session = request.app[SESSION]
    config = state.config
    body = await _read_body(request, config.max_body_bytes)
    if isinstance(body, web.Response):
        return body
    try:
        call = _parse_call(body, request.headers.get("Content-Type", ""))
        if isinstance(call, web.Response):
            return call
        images = [tv.Image.from_bytes(raw, mime) for mime, raw in call.images]
    except SystemOneValidationError as error:
        if state.metrics is not None:
            state.metrics.errors.labels("SystemOneValidationError").inc()
        return _json(422, {"detail": error.detail})
    except tv.InvalidInputError as error:
        return _sdk_error(state, error)
    if state.admitted >= config.max_in_flight + config.max_queue:
        return _error(
            429, ["server"], "too many requests in flight: retry shortly", "rate_limited",
            headers={"Retry-After": "1"},
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
            extension=converter.unstructure(judgment),
        ),
    )


def _parse_call(body: bytes, content_type: str) -> SystemOneCall | web.Response:
    """The request a body holds: JSON, or ``multipart/form-data`` (what the official client
    sends when a request has image assets: a ``request`` part and one part per image).

    :raises SystemOneValidationError: not a System One request.
    """
    media = media_type(content_type)
    if media == "multipart/form-data":
        return request_from_system_one_multipart(body, content_type)
    if media.startswith("multipart/"):
        return _error(
            415, ["header", "content-type"],
            f"Content-Type {media!r} is not accepted: send application/json or "
            "multipart/form-data",
            "unsupported_media_type",
        )  # fmt: skip
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise SystemOneValidationError(
            [validation_detail(["body"], f"not valid JSON: {error}", "json_invalid")]
        ) from None
    return request_from_system_one(data)


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
            if status >= 500:
                log.warning("judgment failed: %s: %s", type(error).__name__, error)
            return _error(status, loc, f"{type(error).__name__}: {error}", detail_type)
    log.error("judgment failed: %s", type(error).__name__)
    return _error(500, ["server"], "internal server error", "internal_error")


def _served_model(session: tv.Session) -> str | None:
    return session.backend.model


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


async def _probe_until_ready(app: web.Application) -> None:
    state, session = app[STATE], app[SESSION]
    while True:
        try:
            probe = await session.probe()
        except tv.BackendError as error:
            log.warning("probe failed, retrying: %s: %s", type(error).__name__, error)
            await asyncio.sleep(state.config.probe_interval)
            continue
        except tv.TypevetError as error:
            log.error("probe refused: %s: %s (not ready)", type(error).__name__, error)
            return
        state.served_model = session.backend.model or (
            probe.model_ids[0] if probe.model_ids else None
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
    app[STATE] = _State(config, asyncio.Semaphore(config.max_in_flight), _Metrics.create())
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


def runner_options(config: GatewayConfig) -> dict[str, Any]:
    """The `web.AppRunner` options the gateway needs: it decompresses bodies itself (with a
    cap) and writes its own access log."""
    return {
        "auto_decompress": False,
        "access_log": None,
        "shutdown_timeout": config.shutdown_timeout + _SHUTDOWN_GRACE,
    }


@contextlib.asynccontextmanager
async def running(
    session: tv.Session, config: GatewayConfig | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[str]:
    """The gateway over ``session`` on a free port of ``host``, in this process and this event
    loop (for tests, benchmarks, or embedding it beside other work): its URL while the block
    runs; cleaned up (the session closed) when it ends. No signal handling: that is `serve`'s."""
    config = config or GatewayConfig()
    runner = web.AppRunner(build_app(session, config), **runner_options(config))
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
        runner = web.AppRunner(app, **runner_options(config))
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
