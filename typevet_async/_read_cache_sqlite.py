"""`SqliteReadCache`: a session's read cache in one SQLite file, kept across runs and shared
between processes.

Why SQLite: it is in Python's standard library (no server to run or secure), one file a run can
keep beside its results, transactional (a killed process never leaves half a value), and in
WAL mode several processes read while one writes. Why aiosqlite: every query runs on the
connection's own thread, so the event loop never waits for the disk or for another process's
lock (``busy_timeout``).

One table, ``reads (key TEXT PRIMARY KEY, value BLOB, last_used INTEGER)``. A hit's
``last_used`` is written in batches (`TOUCH_BATCH` hits, or with the next store, or at
`SqliteReadCache.aclose`), not once per hit. Before the first store and then every step of
stores (a sixteenth of ``max_entries``) the rows are counted, and past ``max_entries`` minus
that step the least recently used go in one ``DELETE``, so the table stays within
``max_entries`` (each process counts its own stores: several writing at once may pass it by a
step each, until the next count).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio

from typevet_async._errors import ConfigurationError, SessionStateError
from typevet_async._resources import AsyncResource

if TYPE_CHECKING:
    import aiosqlite

__all__ = ["DEFAULT_SQLITE_ENTRIES", "TOUCH_BATCH", "SqliteReadCache"]

#: A `SqliteReadCache`'s default bound: a read is about 1 KB, so about 100 MB on disk.
DEFAULT_SQLITE_ENTRIES: Final = 100_000
#: Hits whose ``last_used`` is kept in memory before one batch writes them.
TOUCH_BATCH: Final = 256
#: Seconds a query waits for another process's write lock before it fails.
BUSY_TIMEOUT: Final = 30.0

_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS reads "
    "(key TEXT PRIMARY KEY, value BLOB NOT NULL, last_used INTEGER NOT NULL)"
)
_INDEX: Final = "CREATE INDEX IF NOT EXISTS reads_last_used ON reads (last_used)"
_COLUMNS: Final = [("key", "TEXT"), ("value", "BLOB"), ("last_used", "INTEGER")]
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

    sqlite3.connect(path, timeout=BUSY_TIMEOUT).close()


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

    :raises ConfigurationError: ``max_entries`` is not a positive integer.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_entries: int = DEFAULT_SQLITE_ENTRIES
    ) -> None:
        self.path = Path(path)
        self.max_entries = _positive("max_entries", max_entries)
        #: Stores between two counts of the rows (and how far below the bound each leaves it).
        self._step = max(1, self.max_entries // 16)
        self._stores = self._step - 1  # the first store counts the rows (a file kept full)
        self._connection: aiosqlite.Connection | None = None
        self._state: Literal["unopened", "open", "closed"] = "unopened"
        #: Keys read since the last batch, with when.
        self._touched: dict[str, int] = {}

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

        try:
            # A file that cannot be opened is found on a worker thread first: aiosqlite stops
            # its own thread on that failure without waiting for it, after the loop may be gone.
            await anyio.to_thread.run_sync(_openable, self.path)
            connection = await aiosqlite.connect(
                self.path, timeout=BUSY_TIMEOUT, isolation_level=None
            )
        except (sqlite3.Error, OSError) as error:
            raise self._unusable(error) from None
        try:
            await self._prepare(connection)
        except (sqlite3.Error, OSError, ConfigurationError) as error:
            await connection.close()
            if isinstance(error, ConfigurationError):
                raise
            raise self._unusable(error) from None
        self._connection, self._state = connection, "open"

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
        columns = await connection.execute_fetchall("PRAGMA table_info(reads)")
        if [(row[1], str(row[2]).upper()) for row in columns] != _COLUMNS:
            raise ConfigurationError(
                f"the read cache {str(self.path)!r} cannot be opened: its table 'reads' is "
                "not a read cache's (another program's database?)"
            )
        await connection.execute(_INDEX)

    async def aclose(self) -> None:
        """Write the pending ``last_used`` batch and close the file. Safe to call twice."""
        connection, self._connection = self._connection, None
        self._state = "closed"
        if connection is None:
            return
        try:
            await self._touch(connection)
        finally:
            await connection.close()

    def _open(self) -> aiosqlite.Connection:
        if self._connection is None:
            if self._state == "closed":
                raise SessionStateError("the read cache is closed")
            raise SessionStateError(
                "open the read cache before a session uses it: "
                "async with tv.SqliteReadCache(path) as cache"
            )
        return self._connection

    async def get(self, key: str) -> bytes | None:
        """:raises SessionStateError: the cache is not open."""
        connection = self._open()
        rows = list(await connection.execute_fetchall(_GET, (key,)))
        if not rows:
            return None
        self._touched[key] = time.time_ns()
        if len(self._touched) >= TOUCH_BATCH:
            await self._touch(connection)
        value = rows[0][0]
        return value if isinstance(value, bytes) else None

    async def put(self, key: str, value: bytes) -> None:
        """:raises SessionStateError: the cache is not open."""
        connection = self._open()
        await self._touch(connection)  # the hits so far count before any eviction
        self._stores += 1
        if self._stores >= self._step:
            self._stores = 0
            await self._evict(connection)
        await connection.execute(_PUT, (key, value, time.time_ns()))

    async def _touch(self, connection: aiosqlite.Connection) -> None:
        touched, self._touched = self._touched, {}
        if touched:
            await connection.executemany(_TOUCH, [(when, key) for key, when in touched.items()])

    async def _evict(self, connection: aiosqlite.Connection) -> None:
        """Before every step-th store (the first included): past ``max_entries`` minus one
        step, the least recently used rows go, leaving room for the step's stores until the
        next count."""
        ((count,),) = await connection.execute_fetchall("SELECT count(*) FROM reads")
        keep = self.max_entries - self._step
        if count > keep:
            await connection.execute(_EVICT, (count - keep,))

    async def entries(self) -> int:
        """The rows the file holds now (all processes').

        :raises SessionStateError: the cache is not open.
        """
        ((count,),) = await self._open().execute_fetchall("SELECT count(*) FROM reads")
        return int(count)
