"""JSONL records, for every command that reads or writes them (batch, eval, MCP's stdin):
lines of a pipe read by a daemon thread, the byte-order mark, error lines, and resuming an
output file a kill may have cut short.

One owner for each rule: a last line that does not parse was cut short by a kill (dropped,
its record done again), any other bad line is refused; a complete last line without its line
break gets one before anything is appended; an output that exists and is not empty is only
ever continued, never overwritten.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import orjson

from typevet_async._core.wires.jsonvalues import parse_json
from typevet_async._errors import InvalidInputError

__all__ = [
    "BOM",
    "PipeLines",
    "Resumable",
    "dumps",
    "error_fields",
    "error_line",
    "json_error",
    "open_to_continue",
    "read_resumable",
    "refuse_overwrite",
]

#: A byte-order mark some editors write at the start of a UTF-8 file: not part of line 1.
BOM: Final = b"\xef\xbb\xbf"


def dumps(value: Any) -> bytes:
    """One JSON line's bytes (no line break)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits: the stdlib writes it exactly
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def json_error(error: ValueError) -> str:
    """Why a line is not JSON, with its column."""
    if isinstance(error, json.JSONDecodeError):  # orjson's too
        return f"{error.msg} at column {error.colno}"
    return str(error)


def error_fields(error: BaseException) -> dict[str, str]:
    """The ``error`` member of an error line: the error's type name and message."""
    return {"type": type(error).__name__, "message": str(error)}


def error_line(record_id: Any, error_type: str, message: str) -> bytes:
    """``{"id": ..., "error": {"type": ..., "message": ...}}`` and its line break."""
    return dumps({"id": record_id, "error": {"type": error_type, "message": message}}) + b"\n"


# -- resuming an output ----------------------------------------------------------------------


@attrs.define
class Resumable:
    """What a JSONL output already holds, and where appending continues."""

    #: Its complete lines, blank lines excepted.
    lines: int = 0
    #: Where a last line cut short by a kill starts (None: there is none).
    cut_at: int | None = None
    #: The last line is complete but has no line break.
    needs_newline: bool = False


def refuse_overwrite(path: Path, *, resume: bool, named: str, how_to_resume: str) -> None:
    """Refuse an output that exists and is not empty unless it is being resumed.

    :raises InvalidInputError: naming the output (``named``) and how to resume it.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if not resume and size:
        raise InvalidInputError(
            f"{named} exists and is not empty; {how_to_resume} to continue it, or write to "
            "another file"
        )


def read_resumable(
    path: Path, take: Callable[[int, Any], None], *, shape: str, then: str = "resume again"
) -> Resumable:
    """Hand each complete line of ``path`` to ``take(line number, value)``, and say where to
    continue. A missing file holds nothing. ``then`` is what the message of a refused line
    tells its reader to do once it is mended.

    ``take`` raises `ValueError`, `KeyError` or `TypeError` for a line that is JSON but not of
    the output's ``shape`` (such a line was never cut short by a kill: it is refused).

    :raises InvalidInputError: a line that is not JSON before the last, or not of the shape.
    :raises OSError: the file cannot be read.
    """
    resumable = Resumable()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return resumable
    start = number = 0
    while start < len(raw):
        end = raw.find(b"\n", start)
        last = end == -1 or not raw[end + 1 :].strip()
        line = raw[start:] if end == -1 else raw[start:end]
        number += 1
        if line.strip():
            try:
                value = parse_json(line.removeprefix(BOM) if number == 1 else line)
            except ValueError as error:
                if last:  # a kill cuts the last line short; its record is done again
                    resumable.cut_at = start
                    return resumable
                raise InvalidInputError(
                    f"{path} line {number} is not JSON ({json_error(error)}); it is not the "
                    f"last line, so no kill cut it short: fix or remove it, then {then}"
                ) from None
            try:
                take(number, value)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
                # Valid JSON: no kill made it (a line cut short never parses).
                why = (
                    str(error)
                    if isinstance(error, InvalidInputError)
                    else (f"{type(error).__name__}: {error}")
                )
                raise InvalidInputError(
                    f"{path} line {number} is JSON but not {shape} ({why}): it is not a file "
                    "this command wrote; fix or remove the line, "
                    f"then {then}"
                ) from None
            resumable.lines += 1
            resumable.needs_newline = end == -1
        if end == -1:
            break
        start = end + 1
    return resumable


def open_to_continue(path: Path, resumable: Resumable) -> io.FileIO:
    """``path`` opened to append, unbuffered (a killed run keeps every line it wrote), after
    a last line cut short is dropped or a complete one gets its line break.

    :raises OSError: it cannot be opened or written.
    """
    file = io.FileIO(path, "ab")
    try:
        if resumable.cut_at is not None:
            file.truncate(resumable.cut_at)
        elif resumable.needs_newline:
            file.write(b"\n")
    except BaseException:
        file.close()
        raise
    return file


# -- a pipe's lines ---------------------------------------------------------------------------


class PipeLines:
    """A pipe's (or stdin's) lines, read by a daemon thread and handed to the event loop at
    most ``read_ahead`` lines ahead (asyncio only); each line keeps its line break (the last
    may have none). An `OSError` that ends the reading is raised where the lines are read.

    Not a worker thread: a pipe may wait for its writer forever, and neither a cancellation
    nor the process's exit may wait with it. Raw ``os.read`` calls: a thread blocked inside a
    file object's ``readline`` would hold the file's lock, and closing the file would wait.
    """

    def __init__(self, fd: int, *, read_ahead: int, name: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[bytes | OSError | None] = asyncio.Queue()
        self._room = threading.Semaphore(read_ahead)
        self._stopped = threading.Event()
        threading.Thread(target=self._read, args=(fd,), name=name, daemon=True).start()

    def _hand_over(self, item: bytes | OSError | None) -> bool:
        self._room.acquire()
        if self._stopped.is_set():
            return False
        try:
            self._loop.call_soon_threadsafe(self._lines.put_nowait, item)
        except RuntimeError:  # the event loop has closed: nobody reads any more
            return False
        return True

    def _split(self, fd: int) -> Iterator[bytes]:
        pending = bytearray()  # the start of a line whose line break has not come yet
        while chunk := os.read(fd, 1 << 16):
            *lines, rest = chunk.split(b"\n")  # only the new bytes are searched
            if lines:
                lines[0] = bytes(pending) + lines[0]
                pending.clear()
            for line in lines:
                yield line + b"\n"
            pending += rest
        if pending:
            yield bytes(pending)

    def _read(self, fd: int) -> None:
        try:
            for line in self._split(fd):
                if not self._hand_over(line):
                    return
        except OSError as error:
            self._hand_over(error)
            return
        self._hand_over(None)

    def stop(self) -> None:
        """Stop reading (the thread ends at its next line; a read in flight is abandoned)."""
        self._stopped.set()
        self._room.release()  # wakes a hand-over waiting for room, which then sees stopped

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        line = await self._lines.get()
        self._room.release()
        if line is None:
            raise StopAsyncIteration
        if isinstance(line, OSError):
            raise line
        return line
