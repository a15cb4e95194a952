"""Streaming batches: ``session.judge_many(records, questions)`` as an async iterator.

Memory and work stay bounded whatever the input size: a producer pulls one record at a time
from the (async) iterable, and only after a window slot is free; ``max_in_flight`` workers
judge them; a record holds its window slot until its item is yielded. So at most ``window``
records are in flight or waiting to be yielded, and no task is created per record.

With ``ordered=True`` items come out in input order (the window is the reorder buffer); with
``ordered=False`` as they complete. A failing record yields an item with its typed error and
the batch goes on; with ``fail_fast=True`` the first error cancels the rest and is raised.

If you may stop iterating early, close the iterator where you stop, e.g. with
``contextlib.aclosing``: that cancels the in-flight requests at once. Cancelling the task that
iterates does the same.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sized,
)
from typing import Any

import anyio
import attrs

from typevet_async._core.answers import Judgment
from typevet_async._errors import TypevetError
from typevet_async._settings import BatchOptions

__all__ = ["BatchItem", "Progress", "judge_stream"]

Record = Any
Judge = Callable[[Any], Awaitable[Judgment]]


@attrs.frozen
class BatchItem:
    """One record's outcome: its judgment, or the typed error that ended it."""

    index: int
    record_id: Any
    judgment: Judgment | None = None
    error: TypevetError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@attrs.frozen
class Progress:
    """Where a batch stands; ``total`` is None when the input has no length."""

    done: int
    failed: int
    total: int | None
    elapsed: float

    @property
    def rate(self) -> float:
        """Records finished per second so far."""
        return self.done / self.elapsed if self.elapsed > 0 else 0.0


def split_record(record: Record, index: int) -> tuple[Any, Any]:
    """``(id, state)`` from a 2-tuple, else ``(index, record)``: a list is a JSON state."""
    if isinstance(record, tuple) and len(record) == 2:
        return record[0], record[1]
    return index, record


async def _records(records: Iterable[Record] | AsyncIterable[Record]) -> AsyncIterator[Record]:
    if isinstance(records, AsyncIterable):
        async for record in records:
            yield record
    else:
        for record in records:
            yield record


def shed_frame_locals(error: BaseException) -> None:
    """Clear the local variables of the finished frames in an error's traceback and in its
    causes' and contexts': an item kept by the caller must not pin what the failed read held
    (a parsed top-4096 response is about 2.5 MB of Python objects). File names and line
    numbers stay, so the traceback still prints. The frame still running is left alone
    (`traceback.clear_frames` skips it).
    """
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)


async def judge_stream(
    records: Iterable[Record] | AsyncIterable[Record],
    judge: Judge,
    options: BatchOptions,
    *,
    ordered: bool = True,
    fail_fast: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
) -> AsyncGenerator[BatchItem, None]:
    """The batch engine behind `Session.judge_many` (``judge`` judges one state)."""
    total = len(records) if isinstance(records, Sized) else None
    slots = anyio.Semaphore(options.window)
    jobs_send, jobs_receive = anyio.create_memory_object_stream[tuple[int, Any, Any]](0)
    # Unbounded buffer, but never more than ``window`` items: each holds a window slot.
    done_send, done_receive = anyio.create_memory_object_stream[BatchItem](math.inf)
    started = time.monotonic()
    counts = {"done": 0, "failed": 0}

    async def produce() -> None:
        async with jobs_send:
            index = 0
            async for record in _records(records):
                await slots.acquire()
                record_id, state = split_record(record, index)
                await jobs_send.send((index, record_id, state))
                index += 1

    async def work(
        jobs: anyio.abc.ObjectReceiveStream[tuple[int, Any, Any]],
        done: anyio.abc.ObjectSendStream[BatchItem],
    ) -> None:
        async with jobs, done:
            async for index, record_id, state in jobs:
                try:
                    item = BatchItem(index, record_id, judgment=await judge(state))
                except TypevetError as error:
                    shed_frame_locals(error)
                    item = BatchItem(index, record_id, error=error)
                counts["done"] += 1
                counts["failed"] += item.error is not None
                if on_progress is not None:
                    elapsed = time.monotonic() - started
                    on_progress(Progress(counts["done"], counts["failed"], total, elapsed))
                await done.send(item)

    first_error: TypevetError | None = None
    closed = False
    async with anyio.create_task_group() as group:
        group.start_soon(produce)
        for _ in range(options.max_in_flight):
            group.start_soon(work, jobs_receive.clone(), done_send.clone())
        jobs_receive.close()
        done_send.close()
        waiting: dict[int, BatchItem] = {}
        next_index = 0
        async with done_receive:
            async for item in done_receive:
                if fail_fast and item.error is not None:
                    first_error = item.error
                    break
                ready = [item]
                if ordered:  # hold it back until every earlier record is out
                    waiting[item.index] = item
                    ready = []
                    while next_index in waiting:
                        ready.append(waiting.pop(next_index))
                        next_index += 1
                for result in ready:
                    slots.release()
                    try:
                        yield result
                    except GeneratorExit:  # the consumer closed us: stop everything, quietly
                        closed = True
                        break
                if closed:
                    break
        group.cancel_scope.cancel()  # the input may not be exhausted; nothing else is waited on
    if first_error is not None and not closed:
        raise first_error
