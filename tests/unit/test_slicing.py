"""Cooperative time slices (`typevet_async._concurrency.slicing`): the SDK's CPU work lets the loop
breathe."""

from __future__ import annotations

import asyncio
import time

import pytest

from typevet_async._concurrency import slicing as _slicing
from typevet_async._concurrency.slicing import SLICE, yield_if_busy

pytestmark = pytest.mark.asyncio


def spin(seconds: float) -> None:
    """Busy CPU work, as decoding a reply is."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def test_within_the_slice_it_does_not_yield() -> None:
    await yield_if_busy(SLICE)  # the loop's first call starts its slice
    switched = []
    asyncio.get_running_loop().call_soon(switched.append, True)
    for _ in range(100):
        await yield_if_busy(SLICE)
    assert switched == []  # the callback never got a turn: no task switch happened


async def test_a_used_up_slice_lets_timers_and_callbacks_run_before_the_rest_of_the_work() -> None:
    order: list[str] = []

    async def worker(n: int) -> None:
        await yield_if_busy(SLICE)
        spin(SLICE / 2)
        order.append(f"w{n}")

    async def ticker() -> None:
        await asyncio.sleep(0)
        order.append("tick")

    tasks = [asyncio.create_task(worker(n)) for n in range(40)]
    tick = asyncio.create_task(ticker())
    await asyncio.gather(*tasks, tick)
    # Without slices the ticker would run after all 40 workers (20 slices of work in one
    # loop iteration); with them it runs within the first few slices.
    assert order.index("tick") < 20
    assert sorted(order) == sorted(["tick", *(f"w{n}" for n in range(40))])


async def test_parked_tasks_resume_in_arrival_order() -> None:
    finished: list[int] = []

    async def worker(n: int) -> None:
        await yield_if_busy(SLICE)
        spin(SLICE / 4)
        finished.append(n)

    await asyncio.gather(*(worker(n) for n in range(30)))
    assert finished == list(range(30))


async def test_a_cancelled_parked_task_leaves_the_queue_and_the_rest_go_on() -> None:
    await yield_if_busy(SLICE)
    spin(2 * SLICE)  # use up the slice: the next callers park
    finished: list[int] = []

    async def worker(n: int) -> None:
        await yield_if_busy(SLICE)
        finished.append(n)

    tasks = [asyncio.create_task(worker(n)) for n in range(5)]
    await asyncio.sleep(0)  # all five have reached the gate
    tasks[2].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[2], asyncio.CancelledError)
    assert finished == [0, 1, 3, 4]


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")  # a sync test under the module mark
def test_each_loop_has_its_own_slice_and_a_closed_loop_leaves_nothing_behind() -> None:
    async def use() -> None:
        await yield_if_busy(SLICE)

    before = len(_slicing._slices)
    for _ in range(3):
        asyncio.run(use())
    assert len(_slicing._slices) <= before + 1  # the weak keys went with their loops


@pytest.mark.parametrize("room", [1, 4])
async def test_a_fresh_slice_wakes_at_most_its_room(room: int) -> None:
    await yield_if_busy(SLICE)
    current = _slicing._slices[asyncio.get_running_loop()]
    current.room = room
    spin(2 * SLICE)
    resumed: list[int] = []

    async def worker(n: int) -> None:
        await yield_if_busy(SLICE)
        resumed.append(n)

    tasks = [asyncio.create_task(worker(n)) for n in range(10)]
    for _ in range(3):  # the workers park, then the first renew runs
        await asyncio.sleep(0)
    assert 1 <= len(resumed) <= current.room + room  # the room may grow once per slice
    assert len(resumed) < 10
    await asyncio.gather(*tasks)
    assert resumed == list(range(10))


async def test_no_slice_never_yields_even_once_the_loops_slice_is_used_up() -> None:
    await yield_if_busy(SLICE)
    spin(2 * SLICE)  # a task with the default slice would park here
    switched = []
    asyncio.get_running_loop().call_soon(switched.append, True)
    for _ in range(100):
        await yield_if_busy(None)
    assert switched == []
    await yield_if_busy(SLICE)  # the default-length caller does park, and lets the loop run
    assert switched == [True]


async def test_a_longer_slice_goes_on_where_the_default_parks() -> None:
    await yield_if_busy(SLICE)
    spin(2 * SLICE)  # past the default length, well within ten seconds
    switched = []
    asyncio.get_running_loop().call_soon(switched.append, True)
    await yield_if_busy(10.0)
    assert switched == []
    await yield_if_busy(SLICE)
    assert switched == [True]
