"""The read cache's shell: the two stores (the LRU bound; SQLite's persistence, eviction,
lifecycle and refusals), single flight (one read for identical reads in flight; a cancelled
leader replaced; a failed leader's error copied to each waiter; errors never stored), and a
session through it (a hit takes no slot, settings checked).

A real server cannot fail or hang a read on cue: the session tests run on the in-memory stub
backend (`stubs.InMemoryStubBackend`), given a read identity; the real servers' reads through
the cache are tested live (tests/live/test_read_cache_live.py).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

import typevet_async as tv
from typevet_async import _errors
from typevet_async._core.reading.read_values import encode_read
from typevet_async._session.read_cache import CachedReads, copy_error
from typevet_async._session.read_cache_sqlite import MAX_UNWRITTEN, TOUCH_BATCH

from .stubs import InMemoryStubBackend, noul, sleeping
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


async def test_the_reads_are_keyed_on_the_package_version() -> None:
    # An upgrade never reads the entries an older version stored.
    assert bound(tv.MemoryReadCache()).identity == f"stub\nsdk {tv.__version__}"


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
        await one.flush()  # each object writes behind: another sees its stores once written
        await two.flush()
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


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        # The case: the cache's columns, no primary key (every store failed after).
        ("CREATE TABLE reads (key TEXT, value BLOB, last_used INTEGER)", "primary key"),
        (
            "CREATE TABLE reads (key TEXT, value BLOB, last_used INTEGER, "
            "PRIMARY KEY (key, value))",
            r"primary key \(key, value\)",
        ),
        ("CREATE TABLE reads (key TEXT, value BLOB, last_used INTEGER PRIMARY KEY)", "primary key"),
        ("CREATE TABLE reads (key BLOB PRIMARY KEY, value TEXT, last_used INTEGER)", "columns"),
        (
            "CREATE TABLE reads (key TEXT PRIMARY KEY, value BLOB, last_used INTEGER, "
            "UNIQUE (last_used))",
            "unique index",
        ),
        (
            "CREATE TABLE kept (key TEXT PRIMARY KEY, value BLOB, last_used INTEGER); "
            "CREATE VIEW reads AS SELECT * FROM kept",
            "'reads' is a view",
        ),
    ],
)
async def test_a_reads_table_a_store_cannot_write_is_refused_at_open(
    tmp_path: Path, table: str, problem: str
) -> None:
    foreign = tmp_path / "foreign.db"
    plain = sqlite3.connect(foreign)
    plain.executescript(table)
    plain.close()
    with pytest.raises(tv.ConfigurationError, match=problem) as refused:
        await tv.SqliteReadCache(foreign).open()
    assert "foreign.db" in str(refused.value)
    assert "not a read cache" in str(refused.value)


async def test_a_reads_table_of_the_cache_s_shape_made_elsewhere_is_used(tmp_path: Path) -> None:
    path = tmp_path / "made.db"
    plain = sqlite3.connect(path)
    plain.executescript(  # another spelling of the same table; a unique index key decides
        "CREATE TABLE Reads (key text PRIMARY KEY, value blob, last_used integer);"
        "CREATE UNIQUE INDEX by_key_and_use ON Reads (last_used, key)"
    )
    plain.close()
    async with tv.SqliteReadCache(path) as cache:
        await cache.put("k", b"v")
        assert await cache.entries() == 1
        assert cache.failed_stores == 0


# A script that opens a cache, stores, flushes, stores again and leaves without `aclose`: by an
# exception, by returning (either way the loop's end finds the last stores' transaction under
# way), or by a loop that ends without cancelling its tasks (the last stores not yet begun).
_LEFT_OPEN = """
import asyncio, sys
import typevet_async as tv

async def main(path, how):
    cache = tv.SqliteReadCache(path)
    await cache.open()
    await cache.put("flushed", b"1")
    await cache.flush()
    for n in range(500):
        await cache.put(f"after{n}", b"2" * 1000)
    if how == "raise":
        raise RuntimeError("between open and aclose")

path, how = sys.argv[1:]
if how == "loop":
    asyncio.new_event_loop().run_until_complete(main(path, how))
