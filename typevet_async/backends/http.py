"""The HTTP shell every backend talks through: one aiohttp pool, errors mapped to the SDK's.

Security defaults: redirects are never followed, TLS verification stays on, the API key is
sent as a bearer header and never appears in a repr or an error message, and a response body
larger than ``max_response_bytes`` is refused while it streams in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from typevet_async.errors import (
    ProtocolError,
    ReadTimeoutError,
    ServerError,
    SessionStateError,
    TransportError,
    TypevetError,
)

__all__ = ["DEFAULT_MAX_RESPONSE_BYTES", "HttpClient", "map_client_error"]

#: A whole-vocabulary llama.cpp read of a 262,144-token vocabulary is about 26 MB.
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024

#: llama.cpp closes idle keep-alive connections after about 5 s; keep ours for less.
_KEEPALIVE_SECONDS = 2.0

#: A pooled connection the server already closed fails like this on first use.
_STALE_CONNECTION_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def map_client_error(error: BaseException, method: str, url: str) -> TypevetError:
    """The most specific SDK error for an aiohttp or OS error (never carries headers)."""
    where = f"{method} {url}"
    if isinstance(error, TimeoutError | aiohttp.ServerTimeoutError):
        return ReadTimeoutError(f"{where}: timed out")
    if isinstance(error, aiohttp.ClientPayloadError):
        return ProtocolError(f"{where}: response body cut off ({error})")
    if isinstance(error, aiohttp.ClientResponseError):
        return ServerError(f"{where}: HTTP {error.status}", status=error.status, body="")
    if isinstance(error, aiohttp.ClientError | OSError):
        return TransportError(f"{where}: {type(error).__name__}: {error}")
    return TransportError(f"{where}: {type(error).__name__}")


class HttpClient:
    """A pooled JSON-over-HTTP client for one server (lifecycle: unopened, open, closed)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        read_timeout: float = 60.0,
        max_connections: int = 64,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        verify_tls: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._read_timeout = read_timeout
        self._max_connections = max_connections
        self._max_response_bytes = max_response_bytes
        self._trace_configs = list(trace_configs)
        self._verify_tls = verify_tls
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        #: How long an idle pooled connection is kept (below llama.cpp's own ~5 s).
        self.keepalive_seconds = _KEEPALIVE_SECONDS

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"HttpClient(base_url={self.base_url!r}, api_key=<{key}>)"

    async def open(self) -> None:
        if self._closed:
            raise SessionStateError("cannot reopen a closed client")
        if self._session is not None:
            return
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        connector = aiohttp.TCPConnector(
            limit=self._max_connections,
            keepalive_timeout=self.keepalive_seconds,
            ssl=self._verify_tls,  # True: verify with the default context
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self._read_timeout),
            trace_configs=self._trace_configs or None,
            json_serialize=lambda value: orjson.dumps(value).decode(),
        )

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def get_json(self, path: str) -> Any:
        return await self._request("GET", path, None)

    async def post_json(self, path: str, body: Any) -> Any:
        return await self._request("POST", path, body)

    async def _request(self, method: str, path: str, body: Any) -> Any:
        if self._session is None:
            state = "closed" if self._closed else "not open"
            raise SessionStateError(f"the HTTP client is {state}")
        url = f"{self.base_url}{path}"
        try:
            return await self._send(self._session, method, url, body)
        except _STALE_CONNECTION_ERRORS:
            # Every request the SDK sends is idempotent; a pooled connection the server closed
            # while idle fails on first use, so send once more on a fresh connection.
            try:
                return await self._send(self._session, method, url, body)
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                raise map_client_error(error, method, url) from error
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise map_client_error(error, method, url) from error

    async def _send(self, session: aiohttp.ClientSession, method: str, url: str, body: Any) -> Any:
        data = None if body is None else orjson.dumps(body)
        headers = None if data is None else {"Content-Type": "application/json"}
        async with session.request(
            method, url, data=data, headers=headers, allow_redirects=False
        ) as response:
            raw = await self._read_capped(response, method, url)
            if response.status >= 300:
                text = raw[:2000].decode("utf-8", "replace")
                raise ServerError(
                    f"{method} {url}: HTTP {response.status}: {text[:300]}",
                    status=response.status,
                    body=text,
                )
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise ProtocolError(
                f"{method} {url}: response is not valid JSON ({error})",
                payload=raw[:2000].decode("utf-8", "replace"),
            ) from error

    async def _read_capped(self, response: aiohttp.ClientResponse, method: str, url: str) -> bytes:
        cap = self._max_response_bytes
        if response.content_length is not None and response.content_length > cap:
            raise ProtocolError(
                f"{method} {url}: response of {response.content_length} bytes exceeds the "
                f"{cap}-byte cap"
            )
        chunks = bytearray()
        async for chunk in response.content.iter_chunked(1 << 20):
            chunks += chunk
            if len(chunks) > cap:
                raise ProtocolError(f"{method} {url}: response exceeds the {cap}-byte cap")
        return bytes(chunks)
