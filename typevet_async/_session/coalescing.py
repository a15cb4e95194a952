"""`judge_many`'s records sent in batch requests, where the backend's server takes them
(`BatchJudging`: System One's ``POST /v1/systemone/batch``).

The batch engine (`typevet_async._session.batch`) judges one record per worker; here each worker's
record joins the pending batch instead of being sent alone. The pending batch is sent when it
reaches the server's cap (`BatchJudging.batch_limit`), or once a pass of the event loop adds
no record to it: the records pulled together (at the start, as the engine starts one worker
after another, and when a batch's answers wake the workers together) land in one request.
Each request takes one of the session's slots, so ``max_concurrency`` still bounds the
requests in flight.

What stays as it was for a record:

- its item: its answers, or its own error typed as a request of its own would have raised it
  (the backend maps each item error); an error of the whole request is every record's;
- ``record_timeout``: each record's deadline covers the request its state rides in (a record
  that times out leaves it; the request is cancelled once none of its records waits);
- retries: the request is retried under the retry policy like any other; a record whose item
  failed transiently is sent again alone (``/v1/systemone``), under the same policy;
- a server without the batch route (not advertised, or a 404/405): every record is sent alone,
  as before.

With the route offered and ``max_in_flight`` not given, the records in flight default to whole
requests' worth: the server's cap (or a multiple of it, where the session's
``max_concurrency`` records fill more than one request), so every request can fill up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from typevet_async._backends.base import Backend, BatchJudging
from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Judgment
from typevet_async._core.reading.probe import Probe
from typevet_async._core.wires.jsonvalues import render_state
from typevet_async._session.deadlines import call_deadline
from typevet_async._session.fair_slots import FairSlots
from typevet_async._session.settings import BatchOptions, ReadOptions

__all__ = ["Coalescer", "batch_options"]

JudgeAlone = Callable[[Any, ReadOptions], Awaitable[Judgment]]


def batch_options(
    backend: Backend, options: BatchOptions, *, given: tuple[bool, bool]
) -> BatchOptions:
    """``options`` once the server is probed: with a batch route and no ``max_in_flight``
    given, whole requests' worth of records in flight (the server's cap, times as many
    requests as the default's records fill: at least one), the window 4 times that unless
    given. ``given``: whether ``max_in_flight`` and ``window`` were."""
    in_flight_given, window_given = given
    limit = backend.batch_limit if isinstance(backend, BatchJudging) else None
    if limit is None or in_flight_given:
        return options
    in_flight = limit * max(1, options.max_in_flight // limit)
    window = options.window if window_given else 4 * in_flight
    return attrs.evolve(options, max_in_flight=in_flight, window=max(window, in_flight))


@attrs.define(eq=False)
class _Waiting:
    """One record in a batch: its state, and where its result arrives."""

    state: Any
    future: asyncio.Future[Judgment | None]
    #: The records of the request it was sent in (itself among them), once sent.
    chunk: list[_Waiting] = attrs.Factory(list)
    request: asyncio.Task[None] | None = None


class Coalescer:
    """A batch's records gathered into batch requests (the module says when one is sent)."""

    def __init__(
        self,
        backend: Backend,
        slots: FairSlots,
        probe: Callable[[], Awaitable[Probe]],
        require_open: Callable[[], None],
        questions: Sequence[tuple[str, Question]],
        options: ReadOptions,
        alone: JudgeAlone,
    ) -> None:
        self._backend = backend if isinstance(backend, BatchJudging) else None
        self._slots = slots
        self._probe = probe
        self._require_open = require_open
        self._questions = questions
        self._options = options
        self._alone = alone
        # Permutations and calibration maps are refused for a server that reads the questions
        # itself: the single path says so, per record.
        self._batchable = (
            options.permutations == 1 and options.calibration is None and options.prior is None
        )
        self._pending: list[_Waiting] = []
        #: Records that ever joined a pending batch: a pass that adds none sends it.
        self._joined = 0
        self._flush_soon: asyncio.Handle | None = None
        self._requests: set[asyncio.Task[None]] = set()

    async def judge(self, state: Any) -> Judgment:
        """``state``'s judgment: in a batch request when the server takes them, else alone.

        :raises InvalidInputError: the state is not JSON (nothing was sent).
        :raises SessionStateError: the session is not open (or in another event loop).
        """
        self._require_open()
        backend = self._backend
        limit = backend.batch_limit if backend is not None else None
        if limit is None or not self._batchable:
            return await self._alone(state, self._options)
        render_state(state)  # a state that is not JSON fails here, as alone, unsent
        untimed = attrs.evolve(self._options, timeout=None)  # the deadline below covers it
        with call_deadline(self._options.timeout, "the record's judgment"):
            judgment = await self._batched(state, limit)
            if judgment is None:  # not offered after all, or a transient failure of its own
                return await self._alone(state, untimed)
            return judgment

    async def _batched(self, state: Any, limit: int) -> Judgment | None:
        loop = asyncio.get_running_loop()
        waiting = _Waiting(state, loop.create_future())
        self._pending.append(waiting)
        self._joined += 1
        if len(self._pending) >= limit:
            self._flush(limit)
        elif self._flush_soon is None:
            self._flush_soon = loop.call_soon(self._flush_when_settled, limit, self._joined)
        try:
            return await waiting.future
        except asyncio.CancelledError:
            self._leave(waiting)
            raise

    def _leave(self, waiting: _Waiting) -> None:
        """A record stopped waiting (its deadline, the batch closed): out of the pending batch,
        and its request cancelled once none of its records waits."""
        if waiting.future.done() and not waiting.future.cancelled():
            waiting.future.exception()  # handed over as it left: retrieved, never logged
        waiting.future.cancel()
        if waiting in self._pending:
            self._pending.remove(waiting)
        request = waiting.request
        if request is not None and all(other.future.done() for other in waiting.chunk):
            request.cancel()

    def _flush_when_settled(self, limit: int, joined: int) -> None:
        """Send the pending records, unless more joined since the last look (the engine starts
        its workers one a pass): then look again after one more pass."""
        if self._joined != joined and self._pending:
            loop = asyncio.get_running_loop()
            self._flush_soon = loop.call_soon(self._flush_when_settled, limit, self._joined)
            return
        self._flush(limit)

    def _flush(self, limit: int) -> None:
        """Send the pending records, at most ``limit`` a request."""
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        loop = asyncio.get_running_loop()
        while self._pending:
            chunk, self._pending = self._pending[:limit], self._pending[limit:]
            request = loop.create_task(self._send(chunk), name="typevet_async batch request")
            for waiting in chunk:
                waiting.chunk, waiting.request = chunk, request
            self._requests.add(request)
            request.add_done_callback(self._requests.discard)

    async def _send(self, chunk: list[_Waiting]) -> None:
        """One batch request under one of the session's slots; each record's result (or the
        request's error, a copy each) handed to its waiter."""
        assert self._backend is not None
        try:
            probe = await self._probe()
            async with self._slots.share():
                results = await self._backend.judge_batch(
                    [waiting.state for waiting in chunk],
                    self._questions,
                    probe,
                    max_retries=self._options.max_retries,
                )
        except Exception as error:  # cancellation is not an Exception: every waiter left
            for waiting in chunk:
                if not waiting.future.done():
                    waiting.future.set_exception(_copy(error))
            return
        outcomes = results if results is not None else [None] * len(chunk)
        for waiting, outcome in zip(chunk, outcomes, strict=True):
            if waiting.future.done():
                continue
            if isinstance(outcome, Exception):
                waiting.future.set_exception(outcome)
            else:
                waiting.future.set_result(outcome)


def _copy(error: Exception) -> Exception:
    """An equal error of its own for each record (an item keeps and trims its error; one
    object raised in several tasks would gather every task's traceback). Built without
    ``__init__``, which SDK errors give keyword-only fields."""
    clone = type(error).__new__(type(error), *error.args)
    clone.__dict__.update(vars(error))
    clone.__cause__ = error.__cause__
    return clone
