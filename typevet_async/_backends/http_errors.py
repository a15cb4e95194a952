"""What the HTTP client raises: aiohttp's and the OS's errors, and the server's error replies,
mapped to the SDK's errors.

No error built here chains an aiohttp exception or keeps a reference to one: aiohttp's carry
the request's headers, the bearer token among them. Every URL is shown redacted. Only a status
the server sent is a `ServerError`; a reply aiohttp could not parse (a malformed or cut-off
header block, a body it cannot decode) is a `ProtocolError` that says what was wrong.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import time

import aiohttp
from aiohttp.http import RawResponseMessage
from aiohttp.http_exceptions import ContentEncodingError

from typevet_async._errors import (
    ProtocolError,
    RequestTimeoutError,
    ServerError,
    TransportError,
    TypevetError,
)
from typevet_async._redaction import excerpt, redact

__all__ = ["is_stale_connection", "map_client_error", "parse_retry_after", "server_error"]

#: A pooled connection the server already closed fails like this on first use.
_STALE_CONNECTION_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
#: Characters of an error reply's body kept in `ServerError.body`, and in its message.
_BODY_EXCERPT = 2000
_MESSAGE_EXCERPT = 300


def parse_retry_after(value: str | None, milliseconds: str | None = None) -> float | None:
    """Seconds to wait, from a ``retry-after-ms`` header (milliseconds, as the official System
    One client and OpenAI's send and read it; taken first when it is a finite non-negative
    number) or else a ``Retry-After`` header: delay-seconds or an HTTP date."""
    if milliseconds:
        with contextlib.suppress(ValueError):
            wait = float(milliseconds.strip())
            if math.isfinite(wait) and wait >= 0:
                return wait / 1000
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


def _one_line(text: str) -> str:
    return " ".join(text.split())


def map_client_error(
    error: BaseException, method: str, url: str, *, timeout: float | None = None
) -> TypevetError:
    """The most specific SDK error for an aiohttp or OS error.

    It copies what the caller needs into its message and keeps no reference to ``error``
    (aiohttp's errors carry the request's headers); raise it outside the ``except`` block, so
    that it does not chain ``error`` as its context either. ``url`` is shown redacted.
    """
    where = f"{method} {redact(url)}"
    if isinstance(error, TimeoutError | aiohttp.ServerTimeoutError):
        limit = f" after {timeout:g} s (request_timeout)" if timeout is not None else ""
        return RequestTimeoutError(f"{where}: timed out{limit}")
    if isinstance(error, aiohttp.ClientPayloadError):
        if isinstance(error.__cause__, ContentEncodingError):
            detail = _one_line(str(error))
            return ProtocolError(f"{where}: the reply's body could not be decoded ({detail})")
        return TransportError(f"{where}: response body cut off ({_one_line(str(error))})")
    if isinstance(error, aiohttp.ClientResponseError):
        # Never a status the server sent: redirects are not followed and no status is raised
        # for, so aiohttp raises this only when it cannot parse the reply (its ``status`` is
        # the parser's own 400).
        return ProtocolError(f"{where}: malformed reply: {_one_line(error.message)}")
    if isinstance(error, aiohttp.ServerDisconnectedError) and isinstance(
        error.message, RawResponseMessage
    ):
        head = f"HTTP/{error.message.version[0]}.{error.message.version[1]} {error.message.code}"
        return ProtocolError(f"{where}: the reply's header block was cut off after {head!r}")
    if isinstance(error, aiohttp.ClientError | OSError):
        return TransportError(f"{where}: {type(error).__name__}: {_one_line(str(error))}")
    return TransportError(f"{where}: {type(error).__name__}")


def is_stale_connection(error: BaseException) -> bool:
    """How a pooled connection the server closed while idle fails on first use (no byte of a
    reply came back: a cut-off header block is the server's answer, not a stale connection)."""
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return not isinstance(error.message, RawResponseMessage)
    return isinstance(error, _STALE_CONNECTION_ERRORS)


def server_error(
    response: aiohttp.ClientResponse, raw: bytes, method: str, url: str
) -> ServerError:
    """The status the server sent, with a redacted excerpt of its body (and, for a redirect,
    where it pointed). Neither the reason phrase nor any other header is kept."""
    # Twice the excerpt's bytes: room for a multi-byte character, or a secret, at the cut.
    body = excerpt(raw[: 2 * _BODY_EXCERPT].decode("utf-8", "replace"), _BODY_EXCERPT)
    detail = body[:_MESSAGE_EXCERPT]
    location = response.headers.get("Location")
    if 300 <= response.status < 400 and location:
        shown = excerpt(location, _MESSAGE_EXCERPT)
        detail = f"redirect to {shown!r} not followed" + (f": {detail}" if detail else "")
    return ServerError(
        f"{method} {redact(url)}: HTTP {response.status}: {detail}",
        status=response.status,
        body=body,
        retry_after=parse_retry_after(
            response.headers.get("Retry-After"), response.headers.get("retry-after-ms")
        ),
    )
