"""Streaming batches: ``session.judge_many(records, questions)`` as an async iterator.

The returned `BatchStream` never yields from inside a task group or cancel scope. On the first
``anext`` it reads the session's probe (in the caller's task), then starts one asyncio task
that owns every other task of the batch: up to ``max_in_flight`` workers (started as records
arrive, so never more than the records: `_Engine`), each of which takes a window slot, pulls
the next record from the (async) iterable and judges it. Finished items
reach the caller through a queue the caller waits on; a record holds its window slot until
its item is handed out, so at most ``window`` records are pulled ahead (in flight or waiting
to be yielded), and no task is created per record. The caller's task is never part of the
batch's task group, so it may stop at any moment:

- ``aclose()`` (e.g. through ``contextlib.aclosing``) cancels the in-flight reads and returns
  once they have ended;
- leaving ``async for`` early without closing (``break``, an exception) is safe too: the
  caller's task is untouched and nothing is logged; the in-flight reads are cancelled as soon
  as the stream is garbage-collected (at once in CPython when the last reference goes, e.g.
  an ``async for`` over ``judge_many(...)`` itself); until then they run on;
- a cancelled ``anext`` (the consuming task cancelled, or a timeout around it) cancels the
  in-flight reads before the cancellation propagates; the stream is finished.

With ``ordered=True`` items come out in input order (the window is the reorder buffer); with
``ordered=False`` as they complete.

Under batch calibration (``questions`` given) the items pass, in that order, through a
`StreamCalibration`, which holds them until it can divide them (a finite input whole, a
stream its warm-up): a record's window slot is given back as its item enters it, so the
window keeps bounding the records judged ahead, and the warm-up the items held.

Any exception while judging a record becomes that record's item and the batch goes on: an SDK
error (`TypevetError`) as itself, any other exception (a bug) as a `BatchRecordError` whose
``__cause__`` it is. Cancellation is never an item. With ``fail_fast=True`` the first error
item (in completion order) cancels the rest and is raised instead.

A failure that would be the same for every record fails the batch once, and nothing more is
judged: the probe the batch starts with, if it fails (a wrong model pin, an unreachable
server), is raised from the first ``anext``; a record failing with one of `PERMANENT_ERRORS`
(an unsupported chat template, a bad setting or question, a closed session) cancels the rest
and that error is raised (as with ``fail_fast``, items not yet handed out are dropped).
Per-record input errors (a state that is not JSON) stay items.

The input's own exception (raised by its ``__iter__``/``__next__`` or ``__aiter__``/
``__anext__``) stops the pulling; every record already pulled is still judged and yielded,
then the exception is raised as itself from ``async for``. An exception from ``on_progress``
(called in the batch's task) cancels the rest and is raised as itself too.

A kept error item holds no frame locals and only bounded excerpts of what the failed read
received (`typevet_async._core.reading.kept_errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
    Sized,
)
from typing import Any, Final, Literal

import anyio
import anyio.abc
import attrs

from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Judgment
from typevet_async._core.reading.batch_records import (
    BatchItem,
    Progress,
    check_records,
    split_record,
)
from typevet_async._core.reading.kept_errors import kept_error
from typevet_async._core.statistics.batch_judgments import StreamCalibration
from typevet_async._errors import (
    ConfigurationError,
    QuestionError,
    SessionStateError,
    TypevetError,
    UnsupportedTemplateError,
)
from typevet_async._session.settings import BatchOptions

__all__ = [
    "PERMANENT_ERRORS",
    "BatchStream",
    "judge_stream",
]

Record = Any
Judge = Callable[[Any], Awaitable[Judgment]]
Prepare = Callable[[], Awaitable[object]]

#: Errors that are the same for every record of a batch (planning against the served template,
#: the session's settings, the questions, the session's state): the first one seen cancels the
#: rest and is raised once, instead of being yielded for every record.
PERMANENT_ERRORS: Final = (
    UnsupportedTemplateError,
    ConfigurationError,
    QuestionError,
    SessionStateError,
)

#: The end of the input.
_END: Final = object()


@attrs.frozen
class _Failure:
    """In the item stream: an exception that ends the batch (from ``on_progress``)."""

    error: Exception


_Outcome = BatchItem | _Failure


class _Engine:
    """The batch's tasks and what they share. It never refers to its `BatchStream`, so dropping
    the stream frees it, and the stream's ``__del__`` can cancel the tasks.

    Workers each pull the next record (only once they hold a window slot and are free to
    judge it, so a permanent error stops the batch after at most ``max_in_flight`` records),
    judge it and append the outcome to `outcomes`, waking the consumer if it waits. No
    producer task, no channel: per record that is one task switch (the consumer's wake-up)
    instead of four, and no checkpoint (profiled on the hot path).

    Workers are started as records arrive: one at first, and one more each time a worker
    pulls a record, up to ``max_in_flight`` and never past a sized input's length. So a batch
    starts no more workers than it has records (an input of unknown length: one more, which
    meets its end and returns), however large ``max_in_flight`` is (issue 43: a server's
    advertised batch size made it 300,000 for 3 records).
    """

    def __init__(
        self,
        records: Iterable[Record] | AsyncIterable[Record],
        judge: Judge,
        options: BatchOptions,
        on_progress: Callable[[Progress], None] | None,
        total: int | None,
        fail_fast: bool,
    ) -> None:
        self.pull = _puller(records)
        #: Workers the batch may have: ``max_in_flight``, at most the input's length.
        self.worker_cap = (
            options.max_in_flight if total is None else min(options.max_in_flight, max(1, total))
        )
        #: Workers started so far (each is started by the one before it, see the class).
        self.workers = 0
        self.group: anyio.abc.TaskGroup | None = None
        self.fail_fast = fail_fast
        self.judge = judge
        self.options = options
        self.on_progress = on_progress
        self.total = total
        self.scope = anyio.CancelScope()
        self.slots = asyncio.Semaphore(options.window)
        # An async iterator may not be awaited by two tasks at once.
        is_async = isinstance(records, AsyncIterable)
        self.pull_lock = anyio.Lock(fast_acquire=True) if is_async else None
        #: Finished items (and a `_Failure`), never more than ``window``: each holds a slot.
        self.outcomes: deque[_Outcome] = deque()
        #: The consumer's wait for the next outcome, while it waits.
        self.waiter: asyncio.Future[None] | None = None
        #: Every worker has returned: nothing more will be appended.
        self.ended = False
        #: Stop pulling: the input ended or raised, or the consumer went away.
        self.exhausted = False
        #: The input's own exception; raised once every pulled record is out.
        self.input_error: Exception | None = None
        #: An exception that escaped the task group (a bug in this module).
        self.failure: Exception | None = None
        self.next_index = 0
        self.started = time.monotonic()
        self.finished = 0
        self.failed = 0

    def abandon(self) -> None:
        """Cancel every task (the stream was dropped while the batch ran)."""
        self.exhausted = True
        self.scope.cancel()

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until an outcome is appended or the batch has ended (the consumer's only wait)."""
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    async def run(self) -> None:
        try:
            with self.scope:
                async with anyio.create_task_group() as group:
                    self.group = group
                    self._start_worker()
        except Exception as error:  # cancellation is not an Exception: the scope took it
            self.failure = error
        finally:
            self.ended = True
            self.pull = _exhausted
            self.group = None
            self._wake()

    def _start_worker(self) -> None:
        assert self.group is not None
        self.workers += 1
        self.group.start_soon(self._work)

    async def _next_record(self) -> tuple[int, Any, Any] | None:
        """The next record and its index, or None once the input has ended or raised."""
        if self.exhausted:
            return None
        try:
            record = await self.pull()
        except Exception as error:  # the input's own: the records pulled go on
            self.exhausted = True
            self.input_error = self.input_error or error
            return None
        if record is _END:
            self.exhausted = True
            return None
        index = self.next_index
        self.next_index += 1
        record_id, state = split_record(record, index)
        return index, record_id, state

    async def _work(self) -> None:
        while not self.exhausted:
            await self.slots.acquire()
            if self.pull_lock is None:
                pulled = await self._next_record()
            else:
                async with self.pull_lock:
                    pulled = await self._next_record()
            if pulled is None:
                self.slots.release()
                return
            index, record_id, state = pulled
            if self.workers < self.worker_cap and not self.exhausted:
                self._start_worker()  # to pull the next record while this one is judged
            try:
                item = BatchItem(index, record_id, judgment=await self.judge(state))
            except Exception as error:  # cancellation is not an Exception: never an item
                item = BatchItem(index, record_id, error=kept_error(error))
            self.finished += 1
            self.failed += item.error is not None
            outcome: _Outcome = item
            if self.on_progress is not None:
                elapsed = time.monotonic() - self.started
                try:
                    self.on_progress(Progress(self.finished, self.failed, self.total, elapsed))
                except Exception as error:
                    outcome = _Failure(error)
            self.outcomes.append(outcome)
            self._wake()
            if isinstance(outcome, _Failure) or self.ends_batch(item.error):
                self.exhausted = True  # pull no more; the consumer raises it and cancels
                return

    def ends_batch(self, error: TypevetError | None) -> bool:
        """The error ends the batch: it is permanent, or any error is under ``fail_fast``."""
        return error is not None and (self.fail_fast or isinstance(error, PERMANENT_ERRORS))


def _puller(records: Iterable[Record] | AsyncIterable[Record]) -> Callable[[], Awaitable[Any]]:
    """The next record of ``records`` on each call, `_END` at the end; the input's own
    exceptions (from ``iter``/``aiter`` too) come out of the call."""
    if isinstance(records, AsyncIterable):
        async_iterator: AsyncIterator[Record] | None = None

        async def pull_async() -> Any:
            nonlocal async_iterator
            if async_iterator is None:
                async_iterator = aiter(records)
            return await anext(async_iterator, _END)

        return pull_async
    iterator: Iterator[Record] | None = None

    async def pull() -> Any:
        nonlocal iterator
        if iterator is None:
            iterator = iter(records)
        return next(iterator, _END)

    return pull


async def _exhausted() -> Any:
    return _END


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark the task's exception retrieved (`_Engine.run` keeps its own exceptions)."""
    if not task.cancelled():
        task.exception()


class BatchStream(AsyncIterator[BatchItem]):
    """The async iterator of `BatchItem`s that `Session.judge_many` returns (module docstring:
    when it cancels its reads). ``aclose()`` cancels the batch's in-flight reads and returns
    once they have ended; closing a finished stream does nothing. One task at a time may await
    ``anext``."""

    def __init__(
        self,
        records: Iterable[Record] | AsyncIterable[Record],
        judge: Judge,
        options: BatchOptions,
        *,
        ordered: bool,
        fail_fast: bool,
        on_progress: Callable[[Progress], None] | None,
        prepare: Prepare | None,
        total: int | None,
        calibration: StreamCalibration | None = None,
    ) -> None:
        self._records: Iterable[Record] | AsyncIterable[Record] | None = records
        self._calibration = calibration
        self._judge = judge
        self._options = options
        self._ordered = ordered
        self._fail_fast = fail_fast
        self._on_progress = on_progress
        self._prepare = prepare
        self._total = total
        self._state: Literal["new", "running", "finished"] = "new"
        self._busy = False
        self._engine: _Engine | None = None
        self._runner: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, BatchItem] = {}
        self._ready: deque[BatchItem] = deque()
        self._next_index = 0

    def __repr__(self) -> str:
        return f"<BatchStream {self._state}, window={self._options.window}>"

    def __aiter__(self) -> BatchStream:
        return self

    async def __anext__(self) -> BatchItem:
        if self._busy:
            raise RuntimeError("another task is already awaiting this batch's next item")
        self._busy = True
        try:
            return await self._next()
        finally:
            self._busy = False

    async def aclose(self) -> None:
        """Cancel the in-flight reads and wait until they have ended; then the stream is done."""
        await self._finish()

    def __del__(self) -> None:
        engine, loop = getattr(self, "_engine", None), getattr(self, "_loop", None)
        if engine is None or loop is None or getattr(self, "_state", None) == "finished":
            return
        # Any thread, any moment: let the loop cancel the tasks (unless it is closed).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(engine.abandon)

    async def _start(self) -> _Engine:
        records = self._records
        assert records is not None
        self._records = None
        try:
            if self._prepare is not None:
                prepared = await self._prepare()
                if isinstance(prepared, BatchOptions):  # options that needed the probe
                    self._options = prepared
        except BaseException:
            self._state = "finished"
            raise
        if self._state == "finished":  # closed by another task meanwhile
            raise StopAsyncIteration
        engine = _Engine(
            records, self._judge, self._options, self._on_progress, self._total, self._fail_fast
        )
        self._loop = asyncio.get_running_loop()
        runner = self._loop.create_task(engine.run(), name="typevet_async judge_many")
        runner.add_done_callback(_retrieve)
        self._engine, self._runner, self._state = engine, runner, "running"
        return engine

    async def _next(self) -> BatchItem:
        if self._state == "finished":
            raise StopAsyncIteration
        engine = self._engine if self._state == "running" else await self._start()
        assert engine is not None
        while not self._ready:
            outcomes = engine.outcomes
            if not outcomes and not engine.ended:
                try:
                    await engine.wait()
                except BaseException:  # cancelled while waiting: the batch ends with it
                    await self._finish()
                    raise
                continue
            if not outcomes:  # every record pulled is out
                if self._calibration is not None:
                    self._ready.extend(self._calibration.finish())  # once: then it holds none
                    if self._ready:
                        break
                await self._finish()
                error = engine.failure or engine.input_error
                if error is not None:
                    raise error
                raise StopAsyncIteration
            outcome = outcomes.popleft()
            if isinstance(outcome, _Failure):
                await self._finish()
                raise outcome.error
            if engine.ends_batch(outcome.error):
                await self._finish()
                assert outcome.error is not None
                raise outcome.error
            if self._ordered:  # hold it back until every earlier record is out
                self._waiting[outcome.index] = outcome
                while self._next_index in self._waiting:
                    self._out(engine, self._waiting.pop(self._next_index))
                    self._next_index += 1
            else:
                self._out(engine, outcome)
        if self._calibration is None:  # else given back as it entered the calibration
            engine.slots.release()
        return self._ready.popleft()

    def _out(self, engine: _Engine, item: BatchItem) -> None:
        """``item`` ready to yield, or into the batch calibration (its slot given back)."""
        if self._calibration is None:
            self._ready.append(item)
            return
        engine.slots.release()
        self._ready.extend(self._calibration.take(item))

    async def _finish(self) -> None:
        """Cancel the batch's tasks, wait until they have ended, drop what was not yielded."""
        self._state = "finished"
        self._records = None
        self._waiting.clear()
        self._ready.clear()
        if self._calibration is not None:
            self._calibration.held.clear()
        engine, runner = self._engine, self._runner
        if engine is None or runner is None:
            return
        engine.abandon()
        if not runner.done():
            with anyio.CancelScope(shield=True):
                await asyncio.wait((runner,))
        engine.outcomes.clear()  # a kept error's traceback may pin the engine: not the items


def judge_stream(
    records: Iterable[Record] | AsyncIterable[Record],
    judge: Judge,
    options: BatchOptions,
    *,
    ordered: bool = True,
    fail_fast: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
    prepare: Prepare | None = None,
    questions: Sequence[tuple[str, Question]] | None = None,
) -> BatchStream:
    """The batch engine behind `Session.judge_many`: ``judge`` judges one state; ``prepare``
    (the session's probe) is awaited once, on the first ``anext``, before any record is pulled,
    and its exception is raised from there (a `BatchOptions` it returns replaces
    ``options``). ``questions``: the items are batch calibrated over them (an input with a
    length whole, any other after ``options.batch_calibration_window`` records).

    :raises InvalidInputError: ``records`` is a string, bytes, a mapping or not iterable (at
        the call).
    """
    check_records(records)
    total = len(records) if isinstance(records, Sized) else None
    return BatchStream(
        records,
        judge,
        options,
        ordered=ordered,
        fail_fast=fail_fast,
        on_progress=on_progress,
        prepare=prepare,
        total=total,
        calibration=None
        if questions is None
        else StreamCalibration(
            questions, None if total is not None else options.batch_calibration_window
        ),
    )
