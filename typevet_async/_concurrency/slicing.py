"""Cooperative time slices: the SDK's own CPU work never holds the event loop for long.

When many replies arrive in one selector wake-up, asyncio runs every woken task's step in one
loop iteration before any timer or other callback gets its turn. With 64 reads in flight and
about 0.25 ms of decoding and interpreting each, that is 16 ms during which an async web app's
other handlers wait (measured on the replay server: a 1 ms ticker's p99 lag was 32 ms).

`yield_if_busy` is awaited at the two points where a read's CPU work starts: before a request
is sent and before a reply is decoded. While the loop's current slice has run for less than
the caller's slice length (`SLICE` by default: the HTTP client's ``time_slice``), it returns
at once (no loop trip). Past that, the slice is over: the task parks in a first-come queue,
and early in the next loop iteration a fresh slice wakes as many parked tasks as it has room
for (adapted to how far past the slice length the slices run), the rest waiting for the
iterations after. The loop's timers and I/O callbacks thus run every slice or so, and a parked
task costs nothing until its turn.

A length of None never yields: for a loop that runs nothing but the SDK's work (a batch
pipeline), where the slices only cost CPU, little of it (measured at concurrency 64: about 10
µs of about 320 µs a question, with 64 KiB socket reads; the lag p99 then rose from 3.5 to 21
ms; `benchmarks.client_cost.bench_client_cost`, `benchmarks.client_cost.bench_event_loop_lag`).
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from typing import Final

__all__ = ["SLICE", "yield_if_busy"]

#: Seconds of the SDK's own work one loop iteration may run before the SDK's tasks yield, by
#: default (a 1.5 ms slice took the p99 lag of a 1 ms ticker past 5 ms at concurrency 64).
SLICE: Final = 0.001


class _Slice:
    """One event loop's slice: when it started, how many parked tasks a fresh slice wakes,
    and who waits."""

    __slots__ = ("expired", "expired_at", "length", "room", "started", "waiting")

    def __init__(self) -> None:
        # No reference to the loop: the loop is this record's weak key.
        self.started = time.perf_counter()
        self.expired = False
        #: The slice length of the task that found it used up (what `renew` adapts the room
        #: to).
        self.length = SLICE
        #: When the slice ran out and the next `renew` was scheduled: the time until that
        #: `renew` runs is the rest of the loop's iteration, which the loop's timers and other
        #: tasks wait for too.
        self.expired_at = self.started
        #: Parked tasks a fresh slice wakes: halved while the wait above exceeds `length` (the
        #: woken tasks' work, and the replies they caused, did not fit), grown by a quarter
        #: while it stays under half of it.
        self.room = 4
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    def expire(self, now: float, length: float) -> None:
        self.expired = True
        self.expired_at = now
        self.length = length
        asyncio.get_running_loop().call_soon(self.renew)

    def renew(self) -> None:
        """A fresh slice: wake the parked tasks it has room for, in arrival order."""
        now = time.perf_counter()
        overrun, length = now - self.expired_at, self.length
        if overrun > length:
            self.room = max(1, self.room // 2)
        elif overrun < length / 2:
            self.room = min(_MAX_ROOM, self.room + max(1, self.room // 4))
        self.started = now
        self.expired = False
        woken = 0
        while self.waiting and woken < self.room:
            waiter = self.waiting.popleft()
            if not waiter.done():  # a cancelled waiter has left the queue
                waiter.set_result(None)
                woken += 1
        if self.waiting:  # the rest wait for the next slice; newcomers queue behind them
            self.expire(now, length)


#: The most parked tasks one slice wakes.
_MAX_ROOM: Final = 256


_slices: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slice] = weakref.WeakKeyDictionary()


#: The last loop asked about, weakly, and its slice: one call of a weak reference on the hot
#: path instead of a `WeakKeyDictionary` lookup, which builds a weak reference every time.
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], _Slice] | None = None


def _slice_of(loop: asyncio.AbstractEventLoop) -> _Slice:
    global _last
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    current = _slices.get(loop)
    if current is None:
        current = _slices[loop] = _Slice()
    _last = (weakref.ref(loop), current)
    return current


async def yield_if_busy(length: float | None) -> None:
    """Return at once within the loop's slice (``length`` seconds; None: always); past it,
    wait for a later slice's turn."""
    if length is None:
        return
    loop = asyncio.get_running_loop()
    current = _slice_of(loop)
    if not current.expired:
        now = time.perf_counter()
        if now - current.started < length:
            return
        current.expire(now, length)
    waiter = loop.create_future()
    current.waiting.append(waiter)
    await waiter  # a cancelled waiter is skipped by `renew`
