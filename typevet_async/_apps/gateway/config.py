"""The gateway's configuration: its limits, timeouts and bearer keys."""

from __future__ import annotations

import resource
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

import typevet_async as tv
from typevet_async._core.wires.decoding import DecodeBudget
from typevet_async._options import (
    boolean,
    non_negative_int,
    optional,
    positive_int,
    positive_number,
    sequence_of,
)

__all__ = [
    "DEFAULT_AUTO_QUEUE",
    "DEFAULT_KEYS_ENV",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_AUTO_QUEUE",
    "MIN_AUTO_QUEUE",
    "GatewayConfig",
    "NoKeysError",
    "load_keys",
]

DEFAULT_KEYS_ENV: Final = "TYPEVET_SERVE_KEYS"
DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024
#: States past ``max_active_requests`` a batch may carry with the automatic queue
#: (`GatewayConfig.batch_cap`): an idle gateway admits such a batch whatever it has measured.
MIN_AUTO_QUEUE: Final = 64
#: The automatic queue before any judgment's service time has been measured.
DEFAULT_AUTO_QUEUE: Final = 256
#: The automatic queue's ceiling (once measured, the deadline decides within it).
MAX_AUTO_QUEUE: Final = 4096


@attrs.frozen
class GatewayConfig:
    """How the gateway serves; every field checked when built (`ConfigurationError` naming it)."""

    #: Bearer keys; empty: auth is off.
    keys: tuple[str, ...] = attrs.field(
        default=(), validator=sequence_of(str, "a tuple of key strings")
    )
    #: Requests judged at once.
    max_active_requests: int = attrs.field(default=8, validator=positive_int)
    #: Requests that may wait for a slot at most; one more is a 429. None (the default):
    #: `DEFAULT_AUTO_QUEUE` before anything has been measured, then `MAX_AUTO_QUEUE`. Either
    #: way, once service times are measured (the time each recent judgment that did the work
    #: held its slot; fast failures are not counted), a request that would not get its slot
    #: and be judged within ``request_deadline`` behind those admitted is a 429 at once:
    #: it would meet the 504 anyway. One that finds a free slot, or an idle gateway, is
    #: always admitted.
    max_queue: int | None = attrs.field(default=None, validator=optional(non_negative_int))
    #: Seconds per request, waiting for a slot included (None: no limit) -> 504.
    request_deadline: float | None = attrs.field(default=60.0, validator=optional(positive_number))
    #: The largest body, compressed or not (decompressed bytes count too) -> 413.
    max_body_bytes: int = attrs.field(default=DEFAULT_MAX_BODY_BYTES, validator=positive_int)
    #: Questions a request may ask -> 422 (OpenAI's Decisions API allows 400).
    max_questions: int = attrs.field(default=400, validator=positive_int)
    #: States one ``POST /v1/systemone/batch`` may carry -> 422 (``too_long``); `batch_cap`
    #: bounds it by what admission can ever take at once.
    max_batch_states: int = attrs.field(default=64, validator=positive_int)
    #: Image assets a request may carry -> 422.
    max_assets: int = attrs.field(default=32, validator=positive_int)
    #: JSON values a body may hold -> 422.
    max_items: int = attrs.field(default=200_000, validator=positive_int)
    #: Deepest nesting of a body's JSON -> 422 (a deeper state is no ticket).
    max_depth: int = attrs.field(default=128, validator=positive_int)
    #: CPU seconds one body's decode may use -> 422.
    decode_cpu_seconds: float = attrs.field(default=2.0, validator=positive_number)
    #: Bodies decoded at once, each in a worker thread off the event loop.
    decode_threads: int = attrs.field(default=2, validator=positive_int)
    #: Seconds a connection may go without sending a complete request head (idle keep-alive
    #: connections included) -> closed.
    idle_timeout: float = attrs.field(default=15.0, validator=positive_number)
    #: Seconds a request's body may take to arrive -> 408.
    body_timeout: float = attrs.field(default=30.0, validator=positive_number)
    #: Open connections at once. One more closes the connection idle longest (no request in
    #: progress) to take its place; when none is idle, it is answered 503 and closed at once.
    #: None: half the process's file-descriptor limit (at least 16), so accepting is never
    #: what runs out.
    max_connections: int | None = attrs.field(default=None, validator=optional(positive_int))

    def connection_cap(self) -> int:
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(16, soft // 2) if soft != resource.RLIM_INFINITY else 4096

    #: Seconds graceful shutdown waits for in-flight requests.
    shutdown_timeout: float = attrs.field(default=30.0, validator=positive_number)
    #: Seconds between probe attempts until the server is ready.
    probe_interval: float = attrs.field(default=1.0, validator=positive_number)
    #: Forward the caller's W3C ``tracestate`` and ``baggage`` headers to the model server
    #: (sent only with OpenTelemetry on). Off by default: their content is whatever the
    #: caller chose, and the gateway is a trust boundary; the caller's ``traceparent`` is
    #: joined either way, so the trace still runs from the caller to the model server's read.
    forward_tracestate_baggage: bool = attrs.field(default=False, validator=boolean)

    def batch_cap(self) -> int:
        """States a batch may carry: ``max_batch_states``, but at most ``max_active_requests``
        plus `MIN_AUTO_QUEUE` (or ``max_queue``), since each state counts as one request for
        admission and a batch past ``max_queue`` could never be admitted."""
        queue = MIN_AUTO_QUEUE if self.max_queue is None else self.max_queue
        return min(self.max_batch_states, self.max_active_requests + queue)

    def decode_budget(self) -> DecodeBudget:
        """What one body's decode may use: a ``request`` part and one part per asset."""
        return DecodeBudget(
            max_bytes=self.max_body_bytes,
            max_items=self.max_items,
            max_depth=self.max_depth,
            max_parts=self.max_assets + 1,
            cpu_seconds=self.decode_cpu_seconds,
        )


class NoKeysError(tv.ConfigurationError):
    """A key source was named but yields no key: auth is off only when asked for."""


def load_keys(
    keys_file: Path | None, keys_env: str | None, environ: Mapping[str, str]
) -> tuple[str, ...]:
    """The keys of ``keys_file`` (one per line, blank lines and ``#`` comments skipped) and of
    the variable ``keys_env`` (comma-separated).

    :raises OSError: the file cannot be read.
    :raises NoKeysError: the file or the variable is named but holds no key (an empty file,
        one of blank lines, an unset or blank variable): starting with auth off because a key
        file came out empty is the mistake this refuses.
    """
    keys: list[str] = []
    if keys_file is not None:
        from_file = [
            line.strip()
            for line in keys_file.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
        if not from_file:
            raise NoKeysError(
                f"--keys-file {keys_file} holds no key (only blank lines or comments)"
            )
        keys.extend(from_file)
    if keys_env:
        from_env = [k.strip() for k in environ.get(keys_env, "").split(",") if k.strip()]
        if not from_env:
            state = "is not set" if keys_env not in environ else "holds no key"
            raise NoKeysError(f"--keys-env {keys_env}: the variable {state}")
        keys.extend(from_env)
    return tuple(dict.fromkeys(keys))
