"""`FairSlots`: a session's read slots, handed round-robin between the judgments that wait, so
one huge judgment cannot starve a small one (behind the gateway, a 20,000-question request made
a 1-question request time out)."""

from __future__ import annotations

import asyncio

import pytest

import typevet_async as tv
from typevet_async._session.fair_slots import FairSlots

from .stubs import InMemoryStubBackend, noul, sleeping


@pytest.mark.asyncio
async def test_waiting_shares_are_served_in_turn_each_in_its_own_order() -> None:
    slots = FairSlots(1)
    big, small = slots.share(), slots.share()
    order: list[str] = []
    await slots.acquire(big)  # held: everyone below waits

    async def read(share: object, name: str) -> None:
        async with share:  # type: ignore[attr-defined]
            order.append(name)

    tasks = [asyncio.create_task(read(big, f"big {n}")) for n in range(4)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(read(small, f"small {n}")) for n in range(2)]
    await asyncio.sleep(0)
    slots.release()
    await asyncio.gather(*tasks)
    assert order == ["big 0", "small 0", "big 1", "small 1", "big 2", "big 3"]


@pytest.mark.asyncio
async def test_a_cancelled_waiter_gives_its_turn_and_any_slot_it_was_handed_back() -> None:
    slots = FairSlots(1)
    share = slots.share()
    await slots.acquire(share)
    first = asyncio.create_task(slots.acquire(share))
    second = asyncio.create_task(slots.acquire(share))
    await asyncio.sleep(0)
    first.cancel()  # still waiting: it simply leaves the line
    await asyncio.sleep(0)
    slots.release()  # handed to second
    second.cancel()  # cancelled before it ran: the slot it was handed goes back
    with pytest.raises(asyncio.CancelledError):
        await second
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not slots.locked()
    await asyncio.wait_for(slots.acquire(share), 1)  # free, no one waiting
    assert slots.locked()


@pytest.mark.asyncio
async def test_a_small_judgment_is_not_starved_by_a_huge_one_before_it() -> None:
    backend = InMemoryStubBackend()
    big = {f"q{n}": noul(n) for n in range(200)}
    for question_id in big:
        backend.behaviours[question_id] = sleeping(0.005)
    started = asyncio.Event()

    async def first_read() -> None:
        started.set()
        await asyncio.sleep(0.005)

    backend.behaviours["q1"] = first_read
    settings = tv.SessionSettings(max_concurrency=2, prefix_reuse="off")
    async with tv.Session(backend, settings) as session:
        await session.probe()
        huge = asyncio.create_task(session.judge("huge", big))
        await started.wait()  # the huge judgment holds both slots, 198 reads queued behind
        small = await session.judge("small", {"small": noul(999)})
        reads_before_small = len(backend.reads) - 1
        assert not huge.done()
        await huge
    assert small["small"] is not None
    # served in turn: a read or two of the huge one, not the 196 it had queued
    assert reads_before_small < 12, reads_before_small
