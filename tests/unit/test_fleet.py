"""`AsyncFleet`'s routing, failover and fleet checks, over in-memory stub backends (a real
server cannot fail on cue or hold reads in a chosen order; tests/live/test_fleet_live.py runs
two real llama.cpp servers)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import anyio
import attrs
import pytest

import typevet_async as tv
from typevet_async._backends.retrying import is_transient, retrying

from .stubs import InMemoryStubBackend, failing_after, noul, sleeping


class Replica(InMemoryStubBackend):
    """A stub endpoint: it can declare slots, serve another template, or be down."""

    def __init__(self, *, slots: int | None = None, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.slots = slots
        self.down = False
        self.probe_family: tv.TemplateFamily | None = None

    async def probe(self) -> tv.Probe:
        if self.down:
            raise tv.TransportError("connection refused")
        probe = await super().probe()
        family = self.probe_family or probe.family
        return attrs.evolve(probe, family=family, slots=self.slots)

    async def read(
        self, request: tv.ScoringRequest, probe: tv.Probe, *, max_retries: int | tv.Unset
    ) -> tv.CandidateRead:
        if self.down:
            self.read_requests.append(request)
            raise tv.TransportError("connection reset")
        return await super().read(request, probe, max_retries=max_retries)


def fleet_of(
    replicas: Sequence[Replica], *, max_retries: int = 2, slots: int | None = None
) -> tv.AsyncFleet:
    members = [(f"http://replica-{n}", replica) for n, replica in enumerate(replicas)]
    return tv.AsyncFleet(
        members,
        retry=tv.RetryPolicy(max_retries=max_retries),
        endpoint_slots=slots,
        cooldown=0.05,
        max_cooldown=0.2,
    )


def session_of(fleet: tv.AsyncFleet, concurrency: int = 8) -> tv.Session:
    return tv.Session(fleet, tv.SessionSettings(max_concurrency=concurrency, prefix_reuse="off"))


QUESTIONS = {"q": noul()}


async def judge_until(session: tv.Session, fleet: tv.AsyncFleet, state: str) -> None:
    """Judge until the first endpoint is in ``state`` (its health checks start from reads)."""
    with anyio.fail_after(5):
        while fleet.endpoint_states()["http://replica-0"] != state:
            await session.judge("until", QUESTIONS)
            await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_reads_go_to_the_least_busy_endpoint_within_its_slots() -> None:
    first, second = Replica(slots=1), Replica(slots=3)
    for replica in (first, second):
        replica.behaviours["q"] = sleeping(0.05)
    async with session_of(fleet_of([first, second])) as session:
        items = [item async for item in session.judge_many(range(8), QUESTIONS, max_in_flight=8)]
    assert all(item.judgment is not None for item in items)
    assert (first.peak, second.peak) == (1, 3)  # never past an endpoint's slots
    assert len(first.reads) + len(second.reads) == 8
    endpoints = {item.judgment.diagnostics["q"].endpoint for item in items if item.judgment}
    assert endpoints == {"http://replica-0", "http://replica-1"}


@pytest.mark.asyncio
async def test_the_fleets_slots_setting_caps_every_endpoint() -> None:
    first, second = Replica(slots=4), Replica()
    for replica in (first, second):
        replica.behaviours["q"] = sleeping(0.02)
    async with session_of(fleet_of([first, second], slots=2)) as session:
        async for _ in session.judge_many(range(12), QUESTIONS, max_in_flight=8):
            pass
    assert (first.peak, second.peak) == (2, 2)


@pytest.mark.asyncio
async def test_a_failing_endpoint_cools_down_and_the_read_goes_to_another() -> None:
    first, second = Replica(), Replica()
    first.down = True
    async with session_of(fleet_of([first, second])) as session:
        await session.probe()  # the first is down at the probe: it starts cooling
        assert session.backend.endpoint_states()["http://replica-0"] == "cooling"  # type: ignore[attr-defined]
        judgment = await session.judge("x", QUESTIONS)
    assert judgment.diagnostics["q"].endpoint == "http://replica-1"
    assert first.reads == []


@pytest.mark.asyncio
async def test_a_failed_read_is_retried_elsewhere_and_counted() -> None:
    first, second = Replica(), Replica()
    async with session_of(fleet_of([first, second])) as session:
        await session.probe()
        first.down = True  # after the probe: the first read sent to it fails
        judgments = [await session.judge(f"s{n}", QUESTIONS) for n in range(4)]
    failed_over = [j.diagnostics["q"] for j in judgments if j.diagnostics["q"].attempts > 1]
    assert len(first.read_requests) == 1  # once seen failing, it is not tried again yet
    assert len(failed_over) == 1
    assert failed_over[0].endpoint == "http://replica-1"
    assert failed_over[0].attempts == 2  # the failed try counts


@pytest.mark.asyncio
async def test_retries_across_endpoints_count_against_max_retries() -> None:
    first, second = Replica(), Replica()
    async with session_of(fleet_of([first, second], max_retries=1)) as session:
        await session.probe()
        first.down = second.down = True
        with pytest.raises(tv.TransportError) as raised:
            await session.judge("x", QUESTIONS)
    assert len(first.read_requests) + len(second.read_requests) == 2  # 1 + max_retries
    assert any("endpoint: http://replica-" in note for note in raised.value.__notes__)


@pytest.mark.asyncio
async def test_an_endpoint_comes_back_after_its_cooldown_and_a_passing_probe() -> None:
    first, second = Replica(), Replica()
    fleet = fleet_of([first, second])
    async with session_of(fleet) as session:
        await session.probe()
        first.down = True
        await session.judge("a", QUESTIONS)
        await session.judge("b", QUESTIONS)
        assert fleet.endpoint_states()["http://replica-0"] != "up"
        first.down = False
        await judge_until(session, fleet, "up")
        before = len(first.reads)
        for n in range(6):
            await session.judge(f"later {n}", QUESTIONS)
    assert len(first.reads) > before


@pytest.mark.asyncio
async def test_an_endpoint_that_comes_back_different_is_excluded() -> None:
    first, second = Replica(), Replica()
    fleet = fleet_of([first, second])
    async with session_of(fleet) as session:
        await session.probe()
        first.down = True
        await session.judge("a", QUESTIONS)
        first.down, first.probe_family = False, tv.TemplateFamily.GEMMA4
        await judge_until(session, fleet, "excluded")


@pytest.mark.asyncio
async def test_a_fleet_that_disagrees_is_refused_naming_the_endpoint() -> None:
    first, second = Replica(), Replica()
    second.probe_family = tv.TemplateFamily.GEMMA4
    async with session_of(fleet_of([first, second])) as session:
        with pytest.raises(tv.ConfigurationError, match="replica-1 differs from") as raised:
            await session.judge("x", QUESTIONS)
    assert "template family gemma4 (not gemma3)" in str(raised.value)
    assert first.reads == second.reads == []


@pytest.mark.asyncio
async def test_a_judgments_reads_stay_on_one_endpoint_where_prefixes_are_reused() -> None:
    first, second = Replica(), Replica()
    for replica in (first, second):
        replica.behaviours["a"] = replica.behaviours["b"] = sleeping(0.01)
    questions = {"a": noul(), "b": noul(1), "c": noul(2)}
    settings = tv.SessionSettings(max_concurrency=8, prefix_reuse="first")
    async with tv.Session(fleet_of([first, second]), settings) as session:
        judgments = await asyncio.gather(*(session.judge(f"s{n}", questions) for n in range(6)))
    for judgment in judgments:
        assert len({d.endpoint for d in judgment.diagnostics.values()}) == 1
    assert first.reads  # and the judgments themselves were spread
    assert second.reads


@pytest.mark.asyncio
async def test_no_endpoint_up_waits_for_the_first_cooldown() -> None:
    first, second = Replica(), Replica()
    fleet = fleet_of([first, second], max_retries=6)
    async with session_of(fleet) as session:
        await session.probe()
        first.down = second.down = True
        task = asyncio.create_task(session.judge("x", QUESTIONS))
        await asyncio.sleep(0.1)
        first.down = False  # its next health check passes; the read then goes to it
        judgment = await asyncio.wait_for(task, 5)
    assert judgment.diagnostics["q"].endpoint == "http://replica-0"


def test_bad_fleets_are_configuration_errors() -> None:
    with pytest.raises(tv.ConfigurationError, match="at least two"):
        fleet_of([Replica()])
    with pytest.raises(tv.ConfigurationError, match="twice"):
        tv.Session.llama_cpp(["http://a:1", "http://a:1/"])
    with pytest.raises(tv.ConfigurationError, match="non-empty list"):
        tv.Session.vllm([], model="m")
    with pytest.raises(tv.ConfigurationError, match="several URLs"):
        tv.Session.llama_cpp("http://a:1", endpoint_slots=2)
    with pytest.raises(tv.ConfigurationError, match="endpoint_slots"):
        tv.Session.llama_cpp(["http://a:1", "http://b:1"], endpoint_slots=0)
    session = tv.Session.system_one(["http://a:1", "http://b:1"], endpoint_slots=4)
    assert isinstance(session.backend, tv.AsyncFleet)
    assert session.backend.endpoints == ["http://a:1", "http://b:1"]


@pytest.mark.asyncio
async def test_a_generation_is_not_retried_elsewhere_after_a_timeout() -> None:
    first, second = Replica(), Replica()
    capabilities = tv.Capabilities(framing="sdk", prefix_reuse=False, generation_images=False)
    for replica in (first, second):
        replica._capabilities = capabilities
        replica.behaviours["p"] = failing_after(0.0, tv.RequestTimeoutError("took too long"))
    async with session_of(fleet_of([first, second])) as session:
        with pytest.raises(tv.RequestTimeoutError):
            await session.generate("p", schema={"type": "object"})
    assert len(first.generation_requests) + len(second.generation_requests) == 1


@pytest.mark.asyncio
async def test_one_read_at_a_time_still_alternates_between_endpoints() -> None:
    first, second = Replica(), Replica()
    async with session_of(fleet_of([first, second])) as session:
        judgments = [await session.judge(f"s{n}", QUESTIONS) for n in range(6)]
    names = [judgment.diagnostics["q"].endpoint for judgment in judgments]
    assert names == ["http://replica-0", "http://replica-1"] * 3


class Refusing(Replica):
    """A replica whose reads answer ``status`` (with ``Retry-After``) until ``until`` (a
    monotonic time) or for its first ``times`` reads; its probe keeps passing."""

    def __init__(
        self, status: int, *, times: int = 0, until: float = 0.0, retry_after: float | None = None
    ) -> None:
        super().__init__()
        self.status, self.times, self.until, self.retry_after = status, times, until, retry_after

    async def read(
        self, request: tv.ScoringRequest, probe: tv.Probe, *, max_retries: int | tv.Unset
    ) -> tv.CandidateRead:
        if self.times > 0 or asyncio.get_running_loop().time() < self.until:
            self.times -= 1
            self.read_requests.append(request)
            raise tv.ServerError(
                f"HTTP {self.status}", status=self.status, body="", retry_after=self.retry_after
            )
        return await super().read(request, probe, max_retries=max_retries)


@pytest.mark.asyncio
async def test_every_endpoint_failing_once_is_survived_waiting_spends_no_retry() -> None:
    # Both endpoints answered 503 once: the fleet failed even with max_retries=8 (each wait for
    # a cooldown or a health check was a try), where one endpoint survives two 503s.
    first, second = Refusing(503, times=1), Refusing(503, times=1)
    fleet = fleet_of([first, second], max_retries=2)
    async with session_of(fleet) as session:
        await session.probe()
        judgment = await session.judge("x", QUESTIONS)
    assert judgment.diagnostics["q"].attempts == 3  # two failed tries, then the answer
    assert len(first.read_requests) + len(second.read_requests) == 3


@pytest.mark.asyncio
async def test_a_retry_after_longer_than_the_cooldown_is_waited_for() -> None:
    # Under 429 with Retry-After: 4, one endpoint answered at 4 s; the fleet gave up at 1.1 s.
    loop = asyncio.get_running_loop()
    until = loop.time() + 0.6
    first = Refusing(429, until=until, retry_after=0.6)
    second = Refusing(429, until=until, retry_after=0.6)
    fleet = fleet_of([first, second], max_retries=3)  # cooldown 0.05, max_cooldown 0.2
    async with session_of(fleet) as session:
        await session.probe()
        began = loop.time()
        judgment = await session.judge("x", QUESTIONS)
    assert loop.time() - began >= 0.55  # it waited out the Retry-After, not its own 0.05 s
    assert judgment.diagnostics["q"].attempts == 3  # one try on each, then the answer


@pytest.mark.asyncio
async def test_no_endpoint_coming_back_within_the_patience_is_final() -> None:
    first, second = Replica(), Replica()
    members = [(f"http://replica-{n}", replica) for n, replica in enumerate([first, second])]
    fleet = tv.AsyncFleet(
        members, retry=tv.RetryPolicy(max_retries=8, max_retry_after=0.3), cooldown=0.05,
        max_cooldown=0.1,
    )  # fmt: skip
    async with session_of(fleet) as session:
        await session.probe()
        first.down = second.down = True
        with pytest.raises(tv.TransportError, match=r"no endpoint came back within 0\.3 s"):
            await session.judge("x", QUESTIONS)
    assert len(first.read_requests) + len(second.read_requests) == 2  # no retry was spent waiting


@pytest.mark.asyncio
async def test_a_full_endpoint_is_waited_for_past_the_patience_while_the_other_is_down() -> None:
    # One replica SIGKILLed: the other was up but full, and reads waiting for its slot failed
    # with "no endpoint came back within 30 s (...: up, ...: cooling)". The patience is for an
    # outage of every endpoint; a slot of one that is up is waited for.
    first, second = Replica(slots=1), Replica()
    first.behaviours["q"] = sleeping(0.5)  # each read holds the only slot past the patience
    second.down = True
    members = [(f"http://replica-{n}", replica) for n, replica in enumerate([first, second])]
    fleet = tv.AsyncFleet(
        members, retry=tv.RetryPolicy(max_retry_after=0.2), cooldown=0.05, max_cooldown=0.1
    )
    async with session_of(fleet) as session:
        await session.probe()  # the second is down from the start
        judgments = await asyncio.gather(*(session.judge(f"s{n}", QUESTIONS) for n in range(3)))
        assert fleet.endpoint_states()["http://replica-1"] != "up"
    assert [j.diagnostics["q"].endpoint for j in judgments] == ["http://replica-0"] * 3
    assert first.peak == 1


@pytest.mark.asyncio
async def test_the_wait_for_a_full_endpoint_is_bounded_by_the_callers_timeout() -> None:
    first, second = Replica(slots=1), Replica()
    first.behaviours["q"] = sleeping(0.6)
    second.down = True
    async with session_of(fleet_of([first, second])) as session:
        await session.probe()
        holding = asyncio.create_task(session.judge("first", QUESTIONS))
        await asyncio.sleep(0.05)  # it holds the only slot
        with pytest.raises(tv.DeadlineExceededError):
            await session.judge("second", QUESTIONS, timeout=0.2)
        assert (await holding).diagnostics["q"].endpoint == "http://replica-0"
        later = await session.judge("third", QUESTIONS)  # the cancelled wait left its place
    assert later.diagnostics["q"].endpoint == "http://replica-0"


@pytest.mark.asyncio
async def test_reads_waiting_for_a_slot_are_served_in_turn() -> None:
    # A read that freed a slot took it straight back for its task's next read, ahead of those
    # already waiting: under load, waits for a slot ran past 30 s while reads took 2 s.
    first, second = Replica(slots=1), Replica()
    first.behaviours["q"] = sleeping(0.02)
    second.down = True
    done: list[str] = []
    async with session_of(fleet_of([first, second])) as session:
        await session.probe()

        async def back_to_back() -> None:
            for n in range(12):
                await session.judge(f"busy {n}", QUESTIONS)
                done.append(f"busy {n}")

        busy = asyncio.create_task(back_to_back())
        await asyncio.sleep(0.01)  # its first read holds the slot
        await session.judge("waiting", QUESTIONS)
        done.append("waiting")
        await busy
    assert done.index("waiting") <= 2  # after the read it waited behind, and the next at most


class Unreachable(Replica):
    """A replica whose probe, while it is down, fails through the retry engine as an HTTP
    backend's does (three connection attempts)."""

    async def probe(self) -> tv.Probe:
        if not self.down:
            return await super().probe()

        async def attempt() -> tv.Probe:
            raise tv.TransportError("connection refused")

        return await retrying(attempt, retries=2, retryable=is_transient, wait=lambda _: 0.0)


@pytest.mark.asyncio
async def test_an_outage_logs_when_it_starts_and_when_it_ends_not_per_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 278 WARNINGs for one replica down two minutes: two per health check, and two more for
    # its probe's own retries.
    caplog.set_level(logging.WARNING, logger="typevet_async")
    first, second = Unreachable(), Unreachable()
    first.down = True
    fleet = fleet_of([first, second])
    async with session_of(fleet) as session:
        await session.probe()
        for n in range(40):  # 0.4 s: health checks every 0.05 to 0.2 s fail
            await session.judge(f"s{n}", QUESTIONS)
            await asyncio.sleep(0.01)
        first.down = False
        await judge_until(session, fleet, "up")
    lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert [line[:2] for line in lines] == [("typevet_async.fleet", "WARNING")] * 2, lines
    assert "http://replica-0 is out of the rotation (TransportError)" in lines[0][2]
    assert "http://replica-0 is back in the rotation after" in lines[1][2]
    assert "connection refused" not in str(lines)  # an error's message is not logged
