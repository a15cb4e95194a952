"""The HTTP transport every backend talks through: one aiohttp pool per server.

The client hands each reply's body to the caller as bytes: each backend decodes it with its
own strict decoder (`typevet_async._backends.wire`), so no reply is parsed twice, or parsed
into dicts nobody reads.

Security defaults: redirects are never followed, TLS verification stays on, the API key is
sent as a bearer header, and a response body larger than ``max_response_bytes`` is refused: one
that declares its length is refused before it is read (and then read in one call), one that
does not (chunked, or compressed) while it streams in.

Socket reads: a connection reads at most `SOCKET_READ_SIZE` bytes a call (why: there).

Secrets: a client registers its API key when built, and its URL's user and password when given
the URL (`typevet_async._backends.http_secrets`); every error redacts itself against them. The
client's reprs and messages show the URL without its credentials, and no error it raises
chains an aiohttp exception (`typevet_async._backends.http_errors` maps them).

Retries: by `typevet_async._backends.retrying`, after a first attempt the client sends
directly. Every HTTP attempt is counted in `Attempts`, the replay of a pooled connection the
server had closed included.

``request_timeout`` bounds one HTTP request from sending it to the end of its body. Waiting
for a free pooled connection does not count: the client hands out its ``max_connections``
itself, and starts a request's clock only once it holds one. A caller that sends a request too
costly to send twice (a generation) asks `post` not to retry its timeouts.

Lifecycle: once `aclose` has begun, every request still in flight, waiting for a connection or
between retries fails with `SessionStateError`, whatever aiohttp raised as its pool closed (a
wait between retries ends at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import Iterable
from typing import Any

import aiohttp
import attrs
import orjson
from aiohttp.connector import Connection

import typevet_async._telemetry as telemetry
from typevet_async._backends.http_errors import is_stale_connection, map_client_error, server_error
from typevet_async._backends.http_secrets import register_api_key, register_url_credentials
from typevet_async._backends.retrying import (
    RetryPolicy,
    WaitRetryAfter,
    is_transient,
    retrying,
    transient_but_no_timeout,
)
from typevet_async._concurrency.slicing import SLICE, yield_if_busy
from typevet_async._errors import ConfigurationError, ProtocolError, SessionStateError, TypevetError
from typevet_async._options import (
    UNSET,
    Unset,
    api_key,
    boolean,
    instance_of,
    optional,
    positive_int,
    positive_number,
    resolve,
)
from typevet_async._redaction import redact

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "SOCKET_READ_SIZE",
    "Attempts",
    "HttpClient",
    "HttpSettings",
]

#: A whole-vocabulary llama.cpp read of a 262,144-token vocabulary is about 26 MB.
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: Seconds one HTTP request may take; a whole-vocabulary read took 2.8 to 4.4 s here.
DEFAULT_REQUEST_TIMEOUT = 120.0
#: llama.cpp closes idle keep-alive connections after about 5 s; keep ours for less.
DEFAULT_KEEPALIVE = 2.0
DEFAULT_MAX_CONNECTIONS = 64

#: The most bytes one socket read asks for. asyncio's socket transport asks for 256 KiB
#: (its ``max_size``) and ``recv`` allocates that much before it reads: past glibc's 128 KiB
#: mmap threshold, so a small reply can cost an mmap, an mremap and a munmap per read, plus
#: page faults (cpython#85451). 64 KiB (trio's default) comes from the heap: a 5 KB
#: send-and-read pair took 3.9 µs against 22.6, and a question at concurrency 64 on the replay
#: server 46 µs less CPU (8 paired rounds; `benchmarks.client_cost.bench_client_cost`).
SOCKET_READ_SIZE = 64 * 1024


class _HeapSizedReadsResponse(aiohttp.ClientResponse):
    """A reply whose connection reads at most `SOCKET_READ_SIZE` bytes a call, from its
    headers on (the setting stays with the pooled connection).

    A transport without a ``max_size`` (asyncio's TLS transport, for one) is left as it is."""

    async def start(self, connection: Connection) -> aiohttp.ClientResponse:
        transport: Any = connection.transport
        if getattr(transport, "max_size", 0) > SOCKET_READ_SIZE:
            transport.max_size = SOCKET_READ_SIZE
        return await super().start(connection)


def _trace_configs(value: Iterable[aiohttp.TraceConfig]) -> tuple[aiohttp.TraceConfig, ...]:
    configs = tuple(value) if isinstance(value, Iterable) else None
    if configs is None or not all(isinstance(item, aiohttp.TraceConfig) for item in configs):
        raise ConfigurationError(
            f"trace_configs must be a sequence of aiohttp.TraceConfig, got {value!r}"
        )
    return configs


@attrs.frozen(kw_only=True)
class HttpSettings:
    """How a backend's HTTP client talks to its server; checked when built."""

    #: Sent as ``Authorization: Bearer <api_key>``: visible ASCII, checked when built (a key
    #: read from a file with its newline is refused here, not at the first request);
    #: registered for redaction by the `HttpClient` built with it.
    api_key: str | None = attrs.field(default=None, repr=False, validator=api_key)
    #: Seconds for one HTTP request, from sending it to the end of its body (waiting for a
    #: pooled connection excluded).
    request_timeout: float = attrs.field(default=DEFAULT_REQUEST_TIMEOUT, validator=positive_number)
    retry: RetryPolicy = attrs.field(
        factory=RetryPolicy, validator=instance_of(RetryPolicy, "a tv.RetryPolicy")
    )
    #: Connections open at once to the server (requests beyond wait for one, untimed).
    max_connections: int = attrs.field(default=DEFAULT_MAX_CONNECTIONS, validator=positive_int)
    #: Seconds an idle pooled connection is kept (below llama.cpp's own ~5 s).
    keepalive: float = attrs.field(default=DEFAULT_KEEPALIVE, validator=positive_number)
    max_response_bytes: int = attrs.field(
        default=DEFAULT_MAX_RESPONSE_BYTES, validator=positive_int
    )
    #: aiohttp trace hooks (request counters, tracing).
    trace_configs: tuple[aiohttp.TraceConfig, ...] = attrs.field(
        default=(), converter=_trace_configs
    )
    verify_tls: bool = attrs.field(default=True, validator=boolean)
    #: Seconds of the SDK's own CPU work one event-loop iteration may run before its reads
    #: yield to the loop's other tasks and timers (`typevet_async._concurrency.slicing`); None:
    # never
    #: yield, for a loop that runs nothing else (a batch pipeline saves the slices' little
    #: CPU).
    time_slice: float | None = attrs.field(default=SLICE, validator=optional(positive_number))


@attrs.define
class Attempts:
    """Counts the HTTP attempts of one logical request: retries, and the replay of a pooled
    connection the server had closed, included."""

    count: int = 0


class HttpClient:
    """A pooled JSON-over-HTTP client for one server (lifecycle: unopened, open, closed)."""

    def __init__(self, base_url: str | None, settings: HttpSettings | None = None) -> None:
        """``base_url`` None: given to `open` (an embedded server's URL is known only then)."""
        self.settings = settings or HttpSettings()
        # Registered by the client that sends it, not when the settings are built: building
        # settings leaves the process's redaction state alone.
        if self.settings.api_key is not None:
            register_api_key(self.settings.api_key)
        self.base_url: str | None = None
        if base_url is not None:
            self._set_base_url(base_url)
        # Our own slots, as many as the connector's: a request waits here, untimed, and the
        # connector then never makes it wait for a connection.
        self._connections = asyncio.Semaphore(self.settings.max_connections)
        self._timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout)
        self._slice = self.settings.time_slice
        #: Stateless between calls (tenacity passes the retry state in): built once.
        self._wait = WaitRetryAfter(self.settings.retry)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        #: Set by `aclose`: ends the waits between retries.
        self._closing = asyncio.Event()

    def _set_base_url(self, base_url: str) -> None:
        """:raises ConfigurationError: not a URL, or one with credentials and an API key too."""
        try:
            parts = urllib.parse.urlsplit(base_url)
        except ValueError as error:
            raise ConfigurationError(f"base_url is not a valid URL ({error})") from None
        register_url_credentials(parts)
        if self.settings.api_key is not None and (parts.username or parts.password):
            # aiohttp would refuse it at the first request, with a raw ValueError.
            raise ConfigurationError(
                "base_url has a user or password and api_key is set: both would be the "
                "Authorization header; give one of them"
            )
        self.base_url = base_url.rstrip("/")

    def __repr__(self) -> str:
        key = "set" if self.settings.api_key else "none"
        shown = redact(self.base_url) if self.base_url is not None else None
        return f"HttpClient(base_url={shown!r}, api_key=<{key}>)"

    async def open(self, base_url: str | None = None) -> None:
        if self._closed:
            raise SessionStateError("cannot reopen a closed client")
        if self._session is not None:
            return
        if base_url is not None:
            self._set_base_url(base_url)
        if self.base_url is None:
            raise SessionStateError("the HTTP client was opened without a base URL")
        settings = self.settings
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        connector = aiohttp.TCPConnector(
            limit=settings.max_connections,
            keepalive_timeout=settings.keepalive,
            ssl=settings.verify_tls,  # True: verify with the default context
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=headers,
            # Each request sets its own clock (`_send`), started once it holds a slot.
            timeout=aiohttp.ClientTimeout(total=None),
            trace_configs=list(settings.trace_configs) or None,
            json_serialize=lambda value: orjson.dumps(value).decode(),
            response_class=_HeapSizedReadsResponse,
        )

    async def aclose(self) -> None:
        """Close the pool. Requests still in flight then fail with `SessionStateError`."""
        self._closed = True
        self._closing.set()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def get(
        self, path: str, *, max_retries: int | Unset = UNSET, attempts: Attempts | None = None
    ) -> bytes:
        """GET ``path``; the reply's body (a 2xx), retrying transient failures."""
        raw = await self._retrying("GET", path, None, max_retries, attempts, True)
        await yield_if_busy(self._slice)  # before the caller decodes it (`_concurrency.slicing`)
        return raw

    async def post(
        self,
        path: str,
        body: Any,
        *,
        max_retries: int | Unset = UNSET,
        attempts: Attempts | None = None,
        retry_timeouts: bool = True,
    ) -> bytes:
        """POST ``body`` as JSON; the reply's body (a 2xx), retrying transient failures
        (``max_retries`` overrides the policy's).

        ``retry_timeouts=False``: a `RequestTimeoutError` is raised at once, not retried (a
        request that ran for ``request_timeout`` would run as long again from scratch).

        :raises ServerError: a status of 300 or more (redirects are never followed).
        :raises TransportError: the connection failed, or the body was cut off.
        :raises RequestTimeoutError: one attempt outlived ``request_timeout``.
        :raises ProtocolError: the reply could not be parsed as HTTP, or its body is larger
            than ``max_response_bytes``.
        :raises SessionStateError: the client is not open, or was closed meanwhile.
        """
        raw = await self._retrying(
            "POST", path, orjson.dumps(body), max_retries, attempts, retry_timeouts
        )
        await yield_if_busy(self._slice)  # before the caller decodes it (`_concurrency.slicing`)
        return raw

    async def _retrying(
        self,
        method: str,
        path: str,
        data: bytes | None,
        max_retries: int | Unset,
        attempts: Attempts | None,
        retry_timeouts: bool,
    ) -> bytes:
        """`retrying` of `_request`, its first attempt made here: no closure and one coroutine
        fewer on every request that succeeds at once (the hot path)."""
        counter = attempts if attempts is not None else Attempts()
        try:
            return await self._request(method, path, data, counter)
        except TypevetError as error:
            first = error  # whether it is retried is `retrying`'s to say
        return await retrying(
            lambda: self._request(method, path, data, counter),
            retries=resolve(max_retries, self.settings.retry.max_retries),
            retryable=is_transient if retry_timeouts else transient_but_no_timeout,
            wait=self._wait,
            sleep=self._backoff,
            first=first,
        )

    async def _backoff(self, seconds: float) -> None:
        """tenacity's wait between attempts, cut short by `aclose` (the next attempt then finds
        the client closed)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    def _closed_meanwhile(self, method: str, url: str) -> SessionStateError:
        return SessionStateError(
            f"{method} {redact(url)}: the HTTP client was closed while the request was in flight"
        )

    async def _request(
        self, method: str, path: str, data: bytes | None, counter: Attempts
    ) -> bytes:
        """One attempt: the reply's body, sent once more on a fresh connection if the pooled
        one turns out stale."""
        if self._session is None:
            state = "closed" if self._closed else "not open"
            raise SessionStateError(f"the HTTP client is {state}")
        url = f"{self.base_url}{path}"
        # The current span's W3C trace context (a read's span), when one is recording: the
        # server's own trace (vLLM's) joins the caller's.
        headers = telemetry.with_trace_context(None if data is None else _JSON_HEADERS)
        await yield_if_busy(self._slice)  # sending costs CPU too: not in a used-up slice
        async with self._connections:
            # At most two sends: every request the SDK sends is idempotent, and a pooled
            # connection the server closed while idle fails on first use, so the first send
            # that fails so is sent once more, on a fresh connection.
            for replay in (False, True):
                # Read again on each send: the client may have closed while this request
                # waited for a slot, yielded, or met a stale connection.
                session = self._session
                if session is None:
                    raise self._closed_meanwhile(method, url)
                counter.count += 1
                try:
                    # aiohttp's clock starts here, once this request holds one of our slots
                    # (waiting for a pooled connection is not counted), and runs to the end of
                    # the body.
                    async with session.request(
                        method,
                        url,
                        data=data,
                        headers=headers,
                        allow_redirects=False,
                        timeout=self._timeout,
                    ) as response:
                        cap = self.settings.max_response_bytes
                        if _length_is_known(response, cap, method, url):
                            raw = await response.read()  # one call, no per-chunk work
                        else:
                            raw = await _read_streamed(response, cap, method, url)
                        if response.status >= 300:
                            raise server_error(response, raw, method, url)
                        return raw
                except TypevetError:
                    raise  # the server's answer, already typed (a status, a body too large)
                except (aiohttp.ClientError, OSError, RuntimeError) as error:
                    # TimeoutError is an OSError. A RuntimeError is aiohttp's "Session is
                    # closed" only once we closed it; otherwise it is a bug, raised as itself.
                    if isinstance(error, RuntimeError) and not self._closed:
                        raise
                    if self._closed:
                        failure: TypevetError = self._closed_meanwhile(method, url)
                    elif not replay and is_stale_connection(error):
                        continue
                    else:
                        failure = map_client_error(
                            error, method, url, timeout=self.settings.request_timeout
                        )
                # Raised outside the except block: no aiohttp error (nor its request headers)
                # is chained as the failure's cause or context.
                raise failure
        raise AssertionError("unreachable: the second send returns or raises")


async def _read_streamed(
    response: aiohttp.ClientResponse, cap: int, method: str, url: str
) -> bytes:
    """A body of unknown length (chunked, or compressed: the declared length is not the
    decoded one), capped as it streams in."""
    chunks = bytearray()
    async for chunk in response.content.iter_chunked(1 << 20):
        chunks += chunk
        if len(chunks) > cap:
            raise ProtocolError(f"{method} {redact(url)}: response exceeds the {cap}-byte cap")
    return bytes(chunks)


def _length_is_known(response: aiohttp.ClientResponse, cap: int, method: str, url: str) -> bool:
    """The body's own length is declared (no content coding): it is read in one call.

    :raises ProtocolError: the declared length exceeds ``cap`` (refused before reading).
    """
    length = response.content_length
    if length is None:
        return False
    if length > cap:
        raise ProtocolError(
            f"{method} {redact(url)}: response of {length} bytes exceeds the {cap}-byte cap"
        )
    return _identity(response.headers.get("Content-Encoding"))


_JSON_HEADERS = {"Content-Type": "application/json"}


def _identity(coding: str | None) -> bool:
    """No content coding: the Content-Length is the length of the body aiohttp hands over."""
    return coding is None or coding.strip().lower() == "identity"
