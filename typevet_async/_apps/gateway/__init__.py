"""``typevet-async serve``: a System One gateway (``POST /v1/systemone``) in front of a session.

An I/O shell over `typevet_async._core.wires.system_one`. Built on **aiohttp.web**: aiohttp is
already
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
- ``POST /v1/systemone/batch``: several states, the same questions, one result or item error
  per state in input order (`typevet_async._apps.gateway.batch`).
- ``POST /v1/decisions``: OpenAI's Decisions API from the same judgments
  (`typevet_async._apps.gateway.decisions`; its errors in OpenAI's shape).
- ``GET /v1/models``: the System One model list, one entry: the served model; its
  ``release_date`` is a placeholder, the UTC date the gateway's probe succeeded. It
  advertises the batch route and its cap (``x_systemone_batch``) and names the SDK's version
  (``x_typevet_version``). Every response's ``Server`` header is ``typevet-async/<version>``.
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

from typevet_async._apps.gateway.app import build_app
from typevet_async._apps.gateway.bodies import decode_request
from typevet_async._apps.gateway.config import (
    DEFAULT_AUTO_QUEUE,
    DEFAULT_KEYS_ENV,
    DEFAULT_MAX_BODY_BYTES,
    MAX_AUTO_QUEUE,
    MIN_AUTO_QUEUE,
    GatewayConfig,
    NoKeysError,
    load_keys,
)
from typevet_async._apps.gateway.encoding import decompress
from typevet_async._apps.gateway.serving import app_runner, runner_options, running, serve, shutdown
from typevet_async._apps.gateway.state import SESSION, STATE
from typevet_async._apps.presenting import model_alias
from typevet_async._errors import BadEncodingError, BodyTooLargeError

__all__ = [
    "DEFAULT_AUTO_QUEUE",
    "DEFAULT_KEYS_ENV",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_AUTO_QUEUE",
    "MIN_AUTO_QUEUE",
    "SESSION",
    "STATE",
    "BadEncodingError",
    "BodyTooLargeError",
    "GatewayConfig",
    "NoKeysError",
    "app_runner",
    "build_app",
    "decode_request",
    "decompress",
    "load_keys",
    "model_alias",
    "runner_options",
    "running",
    "serve",
    "shutdown",
]
