"""The read cache: a session's validated reads kept by what decided them, and reads in flight
made once.

``Session.llama_cpp(url, cache=tv.MemoryReadCache())`` (or a `SqliteReadCache`, or any
`ReadCache`): each scoring request's read is looked up by its key (`read_key`: the backend's
read identity, the probe's digest and every byte of the request) before it is sent, and a read
the server returned, validated, is stored (`encode_read`). What is stored is the read, not the
answer, so rotations, calibration maps and thresholds applied later work on it as on a fresh
read; a stored value is decoded strictly against the request (`decode_read`), and one that
is corrupt, foreign or for another request is a miss, read again and overwritten. Errors are
never stored.

**Single flight.** Identical reads in flight at once (the same key, the same cache object, one
event loop) are sent once: the first is the leader, the others wait for its read (and count it
as a hit: nothing was sent for them). If the leader is cancelled, one waiter takes over; if it
fails with an SDK error, each waiter raises its own copy of it.

**Slots.** A hit, and a wait for a read in flight, take no slot of the session; only the
leader's read does, as an uncached read would (`typevet_async._session.judging._score`). A two-token
code question's reads are one entry (the first read with its reads after each first token):
they hold one slot together where the server reuses prefixes, and a sub-read that waited for
another question's flight while holding it could wait for a slot it holds itself.

**Retry policies.** A flight is shared only by reads made with the same retry policy (the
judgment's ``max_retries``): a waiter that would have retried a 503 never takes the error of a
leader that would not, and one that would not never waits for a leader's retries.

**A store that fails** (a full disk, a database locked past its timeout, a custom store's
network) is logged (``typevet_async.read_cache``, WARNING, the error's type only), counted
(``typevet.cache.store_failures``) and the read goes on uncached: the cache can make a
judgment cheaper, never fail it. Nor may a store make one wait: the leader awaits ``put``
before its judgment goes on, so a store whose writes can wait (on a lock, a network) writes
behind, as `SqliteReadCache` does. An SDK error of the store (a cache not opened) is
raised.

The stores (`MemoryReadCache`, `SqliteReadCache`) belong to whoever builds them: a session
uses the cache it is given and never closes it (one cache may serve several sessions, and
outlive them).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

import anyio
import attrs

from typevet_async import _telemetry as telemetry
from typevet_async._backends.base import Backend, ReadIdentifying
from typevet_async._concurrency.resources import AsyncResource
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.probe import Probe
from typevet_async._core.reading.read_keys import probe_digest, read_key
from typevet_async._core.reading.read_values import decode_read, encode_read
from typevet_async._core.reading.readings import CandidateRead
from typevet_async._errors import ConfigurationError, TypevetError
from typevet_async._session.read_cache_sqlite import DEFAULT_SQLITE_ENTRIES, SqliteReadCache
from typevet_async._version import __version__

__all__ = [
    "DEFAULT_MEMORY_ENTRIES",
    "DEFAULT_SQLITE_ENTRIES",
    "CachedReads",
    "MemoryReadCache",
    "ReadCache",
    "SqliteReadCache",
]

log = logging.getLogger("typevet_async.read_cache")

E = TypeVar("E", bound=BaseException)

#: A `MemoryReadCache`'s default bound: a read is about 1 KB (its prompt and candidates), so
#: about 10 MB.
DEFAULT_MEMORY_ENTRIES: Final = 10_000


@runtime_checkable
class ReadCache(Protocol):
    """Where a session keeps its validated reads: opaque values by key. The session encodes
    and checks the values itself (`typevet_async._session.read_cache`), so a store only keeps bytes:
    a dict, a file, a shared service. Each method is awaited on the session's event loop and
    must not block it.

    The SDK's stores are `MemoryReadCache` (bounded, in the process) and `SqliteReadCache`
    (bounded, on disk, shared between processes).
    """

    async def get(self, key: str) -> bytes | None:
        """The value stored under ``key`` (a hex SHA-256), or None."""
        ...

    async def put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, replacing what was there. Return promptly: a
        judgment waits for it, so a write that may wait (a lock, a network) is made behind it,
        and a failed one is the store's to log."""
        ...


def _max_entries(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"max_entries must be a positive integer, got {value!r}")
    return value


class MemoryReadCache(AsyncResource):
    """A read cache in this process's memory, bounded: past ``max_entries`` the least recently
    used read is dropped. Nothing to open or close (``async with`` works, for symmetry with
    `SqliteReadCache`); gone with the process.

    :raises ConfigurationError: ``max_entries`` is not a positive integer.
    """

    def __init__(self, max_entries: int = DEFAULT_MEMORY_ENTRIES) -> None:
        self.max_entries = _max_entries(max_entries)
        self._entries: collections.OrderedDict[str, bytes] = collections.OrderedDict()

    def __repr__(self) -> str:
        return f"MemoryReadCache({len(self._entries)} of {self.max_entries} entries)"

    async def entries(self) -> int:
        """The reads it holds now."""
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    async def put(self, key: str, value: bytes) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def aclose(self) -> None:
        """Nothing to release (the entries stay, for a cache used again)."""


