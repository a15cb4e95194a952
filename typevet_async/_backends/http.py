"""The HTTP shell every backend talks through: one aiohttp pool, errors mapped to the SDK's.

The client hands each reply's body to the caller as bytes: each backend decodes it with its
own strict decoder (`typevet_async._backends.wire`), so no reply is parsed twice, or parsed
into dicts nobody reads.

Security defaults: redirects are never followed, TLS verification stays on, the API key is
sent as a bearer header and never appears in a repr or an error message, and a response body
larger than ``max_response_bytes`` is refused: one that declares its length is refused before
it is read (and then read in one call), one that does not (chunked, or compressed) while it
streams in.

Retries: the first attempt is sent directly; tenacity's `AsyncRetrying` is entered only after
a first transient failure, which it then sees as its own first attempt, so the policy (stop,
waits, ``Retry-After``) is tenacity's alone. Every HTTP attempt is counted in `Attempts`,
the replay of a pooled connection the server had closed included.

``request_timeout`` bounds one HTTP request from sending it to the end of its body. Waiting
for a free pooled connection does not count: the client hands out its ``max_connections``
itself, and starts a request's clock only once it holds one.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import attrs
import orjson
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_base, wait_exponential_jitter

from typevet_async._errors import (
    ProtocolError,
    RequestTimeoutError,
    ServerError,
    SessionStateError,
    TransportError,
    TypevetError,
)
from typevet_async._options import (
    UNSET,
    Unset,
    boolean,
    non_negative_int,
    non_negative_number,
    positive_int,
    positive_number,
    resolve,
)

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_REQUEST_TIMEOUT",
    "Attempts",
    "HttpClient",
    "HttpSettings",
    "RetryPolicy",
    "is_transient",
    "map_client_error",
]

#: A whole-vocabulary llama.cpp read of a 262,144-token vocabulary is about 26 MB.
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: Seconds one HTTP request may take; a whole-vocabulary read took 2.8 to 4.4 s here.
DEFAULT_REQUEST_TIMEOUT = 120.0
DEFAULT_MAX_RETRIES = 2
#: llama.cpp closes idle keep-alive connections after about 5 s; keep ours for less.
DEFAULT_KEEPALIVE = 2.0
DEFAULT_MAX_CONNECTIONS = 64

#: A pooled connection the server already closed fails like this on first use.
_STALE_CONNECTION_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Retries of transient failures: connection errors, timeouts, HTTP 408, 429 and 5xx.

    Backoff is exponential with jitter (``initial`` doubling up to ``maximum``); a
    ``Retry-After`` header is honoured, up to ``max_retry_after`` seconds. Validation failures,
    other 4xx and template refusals are never retried. ``max_retries=0`` turns retries off.
    """

    max_retries: int = attrs.field(default=DEFAULT_MAX_RETRIES, validator=non_negative_int)
    initial: float = attrs.field(default=0.25, validator=positive_number)
    maximum: float = attrs.field(default=8.0, validator=positive_number)
    jitter: float = attrs.field(default=0.25, validator=non_negative_number)
    max_retry_after: float = attrs.field(default=30.0, validator=positive_number)


