"""A batch's records and items: a record as ``(id, state)``, the input refused when it is
not an iterable of records, each record's outcome (`BatchItem`) and where the batch stands
(`Progress`)."""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Mapping
from typing import Any

import attrs

from typevet_async._core.reading.answers import Judgment
from typevet_async._errors import InvalidInputError, TypevetError

__all__ = ["BatchItem", "Progress", "check_records", "split_record"]

Record = Any


@attrs.frozen
class BatchItem:
    """One record's outcome: its judgment, or the typed error that ended it."""

    index: int
    record_id: Any
    judgment: Judgment | None = None
    #: The error that ended the record: an SDK error as raised, or a `BatchRecordError` whose
    #: ``__cause__`` is the non-SDK exception. Its traceback keeps file names and line numbers
    #: but no frame locals. What it carries of the server's reply is bounded: a
    #: ``ProtocolError.payload``, ``GenerationError.payload`` and ``.raw``,
    #: ``OutputValidationError.value`` or ``ServerError.body`` longer than `EXCERPT_LIMIT`
    #: characters (a parsed payload: as compact JSON) is replaced by a string excerpt of its
    #: first `EXCERPT_LIMIT` characters, ending in ``... [truncated]`` (in its causes and
    #: contexts too).
    error: TypevetError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@attrs.frozen
class Progress:
    """Where a batch stands; ``total`` is None when the input has no length."""

    done: int
    failed: int
    total: int | None
    elapsed: float

    @property
    def rate(self) -> float:
        """Records finished per second so far."""
        return self.done / self.elapsed if self.elapsed > 0 else 0.0


def split_record(record: Record, index: int) -> tuple[Any, Any]:
    """``(id, state)`` from a 2-tuple, else ``(index, record)``: a list is a JSON state."""
    if isinstance(record, tuple) and len(record) == 2:
        return record[0], record[1]
    return index, record


def check_records(records: object) -> None:
    """:raises InvalidInputError: ``records`` is a string, bytes or a mapping (each would be
    judged one character, byte or key at a time), or not an iterable or async iterable."""
    kind = type(records).__name__
    if isinstance(records, str | bytes | bytearray | memoryview):
        raise InvalidInputError(
            f"records must be an iterable of records, not a {kind}: it would be judged one "
            f"character at a time; pass [state] to judge one record"
        )
    if isinstance(records, Mapping):
        raise InvalidInputError(
            f"records must be an iterable of records, not a mapping ({kind}): pass "
            f".items() to judge (id, state) pairs, or .values() to judge the states"
        )
    if not isinstance(records, Iterable | AsyncIterable):
        raise InvalidInputError(f"records must be an iterable or async iterable, got {kind}")
