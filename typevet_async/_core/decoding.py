"""Decoding what a client sends, under a budget: bytes, items, depth, parts, frames and CPU time.

A server's decode is the first thing a hostile body reaches, before any key or shape is
checked, so every step of it charges a `DecodeBudget` and stops with a `DecodeError` the
moment a limit runs out: a zstd body is walked frame by frame without copying the rest of the
body (linear, at most ``max_frames``), a gzip or zstd inflation stops at ``max_bytes``, a JSON
value is walked once without recursion counting items and depth, and the CPU time the decode
has used is checked between steps. Pure functions: the gateway runs them off its event loop.
"""

from __future__ import annotations

import sys
import time
import zlib
from typing import Any, Final

import attrs

from typevet_async._errors import (
    BadEncodingError,
    BodyTooLargeError,
    BudgetExceededError,
    DecodeError,
    InvalidInputError,
)

try:  # the official System One client compresses its bodies with zstd when it can
    if sys.version_info >= (3, 14):
        from compression.zstd import ZstdDecompressor, ZstdError, get_frame_size
    else:
        from backports.zstd import ZstdDecompressor, ZstdError, get_frame_size
    HAVE_ZSTD = True
except ImportError:  # pragma: no cover - without the serve extra
    HAVE_ZSTD = False

__all__ = [
    "HAVE_ZSTD",
    "BadEncodingError",
    "BodyTooLargeError",
    "BudgetExceededError",
    "CpuClock",
    "DecodeBudget",
    "DecodeError",
    "check_json_budget",
    "count_multipart_parts",
    "decompress",
]

#: Decompressed bytes produced per step while inflating a body (the caps are checked after each).
_CHUNK: Final = 64 * 1024
#: JSON values walked between two looks at the CPU clock.
_CLOCK_EVERY: Final = 4096


@attrs.frozen(kw_only=True)
class DecodeBudget:
    """What one request's decode may use."""

    #: The largest body, compressed or decompressed.
    max_bytes: int = 8 * 1024 * 1024
    #: JSON values (containers, strings, numbers, ...) in the body.
    max_items: int = 200_000
    #: Deepest nesting of the body's JSON (the body itself is level 1).
    max_depth: int = 128
    #: Parts of a ``multipart/form-data`` body.
    max_parts: int = 33
    #: Frames of a zstd body (a client sends one).
    max_frames: int = 16
    #: CPU seconds the decode may use.
    cpu_seconds: float = 2.0

    def __attrs_post_init__(self) -> None:
        for name in ("max_bytes", "max_items", "max_depth", "max_parts", "max_frames"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidInputError(f"DecodeBudget.{name} must be a positive integer")
        if not self.cpu_seconds > 0:
            raise InvalidInputError("DecodeBudget.cpu_seconds must be positive")


class CpuClock:
    """The CPU time one decode has left (the decoding thread's own time, not the wall's)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._deadline = time.thread_time() + seconds

    def check(self) -> None:
        """:raises BudgetExceededError: the decode has used its CPU time."""
        if time.thread_time() > self._deadline:
            raise BudgetExceededError(
                f"the body took more than {self.seconds:g} s of CPU time to decode", "cpu"
            )


def decompress(body: bytes, encoding: str, budget: DecodeBudget, clock: CpuClock) -> bytes:
    """``body`` decoded from ``encoding`` (zstd, gzip or identity), at most ``max_bytes``.

    Inflation stops as soon as the output passes the cap (a zip bomb costs the cap), and a
    zstd body's frames are walked in place: each frame is decompressed from a view of the
    body, never from a copy of the rest of it, and at most ``max_frames`` are read.

    :raises BodyTooLargeError: the output would pass ``max_bytes``.
    :raises BadEncodingError: another encoding, or a body that is not of its encoding.
    :raises BudgetExceededError: too many zstd frames, or the CPU time is used up.
    """
    encoding = encoding.strip().lower()
    cap = budget.max_bytes
    if encoding in ("", "identity"):
        if len(body) > cap:
            raise BodyTooLargeError(f"the body exceeds the {cap}-byte limit")
        return body
    out = bytearray()
    if encoding in ("gzip", "x-gzip"):
        _gunzip(body, out, cap, clock)
    elif encoding == "zstd" and HAVE_ZSTD:
        _unzstd(body, out, budget, clock)
    else:
        accepted = "zstd, gzip or identity" if HAVE_ZSTD else "gzip or identity"
        raise BadEncodingError(f"Content-Encoding {encoding!r} is not accepted: send {accepted}")
    return bytes(out)


def _too_large(cap: int) -> BodyTooLargeError:
    return BodyTooLargeError(f"the body decompresses to more than the {cap}-byte limit")


def _gunzip(body: bytes, out: bytearray, cap: int, clock: CpuClock) -> None:
    inflater = zlib.decompressobj(wbits=31)
    data = body
    try:
        while data and not inflater.eof:
            out += inflater.decompress(data, _CHUNK)
            if len(out) > cap:
                raise _too_large(cap)
            clock.check()
            data = inflater.unconsumed_tail
        out += inflater.flush()
    except zlib.error as error:
        raise BadEncodingError(f"not a gzip body: {error}") from None
    if not inflater.eof:
        raise BadEncodingError("the gzip body is cut short")
    if inflater.unused_data:
        raise BadEncodingError("the gzip body has bytes after its end")
    if len(out) > cap:
        raise _too_large(cap)


def _unzstd(body: bytes, out: bytearray, budget: DecodeBudget, clock: CpuClock) -> None:
    view = memoryview(body)
    offset = frames = 0
    try:
        while offset < len(view):
            frames += 1
            if frames > budget.max_frames:
                raise BudgetExceededError(
                    f"the zstd body has more than {budget.max_frames} frames", "frames"
                )
            size = get_frame_size(view[offset:])  # reads the frame's headers, copies nothing
            frame = view[offset : offset + size]
            offset += size
            unzstd = ZstdDecompressor()
            while not unzstd.eof:
                out += unzstd.decompress(frame, _CHUNK)
                frame = view[0:0]
                if len(out) > budget.max_bytes:
                    raise _too_large(budget.max_bytes)
                clock.check()
                if unzstd.needs_input:
                    break
            if not unzstd.eof:
                raise BadEncodingError("the zstd body is cut short")
    except ZstdError as error:
        raise BadEncodingError(f"not a zstd body: {error}") from None


def count_multipart_parts(body: bytes, boundary: str) -> int:
    """How many delimiter lines (``--boundary``) ``body`` holds: an upper bound on its parts plus
    one, counted in one pass of C before any parser looks at it."""
    delimiter = b"--" + boundary.encode("ascii", "replace")
    return body.count(b"\n" + delimiter) + (1 if body.startswith(delimiter) else 0)


def check_json_budget(
    value: Any, budget: DecodeBudget, clock: CpuClock, what: str = "the body"
) -> None:
    """Walk a parsed JSON value once, without recursion, counting its items and depth.

    :raises BudgetExceededError: more than ``max_items`` values, deeper than ``max_depth``, or
        the CPU time used up.
    """
    items = 1
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if not children:
            continue
        if depth >= budget.max_depth:
            raise BudgetExceededError(
                f"{what} nests deeper than {budget.max_depth} levels", "depth"
            )
        items += len(children)  # counted before they are pushed: a huge array costs nothing
        if items > budget.max_items:
            raise BudgetExceededError(
                f"{what} holds more than {budget.max_items} JSON values", "items"
            )
        if len(stack) < _CLOCK_EVERY or items % _CLOCK_EVERY < len(children):
            clock.check()
        stack.extend((child, depth + 1) for child in children)
