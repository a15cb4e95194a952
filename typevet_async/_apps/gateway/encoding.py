"""``Content-Encoding`` of a request body (zstd, gzip, identity), decoded under its budget: an
inflation stops at the byte cap (a zip bomb costs the cap), and a zstd body's frames are walked
in place, at most ``max_frames`` of them (each frame decompressed from a view of the body, never
from a copy of the rest of it: linear, where a copy per frame was quadratic)."""

from __future__ import annotations

import sys
import zlib
from typing import Final

from typevet_async._core.wires.decoding import CpuClock, DecodeBudget
from typevet_async._errors import BadEncodingError, BodyTooLargeError, BudgetExceededError

try:  # the official System One client compresses its bodies with zstd when it can
    if sys.version_info >= (3, 14):
        from compression.zstd import ZstdDecompressor, ZstdError, get_frame_size
    else:
        from backports.zstd import ZstdDecompressor, ZstdError, get_frame_size
    HAVE_ZSTD = True
except ImportError:  # pragma: no cover - without the serve extra
    HAVE_ZSTD = False

__all__ = ["HAVE_ZSTD", "decompress"]

#: Decompressed bytes produced per step while inflating a body (the caps are checked after each).
_CHUNK: Final = 64 * 1024


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
