"""A session's read slots, shared fairly between the judgments that wait for them.

A semaphore serves its waiters first come, first served: a judgment of 400 questions queues
400 reads, and a one-question judgment that arrives a moment later waits behind all of them
(behind the gateway, one huge request made every other request time out). `FairSlots` hands a
freed slot to the judgments that wait in turn, round-robin, each judgment's own reads in their
order: a small judgment waits for about one read per judgment ahead of it, not for every read
they queued. With no one waiting, taking a slot is as cheap as a semaphore's.

Each judgment (or generation) takes its slots through its own `SlotShare` (`FairSlots.share`).
"""

from __future__ import annotations

import asyncio
import collections
import time
from types import TracebackType

import typevet_async._telemetry as telemetry

__all__ = ["FairSlots", "SlotShare"]


class SlotShare:
    """One judgment's way to the shared slots: ``async with share:`` holds one slot."""

    __slots__ = ("_slots",)

    def __init__(self, slots: FairSlots) -> None:
        self._slots = slots

    async def __aenter__(self) -> None:
        await self._slots.acquire(self)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._slots.release()


class FairSlots:
    """``value`` slots; waiting judgments are served round-robin (see the module)."""

    def __init__(self, value: int) -> None:
        if value < 1:
            raise ValueError("FairSlots needs at least one slot")
        self._free = value
        #: Each waiting share's waiters, oldest first.
        self._waiting: dict[SlotShare, collections.deque[asyncio.Future[None]]] = {}
        #: Shares with waiters, in the order they are served next.
        self._turns: collections.deque[SlotShare] = collections.deque()

    def share(self) -> SlotShare:
        """A new judgment's share."""
        return SlotShare(self)

    def locked(self) -> bool:
        """No slot is free."""
        return self._free == 0

    async def acquire(self, share: SlotShare) -> None:
        if self._free > 0 and not self._turns:  # nobody waits: take it
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(share)
        if queue is None:
            queue = self._waiting[share] = collections.deque()
            self._turns.append(share)
        queue.append(waiter)
        started = time.perf_counter()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot just as it was cancelled: pass it on
            else:
                self._forget(share, waiter)
            raise
        telemetry.slot_waited(time.perf_counter() - started)

    def release(self) -> None:
        self._free += 1
        while self._free > 0 and self._turns:
            share = self._turns.popleft()
            queue = self._waiting[share]
            waiter = queue.popleft()
            if queue:
                self._turns.append(share)  # its next read waits for its next turn
            else:
                del self._waiting[share]
            if not waiter.done():
                self._free -= 1
                waiter.set_result(None)

    def _forget(self, share: SlotShare, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(share)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            return
        if not queue:
            del self._waiting[share]
            self._turns.remove(share)
