"""The gateway's aiohttp application: its routes, middlewares (access log, errors, auth), the
``POST /v1/systemone`` handler (decode off the loop, admit, judge, answer), the ``POST
/v1/decisions`` route (`typevet_async._apps.gateway.decisions`) and the background probe that makes
it ready."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import anyio
import anyio.to_thread
from aiohttp import web
from multidict import CIMultiDict

import typevet_async as tv
import typevet_async._telemetry as telemetry
from typevet_async._apps.gateway.batch import system_one_batch
from typevet_async._apps.gateway.bodies import (
    decode_request,
    decoded_body,
    served_name,
)
from typevet_async._apps.gateway.config import GatewayConfig
from typevet_async._apps.gateway.decisions import handle_decisions, openai_error_shape
from typevet_async._apps.gateway.responses import (
    REQUEST_ID_HEADER,
    error_response,
    extension,
    json_response,
    log_failure,
    new_request_id,
    sdk_error_response,
    shed_response,
)
from typevet_async._apps.gateway.state import SESSION, STATE, GatewayState, Metrics
from typevet_async._apps.presenting import served_model
from typevet_async._core.wires.decisions import DecisionsCall
from typevet_async._core.wires.system_one import (
    ADVERTISEMENT,
    BATCH_PATH,
    CALIBRATION_ADVERTISEMENT,
    EXAMPLES_ADVERTISEMENT,
    SystemOneCall,
    advertisement,
    calibration_advertisement,
    examples_advertisement,
    response_to_system_one,
)

__all__ = ["build_app"]

log = logging.getLogger("typevet_async.gateway")
access_log = logging.getLogger("typevet_async.gateway.access")


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


#: The request's id, set by the access middleware (the outermost) and sent back as
#: ``x-typesafe-request-id`` on whatever response the request gets.
_REQUEST_ID: Final = web.RequestKey("request_id", str)


#: ``GET /v1/models``'s field naming the SDK's version (the ``x_`` prefix of the gateway's own
#: fields, which System One clients ignore).
VERSION_FIELD: Final = "x_typevet_version"
#: Every response's ``Server`` header, in place of aiohttp's (which names Python and aiohttp).
SERVER: Final = f"typevet-async/{tv.__version__}"


async def _send_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every response names its request: the id the access log shows (a fresh one if the
    request never reached the middlewares), and the server that answered."""
    response.headers[REQUEST_ID_HEADER] = request.get(_REQUEST_ID) or new_request_id()
    response.headers["Server"] = SERVER


