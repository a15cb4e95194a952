"""A whole call's deadline: ``timeout`` seconds for a judgment, a batch's record or its
probe, or a set of generations; past it, `DeadlineExceededError`, every request of the call
cancelled."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import anyio

from typevet_async._errors import DeadlineExceededError, TypevetError

__all__ = ["call_deadline"]


@contextlib.contextmanager
def call_deadline(timeout: float | None, what: str) -> Iterator[None]:
    """``timeout`` seconds for a whole call; past it, `DeadlineExceededError`. No timeout, no
    cancel scope."""
    if timeout is None:
        yield
        return
    try:
        with anyio.fail_after(timeout):
            yield
    except TypevetError:
        raise  # a RequestTimeoutError is a TimeoutError too: it stays what it is
    except TimeoutError:
        raise DeadlineExceededError(
            f"{what} did not finish within {timeout} s; its requests were cancelled"
        ) from None
