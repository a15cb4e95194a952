"""Faults between the SDK and the real llama.cpp server: every question ends with an exact
answer (equal to a clean read of the same prompt) or a typed error; no task, connection or
file descriptor outlives the session; deadlines fire within 2x their time; cancelling the
caller cancels the HTTP request."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

import typevet_async as tv

from .faults import BODY_FAULTS, STATUS_FAULTS, FaultInjectingProxy, open_fds
from .helpers import TICKET

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

QUESTION = {"route": tv.Choice({"billing": None, "shipping": None}, instructions="Which team?")}
TRANSIENT = ["http_500", "http_503", "http_429", "reset_mid_body", "truncated_body"]
MALFORMED = sorted(BODY_FAULTS)


async def clean_read(url: str) -> tv.Judgment:
    async with tv.Session.llama_cpp(url, reproducible=True) as session:
        return await session.judge(TICKET, QUESTION)


@pytest.mark.parametrize("fault", TRANSIENT + MALFORMED + ["oversized"])
async def test_a_fault_ends_in_an_exact_answer_or_a_typed_error(
    gemma3_url: str, fault: str
) -> None:
    clean = await clean_read(gemma3_url)
    tasks_before, fds_before = len(asyncio.all_tasks()), open_fds()
    async with FaultInjectingProxy(gemma3_url) as proxy:
        proxy.script = [fault]
        async with tv.Session.llama_cpp(proxy.url, reproducible=True) as session:
            try:
                judgment = await session.judge(TICKET, QUESTION)
            except tv.TypevetError as error:
                outcome: tv.Judgment | tv.TypevetError = error
            else:
                outcome = judgment
    assert fault in proxy.seen
    if fault in TRANSIENT:  # retried, then exactly the clean answer
        assert isinstance(outcome, tv.Judgment), outcome
        assert outcome.diagnostics["route"].logprobs == clean.diagnostics["route"].logprobs
        assert outcome["route"].probabilities == clean["route"].probabilities
        assert outcome.diagnostics["route"].attempts == 2
    else:  # never a wrong answer: a typed error naming the question
        assert isinstance(outcome, tv.ProtocolError), outcome
        assert outcome.question_id == "route"
    assert len(asyncio.all_tasks()) == tasks_before
    assert open_fds() <= fds_before


async def test_status_faults_without_retries_are_typed_server_errors(gemma3_url: str) -> None:
    async with FaultInjectingProxy(gemma3_url) as proxy:
        for fault, status in STATUS_FAULTS.items():
            proxy.script = [fault]
            async with tv.Session.llama_cpp(
                proxy.url, http=tv.HttpSettings(retry=tv.RetryPolicy(max_retries=0))
            ) as session:
                with pytest.raises(tv.ServerError) as caught:
                    await session.judge(TICKET, QUESTION)
            assert caught.value.status == status


async def test_a_server_that_never_answers(gemma3_url: str) -> None:
    async with FaultInjectingProxy(gemma3_url) as proxy:
        proxy.script = ["hang"]
        async with tv.Session.llama_cpp(
            proxy.url,
            http=tv.HttpSettings(request_timeout=1.0, retry=tv.RetryPolicy(max_retries=0)),
        ) as session:
            await session.probe()
            with pytest.raises(tv.RequestTimeoutError) as timed_out:
                await session.judge(TICKET, QUESTION)
        assert timed_out.value.question_id == "route"
        # The whole-judgment deadline fires between 1x and 2x its time (trio's
        # check_takes_about): the proxy never answers, so only the deadline ends the judgment.
        proxy.script = ["hang"]
        async with tv.Session.llama_cpp(proxy.url) as session:
            await session.probe()
            started = time.monotonic()
            with pytest.raises(tv.DeadlineExceededError):
                await session.judge(TICKET, QUESTION, timeout=0.5)
            elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 1.0


async def test_cancelling_the_caller_cancels_the_http_request(gemma3_url: str) -> None:
    async with FaultInjectingProxy(gemma3_url) as proxy:
        proxy.script = ["hang"]
        async with tv.Session.llama_cpp(proxy.url) as session:
            await session.probe()
            with anyio.move_on_after(0.5):
                await session.judge(TICKET, QUESTION)
            # Cancelling the judgment closed that request's connection: the server sees it.
            with anyio.fail_after(2.0):
                await proxy.client_hung_up.wait()


async def test_the_real_server_killed_mid_batch_and_restarted(tmp_path: object) -> None:
    """SIGKILL the llama.cpp server mid-batch, start it again on the same port: every record
    ends answered (retries ride out the outage), none lost or repeated."""
    import signal
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = tv.EmbeddedServer(tv.ServerOptions(port=port, n_parallel=2, n_ctx=4096))
    url = await anyio.to_thread.run_sync(first.start)
    second = tv.EmbeddedServer(tv.ServerOptions(port=port, n_parallel=2, n_ctx=4096))
    records = [(f"r{n}", f"Ticket {n}: {TICKET}") for n in range(24)]
    items: list[tv.BatchItem] = []
    try:
        async with tv.Session.llama_cpp(
            url, max_concurrency=2, http=tv.HttpSettings(retry=tv.RetryPolicy(max_retries=6))
        ) as session:
            async for item in session.judge_many(records, QUESTION):
                items.append(item)
                if len(items) == 6:  # mid-batch: kill it hard, then bring it back
                    assert first.process is not None
                    first.process.send_signal(signal.SIGKILL)
                    await anyio.to_thread.run_sync(first.stop)
                    await anyio.to_thread.run_sync(second.start)
    finally:
        await anyio.to_thread.run_sync(first.stop)
        await anyio.to_thread.run_sync(second.stop)
    assert [item.record_id for item in items] == [record_id for record_id, _ in records]
    retried = sum(
        item.judgment.diagnostics["route"].attempts > 1 for item in items if item.judgment
    )
    print(f"after a kill and restart: {sum(item.ok for item in items)} answered, {retried} retried")
    # Six retries back off for about 16 s in all; the restart takes about 4 s.
    assert [(item.record_id, item.error) for item in items if not item.ok] == []
    assert retried >= 1
