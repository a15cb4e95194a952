"""Events inside a judgment: a retry, an escalation, an off-menu trip, a slot wait, a cache
lookup; each a span event where one is recording, a metric, and (retries and escalations) a
WARNING log record."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from typevet_async._telemetry.instruments import OTEL, active, instruments, read_log, retry_log
from typevet_async._telemetry.spans import error_type

if TYPE_CHECKING:
    from typevet_async._core.prompts.scoring import ScoringRequest

if OTEL:
    from opentelemetry import trace as _trace

__all__ = [
    "cache_store_failed",
    "escalated",
    "off_menu_raised",
    "quiet_retries",
    "retried",
    "slot_waited",
]

#: The level a retry is logged at here (`quiet_retries`).
_retry_level: contextvars.ContextVar[int] = contextvars.ContextVar(
    "typevet_retry_level", default=logging.WARNING
)


@contextlib.contextmanager
def quiet_retries() -> Iterator[None]:
    """Retries inside are logged at DEBUG, still counted and still span events: for a
    background check whose outcome its caller reports once (a fleet's health check of an
    endpoint that is down would otherwise log two WARNINGs per check for a whole outage)."""
    token = _retry_level.set(logging.DEBUG)
    try:
        yield
    finally:
        _retry_level.reset(token)


def off_menu_raised(request: ScoringRequest) -> None:
    """An off-menu trip that raised (``raise_off_menu``): counted like a flagged one."""
    instruments().off_menu.add(1, {"typevet.question.type": type(request.question).__name__})


def retried(attempt: int, error: BaseException, wait: float) -> None:
    """A transient failure about to be retried after ``wait`` seconds: an event on the current
    span, counted, and a WARNING log record (DEBUG under `quiet_retries`)."""
    kind = error_type(error)
    status = getattr(error, "status", None)
    if OTEL and active():
        event: dict[str, Any] = {
            "typevet.attempt": attempt,
            "error.type": kind,
            "typevet.wait_s": wait,
        }
        if status is not None:
            event["http.response.status_code"] = status
        _trace.get_current_span().add_event("typevet.retry", event)
        instruments().retries.add(1, {"error.type": kind})
    retry_log.log(
        _retry_level.get(),
        "attempt %d failed (%s%s); retrying in %.2f s",
        attempt,
        kind,
        f" {status}" if status is not None else "",
        wait,
        extra={"attempts": attempt, "status": status, "error_type": kind, "wait_s": wait},
    )


def escalated(top_k: int, next_top_k: int, missing: int) -> None:
    """A read that missed ``missing`` candidates in its top ``top_k``, sent again with
    ``next_top_k``: an event on the current span, counted, and a WARNING log record."""
    if OTEL and active():
        _trace.get_current_span().add_event(
            "typevet.escalation",
            {
                "typevet.read.top_k": top_k,
                "typevet.read.next_top_k": next_top_k,
                "typevet.read.missing": missing,
            },
        )
        instruments().escalations.add(1)
    read_log.warning(
        "%d candidate(s) outside the top %d: reading again with the top %d",
        missing,
        top_k,
        next_top_k,
        extra={"top_k": top_k, "next_top_k": next_top_k, "missing": missing},
    )


def slot_waited(seconds: float) -> None:
    """A read waited ``seconds`` for a session slot (only reads that waited are recorded)."""
    if active():
        instruments().slot_wait.record(seconds)


def cache_store_failed(reads: int, kind: str) -> None:
    """The read cache failed to store ``reads`` reads, for an error of type ``kind``: counted
    (the store logs it; a judgment never waits on it)."""
    if active():
        instruments().cache_failures.add(reads, {"error.type": kind})
