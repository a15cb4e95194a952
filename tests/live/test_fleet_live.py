"""A session over two real llama.cpp servers (Gemma 3 270M each): routing, failover when one
is SIGKILLed mid-batch, coming back after a restart, and a fleet refused for a differing
template.

Reads are counted on the server side, by llama.cpp's own Prometheus counters
(``--metrics``): ``tokens_predicted_total`` grows by one per scoring read and
``prompt_tokens_total`` by the prompt tokens it evaluated.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

import typevet_async as tv

pytestmark = pytest.mark.live

QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul("Is a refund requested?"),
    "route": tv.Choice(["billing", "shipping", "technical"], instructions="Which team?"),
}


def ticket(n: int) -> str:
    return f"Ticket {n}: I was charged twice for order {1000 + n}, please refund me."


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Replica:
    """An embedded llama.cpp server on a fixed port (so it can come back at the same URL)."""

    def __init__(self, name: str) -> None:
        logs = tv.cache_dir() / "test-logs"
        logs.mkdir(parents=True, exist_ok=True)
        options = tv.ServerOptions(
            n_ctx=4096, n_parallel=2, port=_free_port(), metrics=True, log_file=logs / f"{name}.log"
        )
        self.server = tv.EmbeddedServer(options)
        self.url = self.server.start()

    def kill(self) -> None:
        """SIGKILL: no goodbye to any connection."""
        process = self.server.process
        assert process is not None
        process.kill()
        process.wait()
        self.server.stop()

    def restart(self) -> None:
        self.server = tv.EmbeddedServer(attrs.evolve(self.server.options))
        assert self.server.start() == self.url

    def reads(self) -> int:
        """Scoring reads the server ran (one predicted token each)."""
        return int(self.metrics()["llamacpp:tokens_predicted_total"])

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            lines = response.read().decode().splitlines()
        return {
            line.split()[0]: float(line.split()[1])
            for line in lines
            if line and not line.startswith("#")
        }


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[Replica, Replica]]:
    first, second = Replica("fleet-a"), Replica("fleet-b")
    try:
        yield first, second
    finally:
        first.server.stop()
        second.server.stop()


def endpoints_of(items: list[tv.BatchItem]) -> list[str | None]:
    return [
        item.judgment.diagnostics[qid].endpoint
        for item in items
        if item.judgment is not None
        for qid in item.judgment.diagnostics
    ]


@pytest.mark.asyncio
async def test_reads_spread_over_both_and_answers_equal_one_servers(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    records = [ticket(n) for n in range(12)]
    async with tv.Session.llama_cpp(a.url, reproducible=True) as single:
        expected = [await single.judge(record, QUESTIONS) for record in records]
    before = a.reads(), b.reads()
    async with tv.Session.llama_cpp([a.url, b.url], reproducible=True) as fleet:
        items = [item async for item in fleet.judge_many(records, QUESTIONS, max_in_flight=4)]
    served = a.reads() - before[0], b.reads() - before[1]
    assert [item.index for item in items] == list(range(len(records)))
    for item, reference in zip(items, expected, strict=True):
        assert item.judgment is not None, item.error
        for question_id, answer in reference.items():
            got = item.judgment[question_id].probabilities
            assert dict(got) == pytest.approx(dict(answer.probabilities), abs=1e-6)
    # Server side: both served reads, exactly the ones our diagnostics name.
    named = endpoints_of(items)
    assert served == (named.count(a.url), named.count(b.url))
    assert min(served) > 0
    assert sum(served) == len(records) * len(QUESTIONS)


@pytest.mark.asyncio
@pytest.mark.timeout(900)  # ~130 reads, 110 of them on one server, and a restart: 3-5 min busy
async def test_a_server_killed_mid_batch_loses_no_record_and_comes_back(
    replicas: tuple[Replica, Replica], caplog: pytest.LogCaptureFixture
) -> None:
    # With one server left, reads wait for its 2 slots: they failed after 30 s of that wait
    # ("no endpoint came back within 30 s (...: up, ...: cooling)") when the machine was busy.
    caplog.set_level(logging.WARNING, logger="typevet_async")
    a, b = replicas
    members = [(url, tv.AsyncLlamaCpp(tv.LlamaCppConfig(base_url=url))) for url in (a.url, b.url)]
    fleet = tv.AsyncFleet(members, retry=tv.RetryPolicy(), cooldown=0.2, max_cooldown=1.0)
    records = [ticket(n) for n in range(100, 160)]
    items: list[tv.BatchItem] = []
    async with tv.Session(fleet, tv.SessionSettings(max_concurrency=4)) as session:
        async for item in session.judge_many(records, QUESTIONS, max_in_flight=4):
            items.append(item)
            if len(items) == 10:
                b.kill()  # mid-batch: reads in flight on it fail and go to the other
        assert [item.index for item in items] == list(range(len(records)))
        failed = [item for item in items if item.judgment is None]
        assert not failed, failed[0].error
        assert fleet.endpoint_states()[b.url] != "up"
        after_kill = endpoints_of(items[20:])
        assert set(after_kill) == {a.url}  # once it was seen down, nothing went to it
        # Back at the same URL: after its cooldown and a passing probe it takes reads again.
        await asyncio.to_thread(b.restart)
        served_before = b.reads()
        for n in range(200):
            await session.judge(ticket(1000 + n), QUESTIONS)
            if fleet.endpoint_states()[b.url] == "up" and b.reads() > served_before:
                break
            await asyncio.sleep(0.05)
        assert fleet.endpoint_states()[b.url] == "up"
        later: list[Any] = [await session.judge(ticket(2000 + n), QUESTIONS) for n in range(6)]
    assert b.reads() > served_before
    assert b.url in {j.diagnostics[q].endpoint for j in later for q in j.diagnostics}
    # The outage is logged when it starts and when it ends, not once per health check (those
    # and their probes' retries are DEBUG); the reads in flight on b at the kill are retried.
    about_b = [
        record.getMessage().split(" (")[0].split(" after ")[0]
        for record in caplog.records
        if record.name == "typevet_async.fleet" and b.url in record.getMessage()
    ]
    assert about_b == [
        f"endpoint {b.url} is out of the rotation",
        f"endpoint {b.url} is back in the rotation",
    ]
    retried = [record for record in caplog.records if record.name == "typevet_async.retry"]
    assert len(retried) <= 2, [record.getMessage() for record in retried]  # b's 2 slots


@pytest.mark.asyncio
async def test_a_fleet_with_another_template_on_one_endpoint_is_refused(
    replicas: tuple[Replica, Replica], chatml_url: str
) -> None:
    a, _ = replicas
    async with tv.Session.llama_cpp([a.url, chatml_url]) as session:
        with pytest.raises(tv.ConfigurationError, match="template family degraded") as raised:
            await session.judge(ticket(0), QUESTIONS)
    assert chatml_url in str(raised.value)
    assert "must not depend on which endpoint" in str(raised.value)
