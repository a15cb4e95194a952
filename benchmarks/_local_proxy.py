"""A local HTTP proxy in front of a real server, and OpenAI's refusal of a ``top_logprobs``
above its cap: what the benchmarks' capped server (``real_answers.bench_openai_compatible``)
and the live tests' proxies (``tests/live/faults.py``) are built on.

Not a benchmark itself. A subclass answers each request (`LocalProxy._handle`), forwarding to
the real server with `LocalProxy.forward`; the replies are the real server's.
"""

from __future__ import annotations

from typing import Any, Self

import aiohttp
from aiohttp import web

#: OpenAI's own refusal of a window above its cap (its API's wording and error shape).
OPENAI_CAP_MESSAGE = (
    "Invalid 'top_logprobs': integer above maximum value. Expected a value <= {cap}, but got "
    "{asked} instead."
)


def cap_refusal(asked: Any, cap: int, *, name_limit: bool = True) -> web.Response | None:
    """OpenAI's HTTP 400 for a chat body's ``top_logprobs`` (``asked``) above ``cap``: its
    message naming the limit (``name_limit=False``: a bare "invalid request"); None when the
    window is within the cap."""
    if not (isinstance(asked, int) and asked > cap):
        return None
    error = {
        "message": OPENAI_CAP_MESSAGE.format(cap=cap, asked=asked)
        if name_limit
        else "invalid request",
        "type": "invalid_request_error",
        "param": "top_logprobs",
        "code": "integer_above_max_value",
    }
    return web.json_response({"error": error}, status=400)


class LocalProxy:
    """An aiohttp.web server on 127.0.0.1 in the caller's event loop, in front of
    ``upstream``, with a client session to it; a subclass answers each request (``_handle``)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        self._client = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._client is not None
        assert self._runner is not None
        await self._client.close()
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def forward(self, request: web.Request, data: bytes) -> tuple[int, bytes]:
        """``request`` sent on to the real server with ``data`` as its body (JSON): the
        reply's status and bytes."""
        assert self._client is not None
        headers = {"Content-Type": "application/json"} if data else None
        # Sent once more if the pooled upstream connection was one the server had closed
        # while idle (seen once in CI): the proxy's own hiccup must not pass for the server's
        # reply (or a scripted fault).
        for resend in (False, True):
            try:
                async with self._client.request(
                    request.method,
                    f"{self.upstream}{request.rel_url}",
                    data=data or None,
                    headers=headers,
                ) as upstream:
                    return upstream.status, await upstream.read()
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
                if resend:
                    raise
        raise AssertionError("unreachable: the second send returns or raises")
