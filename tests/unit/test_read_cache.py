"""The read cache's shell: the two stores (the LRU bound; SQLite's persistence, eviction,
lifecycle and refusals), single flight (one read for identical reads in flight; a cancelled
leader replaced; a failed leader's error copied to each waiter; errors never stored), and a
session through it (a hit takes no slot, settings checked).

A real server cannot fail or hang a read on cue: the session tests run on the in-memory stub
backend (`stubs.InMemoryStubBackend`), given a read identity; the real servers' reads through
the cache are tested live (tests/live/test_read_cache_live.py).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

import typevet_async as tv
from typevet_async import _errors
from typevet_async._core.read_values import encode_read
from typevet_async._read_cache import CachedReads, copy_error

from .stubs import InMemoryStubBackend, noul
from .test_read_keys import PROBE, read_of, request

pytestmark = pytest.mark.asyncio


class IdentifiedStub(InMemoryStubBackend):
    """The stub backend, its reads cacheable (`tv.ReadIdentifying`)."""

    def read_identity(self) -> str:
        return "stub"


def bound(cache: tv.ReadCache) -> CachedReads:
    reads = CachedReads.bind(cache, IdentifiedStub(), PROBE)
    assert reads is not None
    return reads


# -- MemoryReadCache -----------------------------------------------------------------------


async def test_the_memory_cache_drops_the_least_recently_used_past_its_bound() -> None:
    cache = tv.MemoryReadCache(max_entries=3)
    for key in "abc":
        await cache.put(key, key.encode())
    assert await cache.get("a") == b"a"  # now the most recently used
    await cache.put("d", b"d")
    assert await cache.entries() == 3
    assert await cache.get("b") is None
    assert [await cache.get(key) for key in "acd"] == [b"a", b"c", b"d"]
    await cache.put("a", b"new")  # replaced, not added
    assert await cache.entries() == 3
    assert await cache.get("a") == b"new"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
async def test_a_bound_that_is_not_a_positive_integer_is_refused(bad: Any, tmp_path: Path) -> None:
    with pytest.raises(tv.ConfigurationError, match="max_entries"):
        tv.MemoryReadCache(max_entries=bad)
    with pytest.raises(tv.ConfigurationError, match="max_entries"):
        tv.SqliteReadCache(tmp_path / "reads.db", max_entries=bad)


# -- SqliteReadCache -----------------------------------------------------------------------


async def test_sqlite_keeps_reads_across_store_objects(tmp_path: Path) -> None:
    path = tmp_path / "reads.db"
    async with tv.SqliteReadCache(path) as cache:
        await cache.put("k", b"value")
        await cache.put("k", b"replaced")
        assert await cache.get("k") == b"replaced"
        assert await cache.get("missing") is None
    async with tv.SqliteReadCache(path) as again:
        assert await again.get("k") == b"replaced"
        assert await again.entries() == 1
    with sqlite3.connect(path) as plain:  # WAL, one table of three columns
        assert plain.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = plain.execute("SELECT key, value, typeof(last_used) FROM reads").fetchall()
        assert rows == [("k", b"replaced", "integer")]
    plain.close()


async def test_sqlite_evicts_the_least_recently_used_past_its_bound(tmp_path: Path) -> None:
    async with tv.SqliteReadCache(tmp_path / "reads.db", max_entries=5) as cache:
        for n in range(5):
            await cache.put(f"k{n}", b"v")
        assert await cache.get("k0") == b"v"  # used: kept
        await cache.put("k5", b"v")
        await cache.put("k6", b"v")
        assert await cache.entries() == 5
        assert await cache.get("k1") is None
        assert await cache.get("k2") is None
        assert [await cache.get(f"k{n}") for n in (0, 3, 4, 5, 6)] == [b"v"] * 5


async def test_sqlite_evicts_in_batches_and_stays_within_its_bound(tmp_path: Path) -> None:
    async with tv.SqliteReadCache(tmp_path / "reads.db", max_entries=64) as cache:
        counts = []
        for n in range(300):
            await cache.put(f"k{n}", b"v")
            counts.append(await cache.entries())
        assert max(counts) == 64
        assert await cache.get("k299") == b"v"
        assert await cache.get("k0") is None
    # Reopened with a smaller bound: the first store trims the file.
    async with tv.SqliteReadCache(tmp_path / "reads.db", max_entries=10) as smaller:
        await smaller.put("new", b"v")
        assert await smaller.entries() <= 10
        assert await smaller.get("new") == b"v"


async def test_sqlite_is_shared_by_two_stores_at_once(tmp_path: Path) -> None:
    path = tmp_path / "reads.db"
    async with tv.SqliteReadCache(path) as one, tv.SqliteReadCache(path) as two:
        async with anyio.create_task_group() as group:
            for n in range(50):
                group.start_soon(one.put, f"a{n}", b"1")
                group.start_soon(two.put, f"b{n}", b"2")
        assert await one.get("b49") == b"2"
        assert await two.get("a0") == b"1"
        assert await one.entries() == 100


async def test_a_path_that_cannot_be_opened_is_a_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "reads.db"
    with pytest.raises(tv.ConfigurationError, match="no-such-folder"):
        await tv.SqliteReadCache(missing).open()
    not_a_database = tmp_path / "notes.txt"
    not_a_database.write_bytes(b"these are not the pages of a database" * 200)
    with pytest.raises(tv.ConfigurationError, match=r"notes\.txt"):
        await tv.SqliteReadCache(not_a_database).open()
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as plain:
        plain.execute("CREATE TABLE reads (id INTEGER, title TEXT)")
    plain.close()
    with pytest.raises(tv.ConfigurationError, match="not a read cache"):
        await tv.SqliteReadCache(foreign).open()


async def test_sqlite_must_be_open_to_be_used_and_cannot_reopen(tmp_path: Path) -> None:
    cache = tv.SqliteReadCache(tmp_path / "reads.db")
    with pytest.raises(tv.SessionStateError, match="async with"):
        await cache.get("k")
    await cache.open()
    await cache.open()  # twice: no-op
    await cache.aclose()
    await cache.aclose()
    with pytest.raises(tv.SessionStateError, match="closed"):
        await cache.put("k", b"v")
    with pytest.raises(tv.SessionStateError, match="reopen"):
        await cache.open()


async def test_sqlite_writes_last_used_in_batches_and_at_close(tmp_path: Path) -> None:
    path = tmp_path / "reads.db"
    async with tv.SqliteReadCache(path) as cache:
        await cache.put("k", b"v")
    with sqlite3.connect(path) as plain:
        (stored,) = plain.execute("SELECT last_used FROM reads").fetchone()
    plain.close()
    async with tv.SqliteReadCache(path) as cache:
        assert await cache.get("k") == b"v"
    with sqlite3.connect(path) as plain:
        (touched,) = plain.execute("SELECT last_used FROM reads").fetchone()
    plain.close()
    assert touched > stored


# -- single flight -------------------------------------------------------------------------


async def test_identical_reads_in_flight_are_sent_once() -> None:
    reads, req = bound(tv.MemoryReadCache()), request()
    sent = 0

    async def fetch() -> tv.CandidateRead:
        nonlocal sent
        sent += 1
        await anyio.sleep(0.05)
        return read_of(req)

    results: list[tv.CandidateRead] = []

    async def one() -> None:
        results.append(await reads.read(req, fetch))

    async with anyio.create_task_group() as group:
        for _ in range(64):
            group.start_soon(one)
    assert sent == 1
    assert sorted(read.cache or "" for read in results) == ["hit"] * 63 + ["miss"]
    assert {read.logprobs for read in results} == {read_of(req).logprobs}
    assert sum(read.reads for read in results) == read_of(req).reads  # the leader's alone
    # And then stored: the next read is a hit with nothing sent.
    again = await reads.read(req, fetch)
    assert (again.cache, again.reads, sent) == ("hit", 0, 1)


async def test_a_cancelled_leader_is_replaced_by_a_waiter() -> None:
    reads, req = bound(tv.MemoryReadCache()), request()
    started = anyio.Event()
    calls = 0

    async def fetch() -> tv.CandidateRead:
        nonlocal calls
        calls += 1
        if calls == 1:
            started.set()
            await anyio.sleep_forever()
        return read_of(req)

    results: list[tv.CandidateRead] = []

    async def waiter() -> None:
        results.append(await reads.read(req, fetch))

    leader = anyio.CancelScope()

    async def lead() -> None:
        with leader:
            await reads.read(req, fetch)

    async with anyio.create_task_group() as group:
        group.start_soon(lead)
        await started.wait()
        for _ in range(5):
            group.start_soon(waiter)
        await anyio.sleep(0.01)
        leader.cancel()
    assert calls == 2  # one waiter took over; the others got its read
    assert len(results) == 5
    assert sorted(read.cache or "" for read in results) == ["hit"] * 4 + ["miss"]


async def test_a_failed_leaders_error_is_each_waiters_own_and_never_stored() -> None:
    reads, req = bound(tv.MemoryReadCache()), request()
    calls = 0

    async def fetch() -> tv.CandidateRead:
        nonlocal calls
        calls += 1
        await anyio.sleep(0.05)
        raise tv.ServerError("busy", status=503, body="try later", retry_after=1.5)

    errors: list[BaseException] = []

    async def one(question_id: str) -> None:
        try:
            await reads.read(req, fetch)
        except tv.ServerError as error:
            error.question_id = question_id  # as the judgment names its question
            errors.append(error)

    async with anyio.create_task_group() as group:
        for n in range(4):
            group.start_soon(one, f"q{n}")
    assert calls == 1
    assert len({id(error) for error in errors}) == 4
    assert sorted(error.question_id or "" for error in errors) == ["q0", "q1", "q2", "q3"]
    assert all(isinstance(e, tv.ServerError) and e.status == 503 for e in errors)
    assert all(e.retry_after == 1.5 and e.body == "try later" for e in errors)  # type: ignore[attr-defined]
    with pytest.raises(tv.ServerError):  # nothing stored: read again
        await reads.read(req, fetch)
    assert calls == 2


async def test_every_sdk_error_can_be_copied_for_a_waiter() -> None:
    examples = [
        tv.ServerError("s", status=500, body="b"),
        tv.CandidateMissingError("m", missing=(1, 2)),
        tv.TooManyOptionsError("t", count=3, limit=2),
        tv.OffMenuError("o", off_menu_mass=0.5, threshold=0.1),
        tv.InvalidLogprobsError("i", payload={"x": 1}),
        tv.TransportError("t"),
    ]
    for name in _errors.__all__:
        cls = getattr(_errors, name)
        if not any(type(example) is cls for example in examples):
            try:
                examples.append(cls("message"))
            except TypeError:
                continue  # a keyword-only error is among the examples' kinds
    for error in examples:
        error.add_note("endpoint: a")
        copied = copy_error(error)
        assert type(copied) is type(error)
        assert copied is not error
        assert str(copied) == str(error)
        assert vars(copied) == vars(error)
        copied.add_note("another")
        assert error.__notes__ == ["endpoint: a"]


async def test_a_stored_value_that_is_corrupt_is_read_again_and_overwritten() -> None:
    cache, req = tv.MemoryReadCache(), request()
    reads = bound(cache)
    calls = 0

    async def fetch() -> tv.CandidateRead:
        nonlocal calls
        calls += 1
        return read_of(req)

    first = await reads.read(req, fetch)
    (key,) = cache._entries  # the one key this read was stored under
    await cache.put(key, b"garbage")
    second = await reads.read(req, fetch)
    assert (first.cache, second.cache, calls) == ("miss", "miss", 2)
    assert await cache.get(key) == encode_read(read_of(req))


async def test_only_a_read_that_would_be_taken_back_is_stored() -> None:
    cache, req = tv.MemoryReadCache(), request()
    reads = bound(cache)

    async def invalid() -> tv.CandidateRead:  # the candidates' mass past 1: the answer refuses
        return read_of(req, logprobs=(-0.01, -0.02, -0.03))

    read = await reads.read(req, invalid)
    assert read.cache == "miss"
    assert await cache.entries() == 0

    async def too_large() -> tv.CandidateRead:
        return read_of(req, prompt="x" * (4 * 1024 * 1024))

    await reads.read(req, too_large)
    assert await cache.entries() == 0


class BrokenStore:
    """A store whose disk is gone: every call fails."""

    async def get(self, key: str) -> bytes | None:
        raise OSError("disk I/O error")

    async def put(self, key: str, value: bytes) -> None:
        raise OSError("disk I/O error")


async def test_a_failing_store_is_logged_and_the_read_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    req = request()

    async def fetch() -> tv.CandidateRead:
        return read_of(req)

    with caplog.at_level(logging.WARNING, logger="typevet_async.read_cache"):
        read = await bound(BrokenStore()).read(req, fetch)
    assert read.cache == "miss"
    assert len(caplog.records) == 2
    assert "failed to get" in caplog.records[0].message
    assert "failed to store" in caplog.records[1].message


# -- a session through the cache -----------------------------------------------------------


async def test_a_hit_takes_no_slot_and_costs_nothing() -> None:
    backend = IdentifiedStub()
    settings = tv.SessionSettings(max_concurrency=1, cache=tv.MemoryReadCache())
    async with tv.Session(backend, settings) as session:
        first = await session.judge("cached", {"q": noul()})
        blocker = anyio.Event()

        async def hold() -> None:
            await blocker.wait()

        backend.behaviours["hold"] = hold
        async with anyio.create_task_group() as group:
            group.start_soon(session.judge, "holding the only slot", {"hold": noul()})
            await anyio.sleep(0.05)
            assert backend.in_flight == 1  # the one slot is taken
            with anyio.fail_after(2):
                again = await session.judge("cached", {"q": noul()})
            blocker.set()
    assert first.usage == tv.Usage(10, 0, 1)
    assert first.diagnostics["q"].cache == "miss"
    assert again.usage == tv.Usage(0, 0, 0, 1)
    assert again.diagnostics["q"].cache == "hit"
    assert (again.diagnostics["q"].reads, again.diagnostics["q"].attempts) == (0, 0)
    assert again["q"] == first["q"]
    assert backend.reads == ["q", "hold"]


async def test_without_a_cache_or_an_identity_nothing_is_cached() -> None:
    backend = InMemoryStubBackend()  # no read identity (as System One's)
    assert CachedReads.bind(tv.MemoryReadCache(), backend, PROBE) is None
    assert CachedReads.bind(None, IdentifiedStub(), PROBE) is None
    async with tv.Session(backend, tv.SessionSettings(cache=tv.MemoryReadCache())) as session:
        one = await session.judge("s", {"q": noul()})
        two = await session.judge("s", {"q": noul()})
    assert backend.reads == ["q", "q"]
    assert one.diagnostics["q"].cache is None
    assert two.usage.cache_hits == 0


async def test_a_question_read_under_rotations_is_a_hit_only_when_all_are() -> None:
    backend = IdentifiedStub()
    choice = tv.Choice(["a", "b", "c"], instructions="Which?")
    async with tv.Session(backend, tv.SessionSettings(cache=tv.MemoryReadCache())) as session:
        first = await session.judge("s", {"q": choice}, permutations=3)
        again = await session.judge("s", {"q": choice}, permutations=3)
    assert first.diagnostics["q"].cache == "miss"
    assert again.diagnostics["q"].cache == "hit"
    assert again.usage == tv.Usage(cache_hits=3)
    assert again["q"] == first["q"]
    assert len(backend.reads) == 3


@pytest.mark.parametrize("bad", ["reads.db", 3, object()])
async def test_the_cache_setting_is_checked(bad: Any) -> None:
    with pytest.raises(tv.ConfigurationError, match="cache must be a read cache"):
        tv.SessionSettings(cache=bad)
    with pytest.raises(tv.ConfigurationError, match="cache must be a read cache"):
        tv.Session.llama_cpp("http://127.0.0.1:1", cache=bad)


async def test_every_factory_takes_the_cache(no_typevet_variables: None) -> None:
    cache = tv.MemoryReadCache()
    sessions = [
        tv.Session.llama_cpp("http://127.0.0.1:1", cache=cache),
        tv.Session.vllm("http://127.0.0.1:1", model="m", cache=cache),
        tv.Session.llama_cpp(["http://127.0.0.1:1", "http://127.0.0.1:2"], cache=cache),
        tv.Session.from_env({"TYPEVET_BASE_URL": "http://127.0.0.1:1"}, cache=cache),
    ]
    assert all(session.settings.cache is cache for session in sessions)
    env = tv.Session.from_env({"TYPEVET_BASE_URL": "http://h:1", "TYPEVET_MAX_CONCURRENCY": "2"},
                              layout="fused")  # fmt: skip
    assert (env.settings.max_concurrency, env.settings.layout) == (2, tv.Layout.FUSED)
    with pytest.raises(tv.ConfigurationError, match="TYPEVET_MAX_CONCURRENCY"):
        tv.Session.from_env({}, max_concurrency=3)
    with pytest.raises(tv.ConfigurationError, match="unknown session setting"):
        tv.Session.from_env({}, cahce=cache)


async def test_a_session_never_closes_its_cache(tmp_path: Path) -> None:
    async with tv.SqliteReadCache(tmp_path / "reads.db") as cache:
        for _ in range(2):
            async with tv.Session(IdentifiedStub(), tv.SessionSettings(cache=cache)) as session:
                judgment = await session.judge("s", {"q": noul()})
        assert judgment.diagnostics["q"].cache == "hit"  # the second session's, from the file
        assert await cache.entries() == 1


async def test_a_read_identity_protocol_is_what_marks_a_cacheable_backend() -> None:
    assert isinstance(IdentifiedStub(), tv.ReadIdentifying)
    assert not isinstance(InMemoryStubBackend(), tv.ReadIdentifying)
    assert attrs.has(CachedReads)
