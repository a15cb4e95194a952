"""judge_many against the in-memory stub backend: order, errors, bounds, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

import typevet_async as tv
from typevet_async._settings import BatchOptions

from .stubs import InMemoryStubBackend, failing_after, sleeping

pytestmark = pytest.mark.asyncio

QUESTION = {"q": tv.Noul(instructions="Is it?")}


def delays_by_state(backend: InMemoryStubBackend, delays: dict[str, float]) -> None:
    """Each state's read sleeps its delay; the state "boom" fails with a ServerError."""
    backend.state_behaviours = {state: sleeping(delay) for state, delay in delays.items()}
    backend.state_behaviours["boom"] = failing_after(
        0.0, tv.ServerError("boom", status=500, body="")
    )


def session(backend: InMemoryStubBackend, max_concurrency: int = 4) -> tv.Session:
    return tv.Session(backend, tv.SessionSettings(max_concurrency=max_concurrency))


async def collect(stream: AsyncIterator[tv.BatchItem]) -> list[tv.BatchItem]:
    return [item async for item in stream]


async def test_ordered_yields_in_input_order_whatever_the_completion_order() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"s0": 0.06, "s1": 0.03, "s2": 0.0, "s3": 0.01})
    async with session(backend, 4) as s:
        items = await collect(s.judge_many(["s0", "s1", "s2", "s3"], QUESTION))
    assert [i.index for i in items] == [0, 1, 2, 3]
    assert [i.record_id for i in items] == [0, 1, 2, 3]
    assert all(i.ok and i.judgment is not None for i in items)


async def test_unordered_yields_as_completed() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"s0": 0.2, "s1": 0.0})
    async with session(backend, 4) as s:
        items = await collect(s.judge_many(["s0", "s1"], QUESTION, ordered=False))
    assert [i.index for i in items] == [1, 0]


async def test_a_failing_record_yields_its_error_and_the_batch_goes_on() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {})
    records = [("a", "s0"), ("b", "boom"), ("c", "s2")]
    progress: list[tv.Progress] = []
    async with session(backend, 2) as s:
        items = await collect(s.judge_many(records, QUESTION, on_progress=progress.append))
    assert [i.record_id for i in items] == ["a", "b", "c"]
    assert isinstance(items[1].error, tv.ServerError)
    assert items[1].error.question_id == "q"
    assert items[0].ok
    assert items[2].ok
    assert [(p.done, p.total) for p in progress] == [(1, 3), (2, 3), (3, 3)]
    assert progress[-1].failed == 1
    assert progress[-1].rate > 0


async def test_fail_fast_raises_the_first_error_and_cancels_the_rest() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"slow": 30.0})
    tasks_before = len(asyncio.all_tasks())
    async with session(backend, 4) as s:
        with anyio.fail_after(5), pytest.raises(tv.ServerError):
            await collect(s.judge_many(["slow", "boom", "slow"], QUESTION, fail_fast=True))
    assert len(asyncio.all_tasks()) == tasks_before


async def test_memory_stays_bounded_by_the_window() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"s0": 0.3})  # the first record holds up ordered output
    pulled: list[int] = []

    def records() -> Iterator[str]:
        for n in range(1000):
            pulled.append(n)
            yield f"s{n}"

    async with session(backend, 2) as s:
        stream = s.judge_many(records(), QUESTION, window=8)
        async with contextlib.aclosing(stream):
            first = await anext(stream)
            # While record 0 was slow, the producer could run at most a window ahead.
            assert len(pulled) <= 8 + 2
    assert first.index == 0


async def test_async_iterable_input_and_early_exit_cancel_everything() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {f"s{n}": 30.0 for n in range(1, 50)})

    async def records() -> AsyncIterator[str]:
        for n in range(50):
            yield f"s{n}"

    tasks_before = len(asyncio.all_tasks())
    async with session(backend, 4) as s:
        stream = s.judge_many(records(), QUESTION)
        with anyio.fail_after(5):
            async with contextlib.aclosing(stream):
                async for item in stream:
                    assert item.index == 0
                    break
    assert len(asyncio.all_tasks()) == tasks_before
    assert backend.cancelled  # the in-flight reads were cancelled, not awaited


async def test_cancelling_the_consumer_cancels_in_flight_reads() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"s0": 30.0, "s1": 30.0})
    async with session(backend, 2) as s:
        with anyio.move_on_after(0.2):
            await collect(s.judge_many(["s0", "s1"], QUESTION))
    assert len(backend.cancelled) == 2


async def test_judge_many_on_an_unopened_session_is_refused_at_the_call() -> None:
    backend = InMemoryStubBackend()
    with pytest.raises(tv.SessionStateError, match="unopened"):
        session(backend).judge_many(["s"], QUESTION)
    assert backend.reads == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"max_in_flight": 4, "window": 2}, "window must be >= max_in_flight"),
        ({"window": 2}, "window must be >= max_in_flight"),  # the session's cap is 4
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_retries": -1}, "max_retries"),
        ({"timeout": 0}, "timeout"),
    ],
)
async def test_bad_batch_settings_are_refused_at_the_call(
    override: dict[str, Any], message: str
) -> None:
    backend = InMemoryStubBackend()
    async with session(backend, 4) as s:
        with pytest.raises(tv.ConfigurationError, match=message):
            s.judge_many(["s"], QUESTION, **override)  # raised before iterating
    assert backend.reads == []
    assert backend.probes == 0


async def test_max_in_flight_bounds_the_records_judged_at_once() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {f"s{n}": 0.02 for n in range(12)})
    async with session(backend, 8) as s:
        items = await collect(
            s.judge_many([f"s{n}" for n in range(12)], QUESTION, max_in_flight=2, window=4)
        )
    assert [i.index for i in items] == list(range(12))
    assert backend.peak == 2


class _Response:
    """Stands for a parsed response body a failed read had in a local variable."""


async def test_a_kept_error_item_does_not_pin_what_the_failed_read_held() -> None:
    import gc
    import traceback
    import weakref

    from typevet_async._batch import judge_stream

    held: list[weakref.ref[_Response]] = []

    async def parse(response: _Response) -> tv.Judgment:
        raise tv.ProtocolError("malformed")

    async def judge(state: str) -> tv.Judgment:
        response = _Response()
        held.append(weakref.ref(response))
        try:
            return await parse(response)
        except tv.ProtocolError as error:
            raise tv.InvalidLogprobsError("bad read") from error

    items = [
        item
        async for item in judge_stream(["a", "b"], judge, BatchOptions(max_in_flight=2, window=8))
    ]
    gc.collect()
    assert [type(item.error) for item in items] == [tv.InvalidLogprobsError] * 2
    assert len(held) == 2
    assert all(ref() is None for ref in held)
    # The traceback still names where the error came from, through its cause.
    error = items[0].error
    assert error is not None
    assert error.__cause__ is not None
    printed = "".join(traceback.format_exception(error))
    assert "in parse" in printed
    assert "in judge" in printed
