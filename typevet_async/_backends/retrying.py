"""The retry engine every remote call goes through: which failures are worth another attempt,
how long to wait before it, and the loop that makes the attempts.

The HTTP client (`typevet_async._backends.http`) retries one endpoint's requests with it, and
a fleet (`typevet_async._backends.fleet`) a judgment across its endpoints.

The first attempt is sent directly; tenacity's `AsyncRetrying` is entered only after a first
transient failure, which it then sees as its own first attempt, so the policy (stop, waits,
``Retry-After``) is tenacity's alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_base, wait_exponential_jitter

import typevet_async._telemetry as telemetry
from typevet_async._errors import RequestTimeoutError, ServerError, TransportError, TypevetError
from typevet_async._options import non_negative_int, non_negative_number, positive_number

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "RetryPolicy",
    "WaitRetryAfter",
    "is_transient",
    "retrying",
    "transient_but_no_timeout",
]

T = TypeVar("T")

DEFAULT_MAX_RETRIES = 2


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Retries of transient failures: connection errors, timeouts, HTTP 408, 429 and 5xx (529,
    "overloaded", among them), but not 501.

    Backoff is exponential with jitter (``initial`` doubling up to ``maximum``); a
    ``retry-after-ms`` or ``Retry-After`` header is honoured (the first when both are sent),
    up to ``max_retry_after`` seconds. Validation failures,
    other 4xx and template refusals are never retried. ``max_retries=0`` turns retries off.
    """

    max_retries: int = attrs.field(default=DEFAULT_MAX_RETRIES, validator=non_negative_int)
    initial: float = attrs.field(default=0.25, validator=positive_number)
    maximum: float = attrs.field(default=8.0, validator=positive_number)
    jitter: float = attrs.field(default=0.25, validator=non_negative_number)
    max_retry_after: float = attrs.field(default=30.0, validator=positive_number)


def is_transient(error: BaseException) -> bool:
    """Worth another attempt: the server or the network may answer next time."""
    if isinstance(error, TransportError | RequestTimeoutError):
        return True
    if isinstance(error, ServerError):
        # 501 Not Implemented is the server's lasting answer (a System One server that does
        # not judge with this model), not a passing failure; 529 (the hosted API's and
        # Anthropic's "overloaded") is a 5xx like 503.
        return error.status in (408, 429) or (error.status >= 500 and error.status != 501)
    return False


def transient_but_no_timeout(error: BaseException) -> bool:
    """`is_transient`, for a request that would take as long again if sent again."""
    return is_transient(error) and not isinstance(error, RequestTimeoutError)


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    retries: int,
    retryable: Callable[[BaseException], bool],
    wait: Callable[[RetryCallState], float],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    first: TypevetError | None = None,
) -> T:
    """``attempt()``, and up to ``retries`` more after each ``retryable`` failure; with
    ``first``, the first attempt was already made and failed with it (raised as itself unless
    it is retryable and ``retries`` allows another).

    The first attempt runs directly: tenacity is entered only after a transient failure, and
    its first attempt re-raises that failure instead of running again, so its stop and wait
    rules see exactly the attempts they would have seen had it been entered from the start.
    """
    if first is None:
        try:
            return await attempt()
        except TypevetError as error:
            first = error
    if retries == 0 or not retryable(first):
        raise first
    failure: TypevetError | None = first
    async for tenacity_attempt in AsyncRetrying(
        stop=stop_after_attempt(retries + 1),
        wait=wait,
        retry=retry_if_exception(retryable),
        reraise=True,
        sleep=sleep,
        before_sleep=_note_retry,
    ):
        with tenacity_attempt:
            if failure is not None:
                raised, failure = failure, None
                raise raised
            return await attempt()
    raise AssertionError("unreachable: tenacity reraises the last error")


def _note_retry(state: RetryCallState) -> None:
    """Each retry reported (`typevet_async._telemetry.retried`: a span event, a metric, a
    WARNING log record) before its wait."""
    error = state.outcome.exception() if state.outcome else None
    if error is not None:
        wait = state.next_action.sleep if state.next_action else 0.0
        telemetry.retried(state.attempt_number, error, wait)


class WaitRetryAfter(wait_base):
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
