"""What a failed record's item keeps of its error: the SDK error itself (anything else wrapped
in a `BatchRecordError`), with no frame locals (a parsed top-4096 response the failed read held
is about 2.5 MB of Python objects) and only bounded excerpts of what the server sent.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterator, Mapping
from typing import Any, Final

from typevet_async._errors import (
    BatchRecordError,
    GenerationError,
    OutputValidationError,
    ProtocolError,
    ServerError,
    TypevetError,
)

__all__ = [
    "EXCERPT_LIMIT",
    "bound_excerpts",
    "bounded",
    "error_chain",
    "kept_error",
    "shed_frame_locals",
]

#: Characters of a payload, raw output or body that a kept error item holds at most (plus a
#: short truncation note).
EXCERPT_LIMIT: Final = 4096

#: The end of an excerpt's members.
_END: Final = object()


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """The error, its causes and contexts, and the members of any exception group, once each."""
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)


def shed_frame_locals(error: BaseException) -> None:
    """Clear the local variables of the finished frames in an error's traceback and in its
    causes' and contexts': an item kept by the caller must not pin what the failed read held
    (a parsed top-4096 response is about 2.5 MB of Python objects). File names and line
    numbers stay, so the traceback still prints. The frame still running is left alone
    (`traceback.clear_frames` skips it).
    """
    for current in error_chain(error):
        traceback.clear_frames(current.__traceback__)


class _Punctuation(str):
    """Literal text of an excerpt, as opposed to a string value of the excerpted data."""

    __slots__ = ()


def _scalar(value: Any, limit: int) -> str:
    if isinstance(value, str):
        return json.dumps(value[:limit], ensure_ascii=False)
    if isinstance(value, bytes | bytearray | memoryview):
        return json.dumps(bytes(value[:limit]).decode("utf-8", "replace"), ensure_ascii=False)
    if value is None or isinstance(value, bool | float):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if value.bit_length() < 4096 else f"<int of {value.bit_length()} bits>"
    return repr(value)[:limit]


def _members(value: Mapping[Any, Any] | list[Any] | tuple[Any, ...], limit: int) -> Iterator[Any]:
    if isinstance(value, Mapping):
        yield _Punctuation("{")
        for number, (key, member) in enumerate(value.items()):
            key_text = _scalar(key if isinstance(key, str) else str(key), limit)
            yield _Punctuation(("," if number else "") + key_text + ":")
            yield member
        yield _Punctuation("}")
    else:
        yield _Punctuation("[")
        for number, member in enumerate(value):
            if number:
                yield _Punctuation(",")
            yield member
        yield _Punctuation("]")


def _excerpt(value: Any, limit: int) -> tuple[str, bool]:
    """``value`` as compact JSON-like text cut at ``limit`` characters, and whether it was
    whole. The cost is bounded by ``limit``, not by the size of ``value`` (cycles included)."""
    if isinstance(value, str):
        return value[:limit], len(value) <= limit
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value[:limit]).decode("utf-8", "replace"), len(value) <= limit
    pieces: list[str] = []
    size = 0
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack:
        piece = next(stack[-1], _END)
        if piece is _END:
            stack.pop()
            continue
        if isinstance(piece, _Punctuation):
            text = str(piece)
        elif isinstance(piece, Mapping | list | tuple):
            stack.append(_members(piece, limit))
            continue
        else:
            text = _scalar(piece, limit)
        pieces.append(text)
        size += len(text)
        if size > limit:
            return "".join(pieces)[:limit], False
    return "".join(pieces), True


def bounded(value: Any, limit: int = EXCERPT_LIMIT) -> Any:
    """``value`` itself if it fits in ``limit`` characters (a parsed value: as compact JSON),
    else a string excerpt of its first ``limit`` characters ending in ``... [truncated]``."""
    if value is None or isinstance(value, bool | int | float):
        return value
    text, whole = _excerpt(value, limit)
    return value if whole else f"{text}... [truncated]"


def bound_excerpts(error: BaseException, limit: int = EXCERPT_LIMIT) -> None:
    """Bound what an error (and its causes and contexts) keeps of the server's reply: see
    `BatchItem.error`."""
    for current in error_chain(error):
        if isinstance(current, ProtocolError):
            current.payload = bounded(current.payload, limit)
        elif isinstance(current, GenerationError):
            current.payload = bounded(current.payload, limit)
            current.raw = bounded(current.raw, limit)
            if isinstance(current, OutputValidationError):
                current.value = bounded(current.value, limit)
        elif isinstance(current, ServerError):
            current.body = bounded(current.body, limit)


def kept_error(error: Exception) -> TypevetError:
    """The error a record's item keeps: an SDK error as itself, anything else wrapped in a
    `BatchRecordError` (its ``__cause__``); without frame locals, with bounded excerpts."""
    if isinstance(error, TypevetError):
        kept = error
    else:
        message, _ = _excerpt(str(error), 500)
        kept = BatchRecordError(
            f"judging the record raised {type(error).__qualname__}: {message} "
            "(not an SDK error: a bug; see __cause__)"
        )
        kept.__cause__ = error
    shed_frame_locals(kept)
    bound_excerpts(kept)
    return kept
