"""The two ways of gathering a fan-out: fail fast (results only) or settled (errors in place)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

import typevet_async as tv
from typevet_async._concurrency.fanout import gather_in_order, gather_settled

from .stubs import stopwatch

pytestmark = pytest.mark.asyncio

#: Item -> (seconds before it finishes, the error it then raises or None).
Plan = dict[int, tuple[float, Exception | None]]


def runner(
    plan: Plan, finished: list[int], cancelled: list[int]
) -> Callable[[int], Awaitable[str]]:
    async def run(item: int) -> str:
        delay, error = plan.get(item, (0.0, None))
        try:
            # An item that fails is shielded, so that it fails whatever failed before it.
            with anyio.CancelScope(shield=error is not None):
                await anyio.sleep(delay)
        except anyio.get_cancelled_exc_class():
            cancelled.append(item)
            raise
        finished.append(item)
        if error is not None:
            raise error
        return f"r{item}"

    return run


async def test_gather_in_order_returns_results_in_item_order() -> None:
    finished: list[int] = []
    run = runner({0: (0.05, None), 1: (0.02, None), 2: (0.0, None)}, finished, [])
    results = await gather_in_order([0, 1, 2], run)
    assert results == ["r0", "r1", "r2"]
    assert finished == [2, 1, 0]


async def test_gather_in_order_raises_the_first_error_in_item_order_and_cancels_the_rest() -> None:
    late = tv.ServerError("late", status=500, body="")
    early = tv.ServerError("early", status=503, body="")
    finished: list[int] = []
    cancelled: list[int] = []
    # Item 1 fails first in time, item 0 later; item 2 would take 30 s.
    run = runner({0: (0.05, late), 1: (0.0, early), 2: (30.0, None)}, finished, cancelled)
    tags: list[tuple[str, int]] = []

    def tag(error: tv.TypevetError, index: int) -> None:
        tags.append((str(error), index))

    with stopwatch() as watch, pytest.raises(tv.ServerError) as caught:
        await gather_in_order([0, 1, 2], run, tag=tag)
    assert caught.value is late
    assert sorted(tags) == [("early", 1), ("late", 0)]
    assert cancelled == [2]
    assert watch.elapsed < 10.0  # far below item 2's 30 s


async def test_gather_settled_puts_each_sdk_error_in_its_place_and_runs_every_item() -> None:
    error = tv.ProtocolError("broken")
    finished: list[int] = []
    cancelled: list[int] = []
    run = runner({0: (0.05, None), 1: (0.0, error), 2: (0.02, None)}, finished, cancelled)
    prompts: list[int] = []

    def tag(failure: tv.TypevetError, index: int) -> None:
        failure.prompt_index = index
        prompts.append(index)

    results = await gather_settled([0, 1, 2], run, tag=tag)
    assert results == ["r0", error, "r2"]
    assert error.prompt_index == 1
    assert prompts == [1]
    assert sorted(finished) == [0, 1, 2]
    assert cancelled == []


async def test_gather_settled_reraises_an_exception_that_is_not_the_sdks() -> None:
    finished: list[int] = []
    run = runner(
        {0: (0.0, tv.ProtocolError("typed")), 1: (0.0, RuntimeError("bug")), 2: (0.05, None)},
        finished,
        [],
    )
    with pytest.raises(RuntimeError, match="bug"):
        await gather_settled([0, 1, 2], run)
    assert sorted(finished) == [0, 1, 2]  # raised once every item had finished
