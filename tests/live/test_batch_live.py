"""judge_many against the real llama.cpp server (the command line: test_cli_live.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
import pytest

import typevet_async as tv

from .helpers import TICKET

pytestmark = [pytest.mark.live]

QUESTIONS = {"refund": tv.Noul(instructions="Is a refund requested?")}
TOO_LONG = "word " * 2500  # over the server's per-slot context: an HTTP 400 for that record


@pytest.mark.asyncio
async def test_order_errors_and_progress(gemma3_url: str) -> None:
    records = [(f"t{n}", f"Ticket {n}: {TICKET}") for n in range(12)]
    records[5] = ("t5", TOO_LONG)
    progress: list[tv.Progress] = []
    async with tv.Session.llama_cpp(gemma3_url, max_concurrency=4) as session:
        items = [
            item
            async for item in session.judge_many(
                records, QUESTIONS, on_progress=progress.append, max_retries=0
            )
        ]
    assert [item.record_id for item in items] == [f"t{n}" for n in range(12)]
    assert [item.index for item in items] == list(range(12))
    assert isinstance(items[5].error, tv.ServerError)
    assert items[5].error.status == 400
    for n, item in enumerate(items):
        if n != 5:
            assert item.judgment is not None
            assert f"Ticket {n}:" in item.judgment.diagnostics["refund"].prompt
    assert [p.done for p in progress] == list(range(1, 13))
    assert progress[-1].failed == 1
    assert progress[-1].total == 12


@pytest.mark.asyncio
async def test_fail_fast_and_cancellation(gemma3_url: str) -> None:
    records = [f"Ticket {n}: {TICKET}" for n in range(20)]
    records[3] = TOO_LONG
    tasks_before = len(asyncio.all_tasks())
    async with tv.Session.llama_cpp(gemma3_url, max_concurrency=4) as session:
        seen: list[tv.BatchItem] = []

        async def consume() -> None:
            stream = session.judge_many(records, QUESTIONS, fail_fast=True, max_retries=0)
            async with contextlib.aclosing(stream):
                async for item in stream:
                    seen.append(item)

        with pytest.raises(tv.ServerError) as caught:
            await consume()
        assert caught.value.status == 400
        assert len(seen) <= 3  # records 0-2 at most; record 3 failed and stopped the batch
        # Cancel a consumer mid-batch: the batch stops, nothing leaks, the session still works.
        # 200 records take this server tens of seconds (about 5 questions/s, README "Load"),
        # so 1 s in the batch is mid-way whatever the machine's load.
        cut: list[tv.BatchItem] = []
        with anyio.move_on_after(1.0) as scope:
            stream = session.judge_many([f"T{n}" for n in range(200)], QUESTIONS)
            async with contextlib.aclosing(stream):
                async for item in stream:
                    cut.append(item)
        assert scope.cancelled_caught
        assert len(cut) < 200
        assert len(asyncio.all_tasks()) == tasks_before
        again = await session.judge(TICKET, QUESTIONS)
    assert list(again) == ["refund"]


@pytest.mark.asyncio
async def test_a_pipeline_session_without_time_slices_answers_as_the_default_one(
    gemma3_url: str,
) -> None:
    # Reproducible reads (no prompt cache, one at a time) give the same logprobs each time:
    # the two sessions must give the very same answers, in order.
    records = [(f"t{n}", f"Ticket {n}: {TICKET}") for n in range(8)]
    answers: dict[str, list[tuple[object, object]]] = {}
    sessions: dict[str, dict[str, Any]] = {
        "default": {},
        "pipeline": {"http": tv.HttpSettings(time_slice=None)},
    }
    for name, extra in sessions.items():
        async with tv.Session.llama_cpp(gemma3_url, reproducible=True, **extra) as session:
            answers[name] = [
                (item.record_id, item.judgment and item.judgment["refund"])
                async for item in session.judge_many(records, QUESTIONS)
            ]
    assert [record_id for record_id, _ in answers["pipeline"]] == [r for r, _ in records]
    assert all(isinstance(answer, tv.NoulAnswer) for _, answer in answers["pipeline"])
    assert answers["pipeline"] == answers["default"]  # attrs records: every probability equal
