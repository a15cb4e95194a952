"""Serving the gateway: the runner's options, the connection cap, `running` (in-process, for
tests and embedding), `serve` (signals, the startup line) and the graceful `shutdown`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, cast

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

import typevet_async as tv
from typevet_async._apps.gateway.app import build_app
from typevet_async._apps.gateway.config import GatewayConfig
from typevet_async._apps.gateway.responses import REQUEST_ID_HEADER, error_body, new_request_id
from typevet_async._apps.gateway.state import STATE, GatewayState

__all__ = ["app_runner", "runner_options", "running", "serve", "shutdown"]

log = logging.getLogger("typevet_async.gateway")


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
    error_body(503, ["server"], "too many open connections: retry shortly", "unavailable")
)
#: What a connection past the cap gets, when none is idle, before it is closed (with a fresh
#: request id).
_BUSY_HEAD: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Type: application/json\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n"
)


class _Busy(asyncio.Protocol):
    """A connection past the cap while every open one has a request in progress: answered 503
    and closed, never read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        request_id = f"{REQUEST_ID_HEADER}: {new_request_id()}\r\n\r\n".encode()
        transport.write(_BUSY_HEAD + request_id + _BUSY_BODY)
        transport.close()


class _ConnectionCap:
    """The server's protocol factory, at most ``cap`` connections open at once. At the cap, a
    new connection takes the place of the one idle longest (no request in progress: silent
    since it opened, or kept alive after its last answer), which is closed; only when every
    connection has a request in progress is the new one answered 503. So idle sockets, however
    many, never lock clients out, and a request under way is never cut for a new one."""

    def __init__(self, server: web.Server, cap: int) -> None:
        self.server, self.cap = server, cap

    def __call__(self) -> asyncio.BaseProtocol:
        # a connection closed here lingers in the list until its loss is processed
        open_now = [handler for handler in self.server.connections if handler.transport is not None]
        if len(open_now) >= self.cap:
            idle = [handler for handler in open_now if _idle(handler)]
            if not idle:
                return _Busy()
            min(idle, key=_idle_since).force_close()
        return self.server()


def _idle(handler: RequestHandler) -> bool:
    """Whether a connection waits for its next request (none in progress, none read ahead):
    the test aiohttp makes before it closes a connection at its keep-alive timeout. Should
    aiohttp's internals change, no connection counts as idle and the cap answers 503 as
    before."""
    waiter = getattr(handler, "_waiter", None)
    return isinstance(waiter, asyncio.Future) and not waiter.done()


def _idle_since(handler: RequestHandler) -> float:
    """When a connection's idle timeout would close it (its idle time's start plus the same
    timeout for all): the least is the one idle longest."""
    closes_at = getattr(handler, "_next_keepalive_close_time", 0.0)
    return closes_at if isinstance(closes_at, float) else 0.0


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


async def shutdown(runner: web.AppRunner, state: GatewayState) -> None:
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
