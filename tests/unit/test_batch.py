"""judge_many against the in-memory stub backend: order, errors, bounds, cancellation, early
exit without aclosing, the input's own errors, permanent failures, bounded error items."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import types
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import pytest

import typevet_async as tv
from typevet_async._core.reading.kept_errors import EXCERPT_LIMIT
from typevet_async._session.batch import judge_stream
from typevet_async._session.settings import BatchOptions

from ..live.faults import counting_tasks
from .stubs import InMemoryStubBackend, ProbeRefusingStubBackend, failing_after, sleeping

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


def loud(caplog: pytest.LogCaptureFixture) -> list[str]:
    """WARNING and ERROR records, less asyncio debug mode's slow-callback notes (machine load,
    not behaviour)."""
    return [
        f"{record.name}: {record.getMessage()}"
        for record in caplog.records
        if record.levelno >= logging.WARNING
        and not (record.name == "asyncio" and record.getMessage().startswith("Executing "))
    ]


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    """Wait (polling every 5 ms) until ``condition()`` holds; fail after ``seconds``."""
    for _ in range(int(seconds / 0.005)):
        if condition():
            return
        await anyio.sleep(0.005)
    raise AssertionError(f"still not true after {seconds} s")


async def drain(stream: AsyncIterator[tv.BatchItem], seen: list[tv.BatchItem]) -> None:
    """Append every item to ``seen`` until the stream ends or raises."""
    async for item in stream:
        seen.append(item)


def slow_after_first(backend: InMemoryStubBackend, count: int) -> list[str]:
    """``count`` records: "s0" answers at once, every other hangs until cancelled."""
    delays_by_state(backend, {f"s{n}": 30.0 for n in range(1, count)})
    return [f"s{n}" for n in range(count)]


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


@pytest.mark.parametrize("ordered", [True, False])
async def test_memory_stays_bounded_by_the_window(ordered: bool) -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"s0": 0.3})  # the first record holds up ordered output
    pulled: list[int] = []

    def records() -> Iterator[str]:
        for n in range(1000):
            pulled.append(n)
            yield f"s{n}"

    async with session(backend, 2) as s:
        stream = s.judge_many(records(), QUESTION, window=8, ordered=ordered)
        async with contextlib.aclosing(stream):
            first = await anext(stream)
            await anyio.sleep(0.05)  # give the producer every chance to run ahead
            # While record 0 was slow (or the consumer idle), at most a window was pulled.
            assert len(pulled) <= 8 + 2
    assert first.index == (0 if ordered else 1)


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
                    for _ in range(100):  # until the other workers' slow reads have started
                        if backend.in_flight >= 3:
                            break
                        await anyio.sleep(0.01)
                    break
    assert len(asyncio.all_tasks()) == tasks_before
    assert backend.cancelled  # the in-flight reads were cancelled, not awaited


async def test_cancelling_the_consumer_cancels_in_flight_reads() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"s0": 30.0, "s1": 30.0})
    async with session(backend, 2) as s:
        stream = s.judge_many(["s0", "s1"], QUESTION)
        with anyio.move_on_after(0.2) as scope:
            await collect(stream)
        assert scope.cancelled_caught
        # Cancelled, not yielded: by the time the cancellation is out, so are the reads.
        assert len(backend.cancelled) == 2
        assert backend.in_flight == 0
        assert await collect(stream) == []  # the stream is finished


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
        ({"record_timeout": 0}, "record_timeout must be a positive, finite number"),
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


@pytest.mark.parametrize("sized", [True, False])
async def test_workers_are_started_as_records_arrive_never_past_the_records(sized: bool) -> None:
    # Issue 43.4: a max_in_flight of 100,000 (as a server's advertised batch size made it)
    # started 100,000 workers for 3 records.
    backend = InMemoryStubBackend()
    delays_by_state(backend, {f"s{n}": 0.02 for n in range(3)})
    states = [f"s{n}" for n in range(3)]
    records = states if sized else (state for state in states)
    async with session(backend, 8) as s:
        with counting_tasks() as created:
            items = await collect(s.judge_many(records, QUESTION, max_in_flight=100_000))
    assert [i.index for i in items] == [0, 1, 2]
    assert backend.peak == 3  # all three still judged at once
    # a sized input: one per record; otherwise one more, which meets the input's end
    assert created["typevet_async._session.batch._Engine._work"] == (3 if sized else 4)


class _Response:
    """Stands for a parsed response body a failed read had in a local variable."""


async def test_a_kept_error_item_does_not_pin_what_the_failed_read_held() -> None:
    import gc
    import traceback
    import weakref

    from typevet_async._session.batch import judge_stream

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


# -- item 4, point 1: no yield inside a task group; early exit without aclosing -----------------


async def test_breaking_out_without_aclosing_leaves_the_consumer_task_untouched(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    backend = InMemoryStubBackend()
    records = slow_after_first(backend, 40)
    consumer = asyncio.current_task()
    assert consumer is not None
    tasks_before = len(asyncio.all_tasks())
    async with session(backend, 4) as s:
        with anyio.fail_after(5):
            # The caller's own structured code around the loop, as in a real application.
            async with anyio.create_task_group():
                with anyio.CancelScope():
                    async for item in s.judge_many(records, QUESTION):
                        assert item.index == 0
                        break  # no aclosing: the stream's last reference goes here
                    await until(lambda: backend.in_flight == 0)
            await anyio.sleep(0.01)  # the consumer goes on awaiting, uncancelled
            assert consumer.cancelling() == 0
            again = await s.judge("s0", QUESTION)
    assert list(again) == ["q"]
    # Every read but record 0's and the last judgment's was cancelled, none awaited.
    assert backend.cancelled
    assert len(backend.cancelled) == len(backend.reads) - 2
    assert len(asyncio.all_tasks()) == tasks_before
    assert loud(caplog) == []


async def test_an_unclosed_stream_cancels_its_reads_once_it_is_garbage_collected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    backend = InMemoryStubBackend()
    records = slow_after_first(backend, 40)
    async with session(backend, 4) as s:
        stream = s.judge_many(records, QUESTION)
        first = await anext(stream)
        await until(lambda: backend.in_flight == 4)
        await anyio.sleep(0.05)
        assert backend.cancelled == []  # still referenced: its reads run on
        del stream
        await until(lambda: backend.in_flight == 0)
        assert len(backend.cancelled) == 4
        await anyio.sleep(0.01)
    assert first.index == 0
    assert loud(caplog) == []


async def test_aclose_cancels_the_in_flight_reads_before_it_returns() -> None:
    backend = InMemoryStubBackend()
    records = slow_after_first(backend, 40)
    tasks_before = len(asyncio.all_tasks())
    async with session(backend, 4) as s:
        stream = s.judge_many(records, QUESTION, ordered=False)
        assert (await anext(stream)).index == 0
        await until(lambda: backend.in_flight == 4)
        await stream.aclose()
        assert backend.in_flight == 0  # at once: no checkpoint needed
        assert len(backend.cancelled) == 4
        assert len(asyncio.all_tasks()) == tasks_before
        await stream.aclose()  # twice is fine
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
    assert len(backend.reads) == 5  # nothing was started after the close


async def test_a_stream_closed_or_dropped_before_its_first_item_sends_nothing() -> None:
    backend = InMemoryStubBackend()
    async with session(backend, 4) as s:
        stream = s.judge_many(["s0", "s1"], QUESTION)
        await stream.aclose()
        assert await collect(stream) == []
        s.judge_many(["s0", "s1"], QUESTION)  # never iterated, dropped
        await anyio.sleep(0.01)
    assert backend.reads == []
    assert backend.probes == 0


# -- point 2: any exception while judging a record is that record's item -------------------------


async def test_an_untyped_error_is_wrapped_in_its_records_item_and_the_batch_goes_on() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"s0": 0.05})
    backend.state_behaviours["bug"] = failing_after(0.0, KeyError("entries"))
    progress: list[tv.Progress] = []
    async with session(backend, 2) as s:
        items = await collect(
            s.judge_many(["s0", "bug", "s2", "boom", "s4"], QUESTION, on_progress=progress.append)
        )
    assert [i.index for i in items] == [0, 1, 2, 3, 4]
    assert [i.ok for i in items] == [True, False, True, False, True]
    wrapped = items[1].error
    assert isinstance(wrapped, tv.BatchRecordError)
    assert isinstance(wrapped.__cause__, KeyError)
    assert "KeyError" in str(wrapped)
    assert isinstance(items[3].error, tv.ServerError)  # an SDK error stays itself
    assert progress[-1].done == 5
    assert progress[-1].failed == 2


async def test_fail_fast_raises_a_wrapped_untyped_error_and_cancels_the_rest() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"slow": 30.0})
    backend.state_behaviours["bug"] = failing_after(0.01, TypeError("not a list"))
    async with session(backend, 4) as s:
        with anyio.fail_after(5), pytest.raises(tv.BatchRecordError) as caught:
            await collect(s.judge_many(["slow", "bug", "slow"], QUESTION, fail_fast=True))
        assert backend.in_flight == 0
    assert isinstance(caught.value.__cause__, TypeError)
    assert len(backend.cancelled) == 2


async def test_an_on_progress_error_ends_the_batch_as_itself() -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {f"s{n}": 30.0 for n in range(1, 10)})

    def progress(p: tv.Progress) -> None:
        raise ZeroDivisionError("progress bar")

    async with session(backend, 4) as s:
        with anyio.fail_after(5), pytest.raises(ZeroDivisionError, match="progress bar"):
            await collect(
                s.judge_many([f"s{n}" for n in range(10)], QUESTION, on_progress=progress)
            )
        assert backend.in_flight == 0


# -- point 3: the input's own exception comes out as itself, after every pulled record ----------


class InputBrokeError(Exception):
    pass


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_the_inputs_exception_comes_out_as_itself_after_every_record_pulled(
    ordered: bool, kind: str
) -> None:
    backend = InMemoryStubBackend()
    delays_by_state(backend, {"s0": 0.1, "s1": 0.05})  # the first records finish last

    def sync_records() -> Iterator[str]:
        yield from ["s0", "s1", "s2", "boom", "s4"]
        raise InputBrokeError("line 6 is not JSON")

    async def async_records() -> AsyncIterator[str]:
        for record in sync_records():
            yield record

    records = sync_records() if kind == "sync" else async_records()
    seen: list[tv.BatchItem] = []
    async with session(backend, 2) as s:
        with pytest.raises(InputBrokeError, match="line 6") as caught:
            await drain(s.judge_many(records, QUESTION, ordered=ordered), seen)
        assert caught.type is InputBrokeError  # itself, not in an ExceptionGroup
        assert backend.in_flight == 0
    indices = [item.index for item in seen]
    assert sorted(indices) == [0, 1, 2, 3, 4]  # no record pulled was dropped
    if ordered:
        assert indices == [0, 1, 2, 3, 4]
    assert isinstance(seen[indices.index(3)].error, tv.ServerError)


async def test_an_input_that_fails_to_start_raises_from_the_first_anext() -> None:
    class Broken:
        def __iter__(self) -> Iterator[str]:
            raise InputBrokeError("cannot open the file")

    backend = InMemoryStubBackend()
    async with session(backend, 2) as s:
        stream = s.judge_many(Broken(), QUESTION)
        with pytest.raises(InputBrokeError, match="cannot open"):
            await anext(stream)
        assert await collect(stream) == []
    assert backend.reads == []


# -- point 4: a string, bytes or mapping is not an iterable of records --------------------------


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ("one ticket", "not a str"),
        (b"one ticket", "not a bytes"),
        (bytearray(b"one ticket"), "not a bytearray"),
        ({"a": "one ticket"}, "not a mapping"),
        (types.MappingProxyType({"a": "one ticket"}), "not a mapping"),
        (42, "iterable or async iterable, got int"),
    ],
)
async def test_a_string_bytes_or_mapping_as_records_is_refused_at_the_call(
    records: Any, message: str
) -> None:
    backend = InMemoryStubBackend()
    async with session(backend, 4) as s:
        with pytest.raises(tv.InvalidInputError, match=message):
            s.judge_many(records, QUESTION)  # raised before iterating
    assert backend.reads == []
    assert backend.probes == 0


# -- point 5: a permanent failure fails the batch once ------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        tv.ConfigurationError("the server serves 'other', not the pinned 'stub-model'"),
        tv.TransportError("connection refused"),
    ],
)
async def test_a_refused_probe_fails_the_batch_once_before_any_record(error: Exception) -> None:
    backend = ProbeRefusingStubBackend(error)
    pulled: list[int] = []

    def records() -> Iterator[str]:
        for n in range(50):
            pulled.append(n)
            yield f"s{n}"

    async with session(backend, 4) as s:
        stream = s.judge_many(records(), QUESTION)
        with pytest.raises(type(error)) as caught:
            await collect(stream)
        assert caught.value is error
        assert await collect(stream) == []
    assert backend.probes == 1  # not probed again per record
    assert backend.reads == []
    assert pulled == []


async def test_an_unsupported_template_fails_the_batch_once() -> None:
    backend = InMemoryStubBackend(tv.TemplateFamily.DEGRADED)
    progress: list[tv.Progress] = []
    async with session(backend, 4) as s:
        with anyio.fail_after(5), pytest.raises(tv.UnsupportedTemplateError):
            await collect(
                s.judge_many([f"s{n}" for n in range(50)], QUESTION, on_progress=progress.append)
            )
    assert backend.probes == 1
    assert backend.reads == []
    assert len(progress) <= 4  # the records already being planned, at most; not 50


async def test_a_permanent_error_from_a_record_ends_the_batch_after_the_items_before_it() -> None:
    async def judge(state: str) -> tv.Judgment:
        if state == "bad":
            raise tv.ConfigurationError("layout is not valid for this server")
        if state == "hang":
            await anyio.sleep(30)
        raise tv.ServerError("busy", status=503, body="")

    seen: list[tv.BatchItem] = []
    stream = judge_stream(
        ["a", "b", "bad", "hang", "d"], judge, BatchOptions(max_in_flight=1, window=4)
    )
    with anyio.fail_after(5), pytest.raises(tv.ConfigurationError, match="layout"):
        await drain(stream, seen)
    assert [item.index for item in seen] == [0, 1]


async def test_a_state_that_is_not_json_stays_that_records_item() -> None:
    backend = InMemoryStubBackend()
    async with session(backend, 2) as s:
        items = await collect(s.judge_many(["s0", {1, 2}, "s2"], QUESTION))
    assert [i.ok for i in items] == [True, False, True]
    assert isinstance(items[1].error, tv.InvalidInputError)


# -- point 6: error items keep a bounded excerpt of what the server sent ------------------------


def top_logprobs_reply(entries: int) -> dict[str, Any]:
    """A parsed reply the size of a top-``entries`` llama.cpp read."""
    top = [{"id": n, "token": f"t{n}", "bytes": [116], "logprob": -1.5} for n in range(entries)]
    return {"completion_probabilities": [{"top_logprobs": top}]}


async def test_a_kept_protocol_error_holds_a_bounded_excerpt_of_its_payload() -> None:
    backend = InMemoryStubBackend()
    small = {"content": "x"}
    backend.state_behaviours = {
        "big": failing_after(0.0, tv.ProtocolError("bad", payload=top_logprobs_reply(4096))),
        "small": failing_after(0.0, tv.ProtocolError("bad", payload=small)),
    }
    async with session(backend, 2) as s:
        big_item, small_item = await collect(s.judge_many(["big", "small"], QUESTION))
    assert isinstance(big_item.error, tv.ProtocolError)
    payload = big_item.error.payload
    assert isinstance(payload, str)
    assert len(payload) <= EXCERPT_LIMIT + 20
    assert payload.startswith('{"completion_probabilities":[{"top_logprobs":[{"id":0,"token":"t0"')
    assert payload.endswith("... [truncated]")
    assert isinstance(small_item.error, tv.ProtocolError)
    assert small_item.error.payload is small  # small enough: kept as it was


async def test_every_reply_excerpt_a_kept_error_holds_is_bounded_in_its_causes_too() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)

    async def judge(state: str) -> tv.Judgment:
        if state == "generation":
            raise tv.OutputValidationError(
                "no", raw="r" * 100_000, value=["v" * 10] * 10_000, path="$"
            )
        if state == "server":
            raise tv.ServerError("HTTP 500", status=500, body="<html>" + "b" * 100_000)
        if state == "cyclic":
            raise tv.ProtocolError("odd", payload=cyclic)
        try:
            raise tv.ProtocolError("inner", payload=top_logprobs_reply(4096))
        except tv.ProtocolError as error:
            raise tv.InvalidLogprobsError("outer") from error

    items = await collect(
        judge_stream(
            ["generation", "server", "cyclic", "caused"],
            judge,
            BatchOptions(max_in_flight=2, window=8),
        )
    )
    generation, server, cycle, caused = (item.error for item in items)
    assert isinstance(generation, tv.OutputValidationError)
    for kept in (generation.raw, generation.payload, generation.value):
        assert isinstance(kept, str)
        assert len(kept) <= EXCERPT_LIMIT + 20
    assert isinstance(server, tv.ServerError)
    assert len(server.body) <= EXCERPT_LIMIT + 20
    assert server.body.startswith("<html>bbb")
    assert isinstance(cycle, tv.ProtocolError)
    assert isinstance(cycle.payload, str)
    assert cycle.payload.startswith("[[[[")
    assert isinstance(caused, tv.InvalidLogprobsError)
    assert isinstance(caused.__cause__, tv.ProtocolError)
    assert isinstance(caused.__cause__.payload, str)
    assert len(caused.__cause__.payload) <= EXCERPT_LIMIT + 20
