"""Run one coroutine per item in a task group and gather the outcomes in item order.

With ``fail_fast`` the first failure cancels the rest, and the error raised is the first in
*item* order, not in time order; without it every item runs and its error takes its place.
Cancellation is never an outcome: it propagates, and the task group leaves no task behind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

from typevet_async.errors import TypevetError

__all__ = ["gather_in_order"]

T = TypeVar("T")
R = TypeVar("R")


async def gather_in_order(
    items: Sequence[T],
    run: Callable[[T], Awaitable[R]],
    *,
    fail_fast: bool = True,
    label: Callable[[T], str | None] = lambda _: None,
) -> list[R | Exception]:
    """Outcomes in item order; with ``fail_fast`` (the default) the first error is raised.

    ``label`` names the item an SDK error belongs to (it is stored in ``question_id``).
    """
    outcomes: list[R | Exception | None] = [None] * len(items)

    async def one(index: int, scope: anyio.CancelScope) -> None:
        item = items[index]
        try:
            outcomes[index] = await run(item)
        except Exception as error:  # cancellation is not an Exception: it propagates
            if isinstance(error, TypevetError) and error.question_id is None:
                error.question_id = label(item)
            outcomes[index] = error
            if fail_fast:
                scope.cancel()

    async with anyio.create_task_group() as group:
        for index in range(len(items)):
            group.start_soon(one, index, group.cancel_scope)

    if fail_fast:
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
    done: list[R | Exception] = []
    for index, outcome in enumerate(outcomes):
        if outcome is None:
            raise RuntimeError(f"item {index} finished without an outcome")
        done.append(outcome)
    return done