def _trace_configs(value: Sequence[aiohttp.TraceConfig]) -> tuple[aiohttp.TraceConfig, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class HttpSettings:
    """How a backend's HTTP client talks to its server; checked when built."""

    api_key: str | None = attrs.field(default=None, repr=False)
    #: Seconds for one HTTP request, from sending it to the end of its body (waiting for a
    #: pooled connection excluded).
    request_timeout: float = attrs.field(default=DEFAULT_REQUEST_TIMEOUT, validator=positive_number)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
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


@attrs.define
class Attempts:
    """Counts the HTTP attempts of one logical request: retries, and the replay of a pooled
    connection the server had closed, included."""

    count: int = 0


def is_transient(error: BaseException) -> bool:
    """Worth another attempt: the server or the network may answer next time."""
    if isinstance(error, TransportError | RequestTimeoutError):
        return True
    if isinstance(error, ServerError):
        return error.status in (408, 429) or error.status >= 500
    return False


class _WaitRetryAfter(wait_base):
    """Exponential backoff with jitter, unless the server said how long to wait."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.backoff = wait_exponential_jitter(
            multiplier=policy.initial, max=policy.maximum, jitter=policy.jitter
        )

    def __call__(self, retry_state: RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, ServerError) and error.retry_after is not None:
            return min(error.retry_after, self.policy.max_retry_after)
        return float(self.backoff(retry_state))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: delay-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def map_client_error(error: BaseException, method: str, url: str) -> TypevetError:
    """The most specific SDK error for an aiohttp or OS error (never carries headers)."""
    where = f"{method} {url}"
    if isinstance(error, TimeoutError | aiohttp.ServerTimeoutError):
        return RequestTimeoutError(f"{where}: timed out")
    if isinstance(error, aiohttp.ClientPayloadError):
        return TransportError(f"{where}: response body cut off ({error})")
    if isinstance(error, aiohttp.ClientResponseError):
        return ServerError(f"{where}: HTTP {error.status}", status=error.status, body="")
    if isinstance(error, aiohttp.ClientError | OSError):
        return TransportError(f"{where}: {type(error).__name__}: {error}")
    return TransportError(f"{where}: {type(error).__name__}")


class HttpClient:
    """A pooled JSON-over-HTTP client for one server (lifecycle: unopened, open, closed)."""

    def __init__(self, base_url: str | None, settings: HttpSettings | None = None) -> None:
        """``base_url`` None: given to `open` (an embedded server's URL is known only then)."""
        self.base_url = base_url.rstrip("/") if base_url is not None else None
        self.settings = settings or HttpSettings()
        # Our own slots, as many as the connector's: a request waits here, untimed, and the
        # connector then never makes it wait for a connection.
        self._connections = asyncio.Semaphore(self.settings.max_connections)
        self._timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def __repr__(self) -> str:
        key = "set" if self.settings.api_key else "none"
        return f"HttpClient(base_url={self.base_url!r}, api_key=<{key}>)"

    async def open(self, base_url: str | None = None) -> None:
        if self._closed:
            raise SessionStateError("cannot reopen a closed client")
        if self._session is not None:
            return
        if base_url is not None:
            self.base_url = base_url.rstrip("/")
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
        )

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def get(
        self, path: str, *, max_retries: int | Unset = UNSET, attempts: Attempts | None = None
    ) -> bytes:
        """GET ``path``; the reply's body (a 2xx), retrying transient failures."""
        return await self._retrying("GET", path, None, max_retries, attempts)

    async def post(
        self,
        path: str,
        body: Any,
        *,
        max_retries: int | Unset = UNSET,
        attempts: Attempts | None = None,
    ) -> bytes:
        """POST ``body`` as JSON; the reply's body (a 2xx), retrying transient failures
        (``max_retries`` overrides the policy's).

        :raises ServerError: a status of 300 or more (redirects are never followed).
        :raises TransportError: the connection failed, or the body was cut off.
        :raises RequestTimeoutError: one attempt outlived ``request_timeout``.
        :raises ProtocolError: the body is larger than ``max_response_bytes``.
        """
        return await self._retrying("POST", path, orjson.dumps(body), max_retries, attempts)

    async def _retrying(
        self,
        method: str,
        path: str,
        data: bytes | None,
        max_retries: int | Unset,
        attempts: Attempts | None,
    ) -> bytes:
        counter = attempts if attempts is not None else Attempts()
        retries = resolve(max_retries, self.settings.retry.max_retries)
        first: TypevetError | None = None
        try:
            return await self._request(method, path, data, counter)
        except TypevetError as error:
            if retries == 0 or not is_transient(error):
                raise
            first = error
        # Only now, after a transient failure, is tenacity entered. Its first attempt re-raises
        # that failure instead of sending again, so its stop, wait and Retry-After rules see
        # exactly the attempts they would have seen had it been entered from the start.
        policy = self.settings.retry
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(retries + 1),
            wait=_WaitRetryAfter(policy),
            retry=retry_if_exception(is_transient),
            reraise=True,
        ):
            with attempt:
                if first is not None:
                    failure, first = first, None
                    raise failure
                return await self._request(method, path, data, counter)
        raise AssertionError("unreachable: tenacity reraises the last error")

    async def _request(
        self, method: str, path: str, data: bytes | None, counter: Attempts
    ) -> bytes:
        if self._session is None:
            state = "closed" if self._closed else "not open"
            raise SessionStateError(f"the HTTP client is {state}")
        url = f"{self.base_url}{path}"
        async with self._connections:
            try:
                counter.count += 1
                return await self._send(self._session, method, url, data)
            except _STALE_CONNECTION_ERRORS:
                # Every request the SDK sends is idempotent; a pooled connection the server
                # closed while idle fails on first use, so send once more on a fresh one.
                try:
                    counter.count += 1
                    return await self._send(self._session, method, url, data)
                except (TimeoutError, aiohttp.ClientError, OSError) as error:
                    raise map_client_error(error, method, url) from error
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                raise map_client_error(error, method, url) from error

    async def _send(
        self, session: aiohttp.ClientSession, method: str, url: str, data: bytes | None
    ) -> bytes:
        headers = None if data is None else _JSON_HEADERS
        # aiohttp's clock starts here, once this request holds one of our connection slots
        # (so waiting for a pooled connection is not counted), and runs to the end of the body.
        async with session.request(
            method,
            url,
            data=data,
            headers=headers,
            allow_redirects=False,
            timeout=self._timeout,
        ) as response:
            raw = await self._read_capped(response, method, url)
            if response.status >= 300:
                text = raw[:2000].decode("utf-8", "replace")
                raise ServerError(
                    f"{method} {url}: HTTP {response.status}: {text[:300]}",
                    status=response.status,
                    body=text,
                    retry_after=parse_retry_after(response.headers.get("Retry-After")),
                )
            return raw

    async def _read_capped(self, response: aiohttp.ClientResponse, method: str, url: str) -> bytes:
        cap = self.settings.max_response_bytes
        length = response.content_length
        if length is not None and length > cap:
            raise ProtocolError(
                f"{method} {url}: response of {length} bytes exceeds the {cap}-byte cap"
            )
        if length is not None and _identity(response.headers.get("Content-Encoding")):
            # The length is known and is the body's own: read it in one call, no per-chunk work.
            return await response.read()
        # Chunked, or compressed (the declared length is not the decoded one): cap as it streams.
        chunks = bytearray()
        async for chunk in response.content.iter_chunked(1 << 20):
            chunks += chunk
            if len(chunks) > cap:
                raise ProtocolError(f"{method} {url}: response exceeds the {cap}-byte cap")
        return bytes(chunks)


_JSON_HEADERS = {"Content-Type": "application/json"}


def _identity(coding: str | None) -> bool:
    """No content coding: the Content-Length is the length of the body aiohttp hands over."""
    return coding is None or coding.strip().lower() == "identity"
