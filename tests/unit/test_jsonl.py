"""The JSONL records module that batch, eval and MCP share: a pipe's lines, resuming an output
a kill cut short, refusing to overwrite one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

import typevet_async as tv
from typevet_async._apps.jsonl import (
    PipeLines,
    Resumable,
    error_line,
    open_to_continue,
    read_resumable,
    refuse_overwrite,
)


@pytest.mark.asyncio
async def test_pipe_lines_are_whole_lines_however_the_bytes_arrive() -> None:
    read_end, write_end = os.pipe()
    big = b"x" * 200_000  # beyond a pipe's buffer and a read's 64 KiB
    pieces = [b'{"a": 1}\n{"b"', b': "caf\xc3', b'\xa9"}\n', big + b"\n", b"last"]
    try:
        lines = PipeLines(read_end, read_ahead=4, name="test pipe")
        for piece in pieces:
            os.write(write_end, piece)
            await anyio.sleep(0.02)  # the reader thread reads each piece on its own
        os.close(write_end)
        with anyio.fail_after(10):
            received = [line async for line in lines]
    finally:
        with contextlib.suppress(OSError):  # closed above unless a write failed
            os.close(write_end)
        os.close(read_end)
    assert received == [b'{"a": 1}\n', '{"b": "café"}\n'.encode(), big + b"\n", b"last"]


@pytest.mark.asyncio
async def test_a_stopped_reader_hands_over_nothing_more() -> None:
    read_end, write_end = os.pipe()
    try:
        lines = PipeLines(read_end, read_ahead=1, name="test pipe")
        os.write(write_end, b"one\ntwo\nthree\n")
        with anyio.fail_after(10):
            assert await lines.__anext__() == b"one\n"
        lines.stop()
        os.close(write_end)
    finally:
        with contextlib.suppress(OSError):
            os.close(write_end)
        os.close(read_end)
    # At most the line already handed over before the stop may still be queued.
    with anyio.fail_after(10):
        rest = [line async for line in lines] if lines._lines.qsize() else []
    assert rest in ([], [b"two\n"])


def _taking(path: Path) -> tuple[list[tuple[int, Any]], Resumable]:
    taken: list[tuple[int, Any]] = []

    def take(number: int, value: Any) -> None:
        if not isinstance(value, dict) or "id" not in value:
            raise TypeError("not a record")
        taken.append((number, value))

    return taken, read_resumable(path, take, shape="a record line")


def test_a_last_line_cut_short_is_dropped_and_appending_continues_before_it(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'\xef\xbb\xbf{"id": 1}\n\n{"id": 2}\n{"id": 3, "ans')
    taken, resumable = _taking(out)
    assert taken == [(1, {"id": 1}), (3, {"id": 2})]
    assert resumable == Resumable(lines=2, cut_at=out.read_bytes().index(b'{"id": 3'))
    with open_to_continue(out, resumable) as file:
        file.write(error_line(3, "ServerError", "down"))
    assert out.read_bytes().endswith(
        b'{"id": 2}\n{"id":3,"error":{"type":"ServerError","message":"down"}}\n'
    )


def test_a_complete_last_line_without_its_break_gets_one(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"id": 1}\n{"id": 2}')
    taken, resumable = _taking(out)
    assert [number for number, _ in taken] == [1, 2]
    assert resumable == Resumable(lines=2, cut_at=None, needs_newline=True)
    with open_to_continue(out, resumable) as file:
        file.write(b'{"id": 3}\n')
    assert out.read_bytes() == b'{"id": 1}\n{"id": 2}\n{"id": 3}\n'


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b'{"id": 1}\nnot json\n{"id": 2}\n', "line 2 is not JSON"),
        (b'{"id": 1}\n[1, 2]\n', "line 2 is JSON but not a record line"),
    ],
)
def test_a_bad_line_that_no_kill_made_is_refused(
    tmp_path: Path, content: bytes, named: str
) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(content)
    with pytest.raises(tv.InvalidInputError, match=named):
        _taking(out)


def test_a_missing_file_holds_nothing(tmp_path: Path) -> None:
    assert _taking(tmp_path / "none.jsonl") == ([], Resumable())


def test_an_output_that_is_not_empty_is_continued_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    refuse_overwrite(out, resume=False, named="out", how_to_resume="resume")  # missing: fine
    out.write_bytes(b"")
    refuse_overwrite(out, resume=False, named="out", how_to_resume="resume")  # empty: fine
    out.write_bytes(b'{"id": 1}\n')
    refuse_overwrite(out, resume=True, named="out", how_to_resume="resume")
    with pytest.raises(tv.InvalidInputError, match="out exists and is not empty; pass it"):
        refuse_overwrite(out, resume=False, named="out", how_to_resume="pass it")