else:
    asyncio.run(main(path, how))
"""


@pytest.mark.parametrize(
    ("how", "code", "kept"),
    [("raise", 1, 501), ("return", 0, 501), ("loop", 0, 1)],
)
async def test_a_cache_left_open_never_holds_the_process_nor_loses_a_flushed_store(
    tmp_path: Path, how: str, code: int, kept: int
) -> None:
    path = tmp_path / "reads.db"
    # aiosqlite's threads held the process for ever: a generous bound, whatever the load.
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [sys.executable, "-c", _LEFT_OPEN, str(path), how],
            check=False,
            cwd=Path(__file__).parents[2],
        )
    stderr = done.stderr.decode()
    assert done.returncode == code, stderr
    assert ("RuntimeError: between open and aclose" in stderr) == (how == "raise")
    assert "Exception in thread" not in stderr
    assert "Task was destroyed" not in stderr
    plain = sqlite3.connect(path)
    keys = {key for (key,) in plain.execute("SELECT key FROM reads")}
    plain.close()
    # asyncio.run cancels the loop's tasks at its end: the cache closes as aclose would,
    # writing what waits. A loop that just stops keeps what was flushed.
    assert "flushed" in keys
    assert len(keys) == kept


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


async def test_a_flight_is_shared_only_under_the_same_retry_policy() -> None:
    reads, req = bound(tv.MemoryReadCache()), request()
    calls: list[str] = []

    def fetch(policy: str) -> Any:
        async def read() -> tv.CandidateRead:
            calls.append(policy)
            await anyio.sleep(0.05)
            if policy == "no retries":  # gave up on the server's 503; a retry got through
                raise tv.ServerError("busy", status=503, body="", retry_after=None)
            return read_of(req)

        return read

    outcomes: dict[str, Any] = {}

    async def one(policy: str) -> None:
        try:
            outcomes[policy] = await reads.read(req, fetch(policy), policy=policy)
        except tv.ServerError as error:
            outcomes[policy] = error

    async with anyio.create_task_group() as group:
        group.start_soon(one, "no retries")
        await anyio.sleep(0.01)  # its read is in flight
        group.start_soon(one, "three retries")
    assert isinstance(outcomes["no retries"], tv.ServerError)
    assert isinstance(outcomes["three retries"], tv.CandidateRead)  # its own read, not the 503
    assert outcomes["three retries"].cache == "miss"
    assert calls == ["no retries", "three retries"]


class RetryingStub(IdentifiedStub):
    """A server that answers one question 503 once per read: a read with no retries fails,
    one that may retry gets through (as `retrying.py` would, in one call)."""

    async def read(
        self, request: tv.ScoringRequest, probe: tv.Probe, *, max_retries: int | tv.Unset
    ) -> tv.CandidateRead:
        read = await super().read(request, probe, max_retries=max_retries)
        if max_retries == 0:
            raise tv.ServerError("upstream busy", status=503, body="", retry_after=None)
        return read


async def test_a_judgment_keeps_its_own_retry_policy_beside_an_identical_one() -> None:
    backend = RetryingStub()
    backend.behaviours["q"] = sleeping(0.05)
    results: dict[str, Any] = {}

    async def judge(session: tv.Session, name: str, retries: int) -> None:
        try:
            results[name] = await session.judge("s", {"q": noul()}, max_retries=retries)
        except tv.ServerError as error:
            results[name] = error

    settings = tv.SessionSettings(cache=tv.MemoryReadCache())
    async with tv.Session(backend, settings) as session, anyio.create_task_group() as group:
        group.start_soon(judge, session, "no retries", 0)
        await anyio.sleep(0.01)
        group.start_soon(judge, session, "three retries", 3)
    assert isinstance(results["no retries"], tv.ServerError)
    assert isinstance(results["three retries"], tv.Judgment)
    assert backend.retries_seen == [0, 3]


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
        tv.Session.from_env({"TYPEVET_MAX_CONCURRENCY": "2"}, max_concurrency=3)
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


# -- SqliteReadCache under another process's lock ------------------------------------------


@contextlib.contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """Another process holds ``path``'s write lock (``BEGIN IMMEDIATE``) until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None
    assert holder.stdin is not None
    try:
        assert holder.stdout.readline() == "locked\n"
        yield
    finally:
        holder.stdin.close()  # the holder commits and exits
        assert holder.wait(timeout=30) == 0
        holder.stdout.close()