def check_cache(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """`SessionSettings.cache`'s rule: a `ReadCache` (``get`` and ``put``) or None."""
    if value is not None and not isinstance(value, ReadCache):
        raise ConfigurationError(
            f"{attribute.name} must be a read cache (tv.MemoryReadCache, tv.SqliteReadCache or "
            f"any tv.ReadCache: async get and put) or None, got {type(value).__name__}"
        )


class _Flight:
    """One read in flight: its leader's read, or its error, once done (neither: the leader
    was cancelled, and a waiter takes over)."""

    __slots__ = ("done", "error", "loop", "read")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.done = anyio.Event()
        self.read: CandidateRead | None = None
        self.error: TypevetError | None = None


#: (the cache object's id, key, retry policy) -> the read in flight. An entry lives only
#: while its leader reads (and stores), so the cache object is alive and its id not reused.
_FLIGHTS: dict[tuple[int, str, Hashable], _Flight] = {}


def copy_error(error: E) -> E:
    """A copy of ``error`` of its own type, fields, notes, cause and traceback, for one waiter
    to raise (and name its own question on), as the error of its own read. Built field by
    field: the SDK's errors take keyword arguments that ``copy.copy`` would not pass."""
    copied = type(error).__new__(type(error))
    copied.args = error.args
    for name, value in vars(error).items():
        object.__setattr__(copied, name, list(value) if name == "__notes__" else value)
    copied.__cause__, copied.__context__ = error.__cause__, error.__context__
    copied.__suppress_context__ = error.__suppress_context__
    return copied.with_traceback(error.__traceback__)


def _shared(read: CandidateRead) -> CandidateRead:
    """A read another request of the flight made, as this one's: a hit that cost nothing."""
    if read.cache == "hit":
        return read
    return attrs.evolve(
        read,
        reads=0,
        prompt_tokens=0,
        cached_tokens=0,
        attempts=0,
        cache="hit",
        after=tuple(_shared(after) for after in read.after),
    )


@attrs.frozen
class CachedReads:
    """A session's reads through its cache, for one backend and probe (`bind`)."""

    cache: ReadCache
    #: The backend's read identity and the SDK's version.
    identity: str
    #: The probe's digest (`probe_digest`).
    probe: str

    @classmethod
    def bind(cls, cache: ReadCache | None, backend: Backend, probe: Probe) -> CachedReads | None:
        """The reads of ``backend`` under ``probe`` through ``cache``; None when there is no
        cache or the backend's reads may not be cached (no `ReadIdentifying`, or no identity)."""
        if cache is None or not isinstance(backend, ReadIdentifying):
            return None
        identity = backend.read_identity()
        if identity is None:
            return None
        return cls(cache, f"{identity}\nsdk {__version__}", probe_digest(probe))

    async def read(
        self,
        request: ScoringRequest,
        fetch: Callable[[], Awaitable[CandidateRead]],
        *,
        policy: Hashable = None,
    ) -> CandidateRead:
        """``request``'s read: stored, shared with the same read in flight made under the same
        ``policy`` (what else decides ``fetch``'s outcome: its retry policy), or ``fetch``ed
        (then stored). Its ``cache`` says which (module docstring).

        :raises TypevetError: ``fetch``'s error (a waiter: its own copy of the leader's), or
            the store's own SDK error.
        """
        key = read_key(self.identity, self.probe, request)
        token = (id(self.cache), key, policy)
        loop = asyncio.get_running_loop()
        while (flight := _FLIGHTS.get(token)) is not None and flight.loop is loop:
            await flight.done.wait()
            if flight.read is not None:
                return _shared(flight.read)
            if flight.error is not None:
                raise copy_error(flight.error)
            # The leader was cancelled: the first waiter to get here leads.
        flight = _FLIGHTS[token] = _Flight(loop)
        try:
            return await self._lead(flight, key, request, fetch)
        except TypevetError as error:
            snapshot = copy_error(error)
            snapshot.question_id = None  # each waiter's own read names its own question
            flight.error = snapshot
            raise
        finally:
            if _FLIGHTS.get(token) is flight:
                del _FLIGHTS[token]
            flight.done.set()

    async def _lead(
        self,
        flight: _Flight,
        key: str,
        request: ScoringRequest,
        fetch: Callable[[], Awaitable[CandidateRead]],
    ) -> CandidateRead:
        stored = await self._lookup(key, request)
        if stored is not None:
            flight.read = stored
            return stored
        read = attrs.evolve(await fetch(), cache="miss")
        flight.read = read
        flight.done.set()  # the waiters go on; newcomers find the flight done until stored
        await self._store(key, read, request)
        return read

    async def _lookup(self, key: str, request: ScoringRequest) -> CandidateRead | None:
        try:
            value = await self.cache.get(key)
        except TypevetError:
            raise
        except Exception as error:
            kind = type(error).__name__  # its type only: a store's message may quote a value
            log.warning(
                "the read cache %r failed to get a read (%s); reading it",
                self.cache,
                kind,
                extra={"error_type": kind},
            )
            return None
        # A value this request may not use (corrupt, foreign, another request's) is a miss:
        # the read made now replaces it.
        return None if value is None else decode_read(value, request)

    async def _store(self, key: str, read: CandidateRead, request: ScoringRequest) -> None:
        """Store ``read``, once it is a value this request would take back: a read the
        backend returned but the answer's checks refuse (its interpretation raises) is not
        stored, nor one past `MAX_VALUE_BYTES`."""
        value = encode_read(read)
        if decode_read(value, request) is None:
            return
        try:
            await self.cache.put(key, value)
        except TypevetError:
            raise
        except Exception as error:
            kind = type(error).__name__
            telemetry.cache_store_failed(1, kind)
            log.warning(
                "the read cache %r failed to store a read: %s",
                self.cache,
                kind,
                extra={"error_type": kind, "reads": 1},
            )