@web.middleware
async def _access(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    state = request.app[STATE]
    request[_REQUEST_ID] = request_id = new_request_id()
    started = time.perf_counter()
    status = 500
    route = _route_of(request)
    # A SERVER span joined to the caller's trace (its traceparent header): the judgment's
    # spans, and the model server's read, are its children (`typevet_async._telemetry`).
    with telemetry.server_span(
        f"{request.method} {route}",
        _trace_carrier(request, state.config),
        {
            "http.request.method": request.method,
            "http.route": route,
            "url.path": request.path,
            "typevet.request_id": request_id,
        },
    ) as span:
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
            if span is not None:
                span.set("http.response.status_code", status)
                if status >= 500:
                    span.failed_as(str(status))
            _access_logged(request, state, status, started, request_id)


#: What a caller writes into a trace besides joining it (W3C trace context's vendor state, and
#: baggage): it stops at the gateway unless ``forward_tracestate_baggage`` is set.
_CALLER_TRACE_DATA: Final = ("tracestate", "baggage")


def _trace_carrier(request: web.Request, config: GatewayConfig) -> Mapping[str, str]:
    """The headers the server span joins the caller's trace from: without the caller's
    ``tracestate`` and ``baggage`` unless the gateway forwards them. Left out here, they are
    in neither this process's context nor, hence, the model server's requests."""
    headers = request.headers
    if config.forward_tracestate_baggage or not telemetry.active():
        return headers
    if not any(name in headers for name in _CALLER_TRACE_DATA):
        return headers
    kept = CIMultiDict(headers)
    for name in _CALLER_TRACE_DATA:
        kept.popall(name, None)
    return kept


def _access_logged(
    request: web.Request, state: GatewayState, status: int, started: float, request_id: str
) -> None:
    """The access log's line and the Prometheus request metrics of one request."""
    elapsed = time.perf_counter() - started
    access_log.info(
        "%s %s %d %.1fms %s", request.method, request.path, status, elapsed * 1000, request_id
    )
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
        return error_response(error.status, ["request"], error.reason, kind)
    except Exception as error:  # a bug: its frames in the log, not its message (`log_failure`)
        where = f"unexpected error on {request.method} {_route_of(request)}"
        log_failure(log, logging.ERROR, where, error, stack=True)
        return error_response(500, ["server"], "internal server error", "internal_error")


@web.middleware
async def _auth(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    keys = request.app[STATE].config.keys
    guarded = keys and request.path.startswith("/v1/")
    if guarded and not _authorized(request.headers.get("Authorization"), keys):
        return error_response(
            401,
            ["header", "authorization"],
            "a valid bearer key is required: Authorization: Bearer KEY",
            "authentication_error",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return await handler(request)


async def _system_one(request: web.Request) -> web.StreamResponse:
    """Decode (off the loop), admit or shed, judge, answer."""
    state = request.app[STATE]
    session = request.app[SESSION]
    decode = functools.partial(decode_request, served_model=served_name(state, session))
    decoded = await decoded_body(request, state, decode)
    if isinstance(decoded, web.Response):
        return decoded
    call, images = decoded
    shed = shed_response(state, 1)
    if shed is not None:
        return shed
    judgment = await _judged(state, session, call, images)
    if isinstance(judgment, web.Response):
        return judgment
    if state.metrics is not None:
        state.metrics.reads.inc(judgment.usage.reads)
    model = state.served_model or served_model(session) or call.model
    body = response_to_system_one(
        judgment, model, score_criteria=call.score_criteria, extension=extension(judgment)
    )
    return json_response(200, body)


async def _decisions(request: web.Request) -> web.StreamResponse:
    return await handle_decisions(request, _judged, lambda state: shed_response(state, 1))


async def _judged(
    state: GatewayState,
    session: tv.Session,
    call: SystemOneCall | DecisionsCall,
    images: list[tv.Image],
    **options: Any,
) -> tv.Judgment | web.Response:
    """The judgment of an admitted request (``options``: `Session.judge`'s), under a slot and
    the request's timeout; or the answer for its failure (504, 503 when the shutdown cut it
    off, an SDK error's)."""
    config = state.config
    state.admitted += 1
    task = asyncio.current_task()
    if task is not None:
        state.judging.add(task)
    held: float | None = None  # when it got its slot
    try:
        async with asyncio.timeout(config.request_deadline), state.slots:
            held = state.took_slot()
            if state.metrics is not None:
                state.metrics.in_flight.inc()
            try:
                judgment = await session.judge(call.state, call.questions, images=images, **options)
            finally:
                if state.metrics is not None:
                    state.metrics.in_flight.dec()
            state.held_since(held)  # it did the work: its time is admission's measure
            return judgment
    except asyncio.CancelledError:
        if not state.cut_off or task is None:
            raise  # the client went away (or a cancellation that is not the shutdown's)
        task.uncancel()
        if state.metrics is not None:
            state.metrics.errors.labels("ShutdownCutOff").inc()
        return error_response(
            503,
            ["server"],
            f"the gateway shut down before the judgment ended (it waits "
            f"{config.shutdown_timeout}s for in-flight requests): retry elsewhere or later",
            "unavailable",
            headers={"Retry-After": "1", "Connection": "close"},
        )
    except TimeoutError as error:
        if held is not None:  # cut by a timeout (ours or the SDK's): it held its slot all along
            state.held_since(held)
        if isinstance(error, tv.TypevetError):
            return sdk_error_response(state.metrics, error)
        if state.metrics is not None:
            state.metrics.errors.labels("Timeout").inc()
        return error_response(
            504,
            ["server"],
            f"the request outlived the gateway's {config.request_deadline}s deadline",
            "timeout",
        )
    except tv.TypevetError as error:
        return sdk_error_response(state.metrics, error)
    finally:
        if held is not None:
            state.left_slot(held)
        state.admitted -= 1
        if task is not None:
            state.judging.discard(task)


async def _models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if not state.ready:
        return error_response(503, ["server"], "the model server is not ready yet", "unavailable")
    session = request.app[SESSION]
    name = state.served_model or "default"
    backend = type(session.backend).__name__
    return json_response(
        200,
        {
            "models": [
                {
                    "name": name,
                    "description": f"{name}, served by typevet-async through {backend}",
                    "release_date": state.ready_date,
                }
            ],
            ADVERTISEMENT: advertisement(state.config.batch_cap()),
            CALIBRATION_ADVERTISEMENT: calibration_advertisement(
                session.settings.batch_calibration
            ),
            EXAMPLES_ADVERTISEMENT: examples_advertisement(),
            VERSION_FIELD: tv.__version__,
        },
    )


async def _healthz(request: web.Request) -> web.StreamResponse:
    return json_response(200, {"status": "ok"})


async def _readyz(request: web.Request) -> web.StreamResponse:
    if request.app[STATE].ready:
        return json_response(200, {"status": "ready"})
    return error_response(
        503, ["server"], "the model server has not been probed yet", "unavailable"
    )


async def _metrics(request: web.Request) -> web.StreamResponse:
    metrics = request.app[STATE].metrics
    if metrics is None:  # pragma: no cover
        return error_response(404, ["request"], "metrics need prometheus_client", "not_found")
    body, content_type = metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": content_type})


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
                "refused (not ready)" if refused else "failed",
                wait,
                type(error).__name__,
                error,
            )
            await asyncio.sleep(wait)
            wait = min(wait * 2, max(_PROBE_BACKOFF_MAX, state.config.probe_interval))
            continue
        state.served_model = served_model(session, probe)
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
        client_max_size=config.max_body_bytes,
        middlewares=[_access, openai_error_shape, _errors, _auth],
    )
    app[SESSION] = session
    app[STATE] = GatewayState(
        config,
        asyncio.Semaphore(config.max_active_requests),
        anyio.CapacityLimiter(config.decode_threads),
        Metrics.create(),
    )
    app.cleanup_ctx.append(_lifecycle)
    app.on_response_prepare.append(_send_request_id)
    app.router.add_post("/v1/systemone", _system_one)
    app.router.add_post(BATCH_PATH, system_one_batch)
    app.router.add_post("/v1/decisions", _decisions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    return app
