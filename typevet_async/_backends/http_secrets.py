"""The secrets an HTTP client sends, registered for redaction.

A client (`typevet_async._backends.http.HttpClient`) registers its API key when it is built,
and its URL's user and password when it is given the URL (built, or opened with it), with
`typevet_async._redaction`, in the forms a server may echo them in; every error then
redacts itself against them. Building an `HttpSettings` registers nothing: a key is
registered once a client that sends it exists.
"""

from __future__ import annotations

import base64
import urllib.parse

import orjson

from typevet_async._redaction import SHORT, register_secret

__all__ = ["register_api_key", "register_url_credentials"]


def _key_forms(key: str) -> tuple[str, ...]:
    """The forms a server may echo a key in: as sent, percent-encoded, JSON-escaped (with and
    without ``/`` escaped)."""
    escaped = orjson.dumps(key).decode()[1:-1]
    return (key, urllib.parse.quote(key, safe=""), escaped, escaped.replace("/", "\\/"))


def register_api_key(key: str) -> None:
    """Register an API key sent as ``Authorization: Bearer <key>``, in every form a server may
    echo it in."""
    register_secret(*_key_forms(key))
    if len(key) < SHORT:
        # Too short to register on its own (`SHORT`): its header form is not. Not a
        # fragment's source: the word "Bearer" is no secret.
        register_secret(f"Bearer {key}", fragments=False)


def register_url_credentials(parts: urllib.parse.SplitResult) -> None:
    """Register a URL's user and password, as written and decoded, and the Basic-auth
    credentials aiohttp sends from them."""
    if parts.username is None and parts.password is None:
        return
    user, password = parts.username or "", parts.password or ""
    decoded_user, decoded_password = urllib.parse.unquote(user), urllib.parse.unquote(password)
    pair = f"{decoded_user}:{decoded_password}"
    try:
        basic = base64.b64encode(pair.encode("latin-1")).decode()
    except UnicodeEncodeError:
        basic = base64.b64encode(pair.encode()).decode()
    register_secret(
        user, password, decoded_user, decoded_password, f"{user}:{password}", pair, basic
    )
