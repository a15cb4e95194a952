"""Run one coroutine per item in a task group and gather the outcomes in item order.

`gather_in_order` fails fast: the first failure cancels the rest, and the error raised is the
first in *item* order, not in time order. `gather_settled` runs every item and puts each SDK
error in its item's place; any other exception is a bug, and the first (in item order) is
raised once every item has finished. Cancellation is never an outcome: it propagates, and the
task group leaves no task behind. Neither bounds concurrency: the caller's semaphore does.
``run`` returns a value for every item (never None).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

from typevet_async._errors import TypevetError

__all__ = ["gather_in_order", "gather_settled"]

T = TypeVar("T")
R = TypeVar("R")
#: Records which item an SDK error belongs to (a question id, a prompt index) on the error.
Tag = Callable[[TypevetError, int], None]


def _untagged(_: TypevetError, __: int) -> None:
    return None


async def _run_all(
    items: Sequence[T], run: Callable[[T], Awaitable[R]], tag: Tag, *, fail_fast: bool
) -> tuple[list[R | None], list[Exception | None]]:
    results: list[R | None] = [None] * len(items)
    errors: list[Exception | None] = [None] * len(items)

    async def one(index: int, scope: anyio.CancelScope) -> None:
        try:
            results[index] = await run(items[index])
        except Exception as error:  # cancellation is not an Exception: it propagates
            if isinstance(error, TypevetError):
                tag(error, index)
            errors[index] = error
            if fail_fast:
                scope.cancel()

    async with anyio.create_task_group() as group:
        for index in range(len(items)):
            group.start_soon(one, index, group.cancel_scope)
    return results, errors


async def gather_in_order(
    items: Sequence[T], run: Callable[[T], Awaitable[R]], *, tag: Tag = _untagged
) -> list[R]:
    """Every item's result in item order, or the first error in item order (the rest are
    cancelled as soon as one fails). One item runs in the caller's task: no task group."""
    if len(items) == 1:
        try:
            return [await run(items[0])]
        except TypevetError as failure:
            tag(failure, 0)
            raise
    results, errors = await _run_all(items, run, tag, fail_fast=True)
    for error in errors:
        if error is not None:
            raise error
    return [_finished(result, index) for index, result in enumerate(results)]


async def gather_settled(
    items: Sequence[T], run: Callable[[T], Awaitable[R]], *, tag: Tag = _untagged
) -> list[R | TypevetError]:
    """Every item's result or SDK error, in item order; every item runs to its end."""
    results, errors = await _run_all(items, run, tag, fail_fast=False)
    for error in errors:
        if error is not None and not isinstance(error, TypevetError):
            raise error
    return [
        error if isinstance(error, TypevetError) else _finished(result, index)
        for index, (result, error) in enumerate(zip(results, errors, strict=True))
    ]


def _finished(result: R | None, index: int) -> R:
    if result is None:
        raise RuntimeError(f"item {index} finished without an outcome")
    return result
