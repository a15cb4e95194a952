"""`SqliteReadCache`: a session's read cache in one SQLite file, kept across runs and shared
between processes.

Why SQLite: it is in Python's standard library (no server to run or secure), one file a run can
keep beside its results, transactional (a killed process never leaves half a value), and in
WAL mode several processes read while one writes. Why aiosqlite: every query runs on a
connection's own thread, so the event loop never waits for the disk or for another process's
lock.

**Nothing a judgment awaits waits for a lock.** Another process may hold the file's write lock
for as long as it likes (a long transaction, a stuck writer). So the store writes behind: `put`
keeps the value in memory (where `get` finds it) and returns; one background task writes what
is waiting in one transaction on a connection of its own, waiting at most `WRITE_BUSY_TIMEOUT`
for the lock. A batch the file refuses (locked past that wait, a full disk) is dropped, logged
(``typevet_async.read_cache``, WARNING, the error's type only) and counted
(`SqliteReadCache.failed_stores`, the ``typevet.cache.store_failures`` metric): the read stays
answered, only uncached. Lookups run on a second connection, so they never queue behind a
write waiting for the lock (in WAL mode a writer does not block readers). `aclose` gives the
writes waiting at most `CLOSE_TIMEOUT`.

**A cache left open never holds the process.** A script may end, or raise, between `open` and
`aclose`. When its event loop ends (``asyncio.run`` cancels every task as it returns or
raises), a task the cache keeps while open closes it as `aclose` would: the writes waiting are
written (within `CLOSE_TIMEOUT`) and the file closed. aiosqlite's threads are made daemons, so
a loop that ends without cancelling its tasks (``loop.run_until_complete`` and exit) does not
hold the process either: what was written (`flush`) is in the file, the stores not yet written
are lost (each only uncached). A batch cancelled halfway is rolled back and waits again.

One table, ``reads (key TEXT PRIMARY KEY, value BLOB, last_used INTEGER)``; a file whose
``reads`` is not that (a view, a virtual table, other columns, another primary key, a unique
index ``key`` does not decide: another program's) is refused at `open`. A hit's
``last_used`` is written in batches (`TOUCH_BATCH` hits, or with the next write, or at
`SqliteReadCache.aclose`), not once per hit. A batch of stores is written with each its own
``last_used`` (when it was stored, or last found); with the first batch, and then whenever the
stores since the last count may have filled the room it left, the rows are counted in the
batch's transaction and past ``max_entries`` the least recently used go in one ``DELETE``, so
the table stays within ``max_entries`` (each process counts its own stores: several writing at
once may pass it, until their next counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio

from typevet_async import _telemetry as telemetry
from typevet_async._concurrency.resources import AsyncResource
from typevet_async._errors import ConfigurationError, SessionStateError

if TYPE_CHECKING:
    import aiosqlite

__all__ = [
    "CLOSE_TIMEOUT",
    "DEFAULT_SQLITE_ENTRIES",
    "MAX_UNWRITTEN",
    "TOUCH_BATCH",
    "WRITE_BUSY_TIMEOUT",
    "SqliteReadCache",
]

log = logging.getLogger("typevet_async.read_cache")

#: A `SqliteReadCache`'s default bound: a read is about 1 KB, so about 100 MB on disk.
DEFAULT_SQLITE_ENTRIES: Final = 100_000
#: Hits whose ``last_used`` is kept in memory before one batch writes them.
TOUCH_BATCH: Final = 256
#: Seconds a write (in the background) waits for another process's write lock before its
#: batch is dropped. Short: a lock held longer is someone else's long transaction, and the
#: values wait in memory meanwhile.
WRITE_BUSY_TIMEOUT: Final = 1.0
#: Seconds a lookup waits for a lock (in WAL mode only a checkpoint or a recovery takes one
#: that blocks readers); past it the lookup is a miss.
READ_BUSY_TIMEOUT: Final = 1.0
#: Values waiting to be written, at most (about 1 KB each); a store past it is dropped and
#: counted: the file is refusing writes faster than they come.
MAX_UNWRITTEN: Final = 4096
#: Seconds `SqliteReadCache.aclose` gives the writes still waiting.
CLOSE_TIMEOUT: Final = 5.0

_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS reads "
    "(key TEXT PRIMARY KEY, value BLOB NOT NULL, last_used INTEGER NOT NULL)"
)
_INDEX: Final = "CREATE INDEX IF NOT EXISTS reads_last_used ON reads (last_used)"
#: The table's columns: name, declared type, place in the primary key (``key`` alone).
_COLUMNS: Final = [("key", "TEXT", 1), ("value", "BLOB", 0), ("last_used", "INTEGER", 0)]
_SHAPE: Final = "key TEXT PRIMARY KEY, value BLOB, last_used INTEGER"
_KIND: Final = (
    "SELECT type, sql FROM sqlite_master "
    "WHERE name = 'reads' COLLATE NOCASE AND type IN ('table', 'view')"
)
_UNIQUE: Final = (
    "SELECT list.name, info.name FROM pragma_index_list('reads') AS list "
    'JOIN pragma_index_info(list.name) AS info WHERE list."unique"'
)
_GET: Final = "SELECT value FROM reads WHERE key = ?"
_PUT: Final = (
    "INSERT INTO reads (key, value, last_used) VALUES (?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value, last_used = excluded.last_used"
)
_TOUCH: Final = "UPDATE reads SET last_used = ? WHERE key = ?"
_EVICT: Final = "DELETE FROM reads WHERE key IN (SELECT key FROM reads ORDER BY last_used LIMIT ?)"


def _openable(path: Path) -> None:
    """:raises sqlite3.Error: SQLite cannot open (or create) the file ``path``."""
    import sqlite3

    sqlite3.connect(path, timeout=READ_BUSY_TIMEOUT).close()


def _table_problem(
    kind: str,
    sql: str | None,
    columns: Sequence[Sequence[Any]],
    unique: Sequence[Sequence[Any]],
) -> str | None:
    """Why a file's ``reads`` cannot be this cache's table, or None. The stores' upsert needs a
    table (not a view or virtual table) of these columns and types, ``key`` alone its primary
    key (its conflict target), and no unique index that ``key`` does not decide (two reads'
    rows would collide on it).

    :param kind: its ``sqlite_master`` type; ``sql``: its statement.
    :param columns: its ``PRAGMA table_info`` rows.
    :param unique: (index name, column name) of each unique index's columns.
    """
    if kind != "table" or (sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
        return f"'reads' is a {'virtual table' if kind == 'table' else kind}, not a table"
    shape = [(str(row[1]).lower(), str(row[2]).upper(), int(row[5])) for row in columns]
    if [column[:2] for column in shape] != [column[:2] for column in _COLUMNS]:
        found = ", ".join(f"{name} {declared}".strip() for name, declared, _ in shape)
        return f"its table 'reads' has the columns ({found}), not ({_SHAPE})"
    if shape != _COLUMNS:
        keys = [name for name, _, place in sorted(shape, key=lambda column: column[2]) if place]
        return (
            f"its table 'reads' has the primary key ({', '.join(keys)}), not (key) "
            "alone: stores could not replace a read"
        )
    indexes: dict[str, list[str]] = {}
    for index, column in unique:
        indexes.setdefault(str(index), []).append(str(column).lower())
    for index, names in indexes.items():
        if "key" not in names:
            return (
                f"its table 'reads' has a unique index {index!r} on ({', '.join(names)}), "
                "which two reads could share"
            )
    return None


def _daemonic(connection: aiosqlite.Connection) -> aiosqlite.Connection:
    """``connection`` (not started), its thread made a daemon, so that a process that ends
    with the connection open is not held by the thread waiting for queries. aiosqlite's
    ``Connection`` is that thread up to 0.21 and holds it (``_thread``) from 0.22."""
    thread = connection if isinstance(connection, threading.Thread) else None
    thread = thread or getattr(connection, "_thread", None)
    if isinstance(thread, threading.Thread) and not thread.is_alive():
        thread.daemon = True
    return connection


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
    return value


class SqliteReadCache(AsyncResource):
    """A read cache in the SQLite file ``path`` (created if missing), bounded to
    ``max_entries`` reads (least recently used dropped first), kept across runs.

    Open it before use and close it after (``async with tv.SqliteReadCache(path) as cache``,
    or `open` and `aclose`): its owner does, not the sessions that use it. One object may serve
    several sessions of one event loop at once; several processes may use one file at once.
    Stores are written behind (module docstring): a judgment never waits for the file's lock.
    Left open when its event loop ends, it closes itself and never holds the process (module
    docstring).

    :raises ConfigurationError: ``max_entries`` is not a positive integer.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_entries: int = DEFAULT_SQLITE_ENTRIES
    ) -> None:
        self.path = Path(path)
        self.max_entries = _positive("max_entries", max_entries)
        #: Stores the file refused (locked past `WRITE_BUSY_TIMEOUT`, a full disk, past
        #: `MAX_UNWRITTEN`): each logged, none waited on by a judgment.
        self.failed_stores = 0
        #: Rows the stores may add before the next count (none: the first store counts, for
        #: a file kept full).
        self._room = 0
        self._reader: aiosqlite.Connection | None = None
        self._writer: aiosqlite.Connection | None = None
        self._state: Literal["unopened", "open", "closed"] = "unopened"
        #: Stored values not yet written (those of the batch being written included), which
        #: lookups find here, with when each was stored.
        self._unwritten: dict[str, tuple[bytes, int]] = {}
        #: Keys read since the last batch, with when.
        self._touched: dict[str, int] = {}
        #: The task writing behind, while there is something to write.
        self._writing: asyncio.Task[None] | None = None
        #: While open: the task that closes the cache when the loop ends before `aclose`.
        self._keeper: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"SqliteReadCache({str(self.path)!r}, max_entries={self.max_entries}, {self._state})"

    async def open(self) -> None:
        """Open (or create) the file, in WAL mode, and its table. Safe to call twice.

        :raises ConfigurationError: the file cannot be opened or created, or is not a
            database with this table (naming the path and why).
        :raises SessionStateError: the cache was closed.
        """
        if self._state == "closed":
            raise SessionStateError("cannot reopen a closed read cache")
        if self._state == "open":
            return
        import sqlite3  # the first store opened loads them (importing the SDK does not)

        import aiosqlite

        opened: list[aiosqlite.Connection] = []
        try:
            # A file that cannot be opened is found on a worker thread first: aiosqlite stops
            # its own thread on that failure without waiting for it, after the loop may be gone.
            await anyio.to_thread.run_sync(_openable, self.path)
            for busy in (READ_BUSY_TIMEOUT, WRITE_BUSY_TIMEOUT):
                connecting = aiosqlite.connect(self.path, timeout=busy, isolation_level=None)
                opened.append(await _daemonic(connecting))
            await self._prepare(opened[1])
        except (sqlite3.Error, OSError, ConfigurationError) as error:
            for connection in opened:
                await connection.close()
            if isinstance(error, ConfigurationError):
                raise
            raise self._unusable(error) from None
        (self._reader, self._writer), self._state = opened, "open"
        self._keeper = asyncio.get_running_loop().create_task(self._close_with_the_loop())

    def _unusable(self, error: BaseException) -> ConfigurationError:
        return ConfigurationError(f"the read cache {str(self.path)!r} cannot be opened: {error}")

    async def _prepare(self, connection: aiosqlite.Connection) -> None:
        ((mode,),) = await connection.execute_fetchall("PRAGMA journal_mode = WAL")
        if str(mode).lower() != "wal":
            raise ConfigurationError(
                f"the read cache {str(self.path)!r} cannot be opened: SQLite keeps it in "
                f"{mode!r} mode, not WAL (a file system without shared memory?)"
            )
        await connection.execute("PRAGMA synchronous = NORMAL")
        await connection.execute(_TABLE)
        ((kind, sql),) = await connection.execute_fetchall(_KIND)
        columns = await connection.execute_fetchall("PRAGMA table_info(reads)")
        unique = await connection.execute_fetchall(_UNIQUE)
        problem = _table_problem(str(kind), sql, list(columns), list(unique))
        if problem is not None:
            raise ConfigurationError(
                f"the read cache {str(self.path)!r} cannot be opened: {problem}; it is not a "
                "read cache's (another program's database?)"
            )
        await connection.execute(_INDEX)

    async def aclose(self) -> None:
        """Write what waits (the stores, the pending ``last_used`` batch) within
        `CLOSE_TIMEOUT`, then close the file; what is still unwritten then is dropped and
        counted. Safe to call twice."""
        if self._state != "open":
            self._state = "closed"
            return
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()  # it sees the cache closing and leaves it to this call
        await self._close()
        if keeper is not None:
            await asyncio.wait({keeper})  # no task of the cache outlives its close

    async def _close_with_the_loop(self) -> None:
        """Wait to be cancelled: by `aclose`, or by the end of the loop (``asyncio.run``
        cancels every task as it returns or raises) with the cache still open, which then
        closes as `aclose` would."""
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            if self._state == "open":
                await self._close()
            raise

    async def _close(self) -> None:
        self._state = "closed"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_TIMEOUT
        try:
            # Until nothing waits: a batch cancelled with the loop's tasks waits again.
            while True:
                self._write_behind()  # the touches a batch had not taken yet
                writing = self._writing
                if writing is None or writing.done():
                    break
                done, _ = await asyncio.wait({writing}, timeout=max(0, deadline - loop.time()))
                if not done:
                    writing.cancel()  # its statement ends within WRITE_BUSY_TIMEOUT
                    await asyncio.wait({writing})  # its batch rolled back, waiting again
                    break
            self._failed(len(self._unwritten), "CloseTimeout")
        finally:
            reader, writer, self._reader, self._writer = self._reader, self._writer, None, None
            for connection in (reader, writer):
                if connection is not None:
                    await connection.close()

    def _open(self) -> aiosqlite.Connection:
        """The lookups' connection.

        :raises SessionStateError: the cache is not open.
        """
        if self._reader is None or self._state != "open":
            if self._state == "closed":
                raise SessionStateError("the read cache is closed")
            raise SessionStateError(
                "open the read cache before a session uses it: "
                "async with tv.SqliteReadCache(path) as cache"
            )
        return self._reader

    async def get(self, key: str) -> bytes | None:
        """:raises SessionStateError: the cache is not open."""
        reader = self._open()
        waiting = self._unwritten.get(key)
        if waiting is not None:
            value = waiting[0]
        else:
            rows = list(await reader.execute_fetchall(_GET, (key,)))
            if not rows or not isinstance(rows[0][0], bytes):
                return None
            value = rows[0][0]
        self._touched[key] = time.time_ns()
        if len(self._touched) >= TOUCH_BATCH:
            self._write_behind()
        return value

    async def put(self, key: str, value: bytes) -> None:
        """Keep ``value`` to be written behind (module docstring); returns at once.

        :raises SessionStateError: the cache is not open.
        """
        self._open()
        if key not in self._unwritten and len(self._unwritten) >= MAX_UNWRITTEN:
            self._failed(1, "BacklogFull")
            return
        self._unwritten[key] = (value, time.time_ns())
        self._write_behind()

    async def flush(self) -> None:
        """Wait until the stores made so far are written or refused (counted in
        `failed_stores`); each batch waits at most `WRITE_BUSY_TIMEOUT` for the lock.

        :raises SessionStateError: the cache is not open.
        """
        self._open()
        while (writing := self._writing) is not None and not writing.done():
            await asyncio.wait({writing})  # neither cancels it nor takes its cancellation

    def _write_behind(self) -> None:
        """Start the writing task, unless it runs (it takes what is waiting when it is done)."""
        idle = self._writing is None or self._writing.done()
        if idle and (self._unwritten or self._touched):
            self._writing = asyncio.get_running_loop().create_task(self._write_all())

    async def _write_all(self) -> None:
        """Write what waits, batch after batch, until nothing does."""
        while self._writer is not None and (self._unwritten or self._touched):
            stores, touched, self._touched = dict(self._unwritten), self._touched, {}
            rows = [
                (key, value, max(stored, touched.pop(key, 0)))
                for key, (value, stored) in stores.items()
            ]
            try:
                await self._write(self._writer, rows, touched)
            except asyncio.CancelledError:
                # Rolled back: the batch waits again, for the close that cancelled it.
                self._touched = touched | self._touched
                raise
            except Exception as error:  # a store never raises into a judgment (sqlite3.Error...)
                self._failed(len(stores), type(error).__name__)
            for key, entry in stores.items():  # written or dropped: no longer waiting
                if self._unwritten.get(key) is entry:
                    del self._unwritten[key]

    async def _write(
        self,
        writer: aiosqlite.Connection,
        rows: list[tuple[str, bytes, int]],
        touched: dict[str, int],
    ) -> None:
        """One transaction: the hits' ``last_used``, the stores (each ``last_used`` when it
        was stored or last found), then, when they may have filled the room the last count
        left, the count and eviction."""
        try:
            await writer.execute("BEGIN IMMEDIATE")  # the lock first: one wait for the batch
            if touched:
                await writer.executemany(_TOUCH, [(when, key) for key, when in touched.items()])
            await writer.executemany(_PUT, rows)
            room = self._room - len(rows)
            if room < 0:
                room = await self._evict(writer)
            await writer.execute("COMMIT")
        except BaseException:
            # Cancelled, a statement may still run on the connection's thread (a transaction
            # begun, not ended): the rollback is queued behind it. None begun: a no-op.
            with contextlib.suppress(Exception):
                await writer.execute("ROLLBACK")
            raise
        self._room = room

    async def _evict(self, writer: aiosqlite.Connection) -> int:
        """Past ``max_entries``, the least recently used rows go. The room left: the rows
        the stores may add before the next count."""
        ((count,),) = await writer.execute_fetchall("SELECT count(*) FROM reads")
        if count > self.max_entries:
            await writer.execute(_EVICT, (count - self.max_entries,))
        return int(self.max_entries - min(count, self.max_entries))

    def _failed(self, stores: int, kind: str) -> None:
        if stores:
            self.failed_stores += stores
            telemetry.cache_store_failed(stores, kind)
            log.warning(
                "the read cache %r failed to store %d read(s): %s",
                self,
                stores,
                kind,
                extra={"error_type": kind, "reads": stores},
            )

    async def entries(self) -> int:
        """The rows the file holds now (all processes'), once this object's stores so far
        are written (`flush`).

        :raises SessionStateError: the cache is not open.
        """
        await self.flush()
        ((count,),) = await self._open().execute_fetchall("SELECT count(*) FROM reads")
        return int(count)