_HOLD_LOCK = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
connection.execute("COMMIT")
"""


async def test_a_file_locked_by_another_process_never_holds_a_judgment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "reads.db"
    backend = IdentifiedStub()
    async with tv.SqliteReadCache(path) as cache:
        async with tv.Session(backend, tv.SessionSettings(cache=cache)) as session:
            with write_locked(path), caplog.at_level(logging.WARNING, "typevet_async.read_cache"):
                # The read has arrived: the judgment does not wait for the store (SQLite's
                # 30 s busy timeout held it past this deadline).
                judgment = await session.judge("locked out", {"q": noul()}, timeout=4)
                assert judgment.diagnostics["q"].cache == "miss"
                await cache.flush()  # the store behind it: refused by the lock, counted
            assert cache.failed_stores == 1
            (record,) = caplog.records
            assert "OperationalError" in record.getMessage()
            assert "database is locked" not in record.getMessage()  # its type, not its text
            again = await session.judge("locked out", {"q": noul()}, timeout=4)
            assert again.diagnostics["q"].cache == "miss"  # the store was dropped, not kept
            await cache.flush()
            third = await session.judge("locked out", {"q": noul()}, timeout=4)
        assert third.diagnostics["q"].cache == "hit"  # stored once the lock was gone
        assert (await cache.entries(), cache.failed_stores) == (1, 1)
    assert backend.reads == ["q", "q"]


async def test_hits_and_close_never_wait_for_another_process_s_lock(tmp_path: Path) -> None:
    path = tmp_path / "reads.db"
    cache = tv.SqliteReadCache(path)
    await cache.open()
    await cache.put("k", b"v")
    assert await cache.entries() == 1  # written (a count waits for this object's writes)
    with write_locked(path):
        # Every TOUCH_BATCH-th hit writes the batch's last_used, behind the hits (it waited
        # SQLite's busy timeout, 30 s, in the hit that filled the batch).
        with anyio.fail_after(10):
            for _ in range(TOUCH_BATCH + 10):
                assert await cache.get("k") == b"v"
            await cache.put("k2", b"v2")
            assert await cache.get("k2") == b"v2"  # not yet written: found where it waits
            await cache.aclose()  # bounded: the pending writes fail after a short wait
    assert cache.failed_stores == 1
    async with tv.SqliteReadCache(path) as again:
        assert (await again.get("k"), await again.get("k2")) == (b"v", None)


async def test_stores_waiting_for_a_locked_file_are_bounded_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "reads.db"
    async with tv.SqliteReadCache(path) as cache:
        with write_locked(path):
            for n in range(MAX_UNWRITTEN + 10):  # no await suspends: none is written yet
                await cache.put(f"k{n}", b"v")
            assert cache.failed_stores == 10  # refused at once, past the bound
            assert await cache.get(f"k{MAX_UNWRITTEN - 1}") == b"v"  # kept, still unwritten
            assert await cache.get(f"k{MAX_UNWRITTEN}") is None
            await cache.flush()  # the batch the lock refused: dropped and counted
            assert cache.failed_stores == MAX_UNWRITTEN + 10
        assert await cache.entries() == 0


async def test_eval_says_how_many_reads_its_cache_failed_to_store(tmp_path: Path) -> None:
    from typevet_async._apps.cli.evaluate import _reads_line

    cache = tv.SqliteReadCache(tmp_path / "reads.db")
    usage = tv.Usage(100, 0, 4, 2)
    assert _reads_line(usage, cache) == (
        f"reads sent: 4; answered by the read cache {cache.path}: 2"
    )
    cache.failed_stores = 3
    assert _reads_line(usage, cache).endswith("; reads it failed to store: 3 (see the log)")
