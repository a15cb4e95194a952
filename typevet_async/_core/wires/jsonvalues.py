"""JSON values as the SDK writes and reads them: compact, UTF-8 as is, NaN and Infinity refused,
integers exact at any size.

Parsing and writing bytes is not I/O, so the core owns it (orjson: a K=4,096 read is ~370 KB).
orjson is the fast path both ways; it cannot write an integer beyond 64 bits, and reads one as
a float, so those (rare) values go through the stdlib ``json`` instead, which keeps them exact.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from typevet_async._errors import InvalidInputError

__all__ = [
    "MAX_JSON_DEPTH",
    "ErrorFactory",
    "check_json_value",
    "check_text",
    "compact_json",
    "json_depth",
    "parse_json",
    "record_key",
    "render_state",
]

#: Deepest nesting of a JSON value the SDK accepts from a server.
MAX_JSON_DEPTH = 128

#: The integers orjson writes and reads as integers (int64 and uint64).
_ORJSON_INTS = range(-(2**63), 2**64)
#: Deepest nesting orjson writes; a deeper value (or one that contains itself) is refused.
_MAX_WRITE_DEPTH = 254
#: A run of digits long enough to be an integer orjson would read as a float (int64's minimum
#: has 19 digits). Strings and long fractions match too: those are only parsed a second time.
_LONG_DIGITS = re.compile(rb"\d{19}")


#: Builds the error for a value that is refused: ``(message, JSON path)``.
ErrorFactory = Callable[[str, str], InvalidInputError]


def _input_error(message: str, _: str) -> InvalidInputError:
    return InvalidInputError(message)


def _surrogate_at(text: str) -> int | None:
    """Where ``text`` holds a lone surrogate (``"\\ud800"``, or what ``surrogateescape`` makes
    of undecodable bytes), which UTF-8 cannot carry; None if nowhere."""
    if text.isascii():  # the common case, checked in C without encoding
        return None
    try:
        text.encode()
    except UnicodeEncodeError as failure:
        return failure.start
    return None


def _surrogate_message(what: str, text: str, index: int) -> str:
    return (
        f"{what} has a lone surrogate {text[index]!r} at index {index}, which is not Unicode "
        "text and cannot be sent; decode it properly or drop it"
    )


def check_text(text: str, what: str, error: type[InvalidInputError] = InvalidInputError) -> str:
    """``text``, once UTF-8 can carry it (no server can be sent a lone surrogate).

    :raises InvalidInputError: (or ``error``) naming ``what`` and the surrogate's index.
    """
    index = _surrogate_at(text)
    if index is not None:
        raise error(_surrogate_message(what, text, index))
    return text


def _children(value: Any) -> Iterator[tuple[str, Any]]:
    """Each child of a value orjson writes as a container, with its JSON-path step."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield f".{key}" if isinstance(key, str) else f"[{key!r}]", child
    elif isinstance(value, list | tuple):
        for index, child in enumerate(value):
            yield f"[{index}]", child
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield f".{field.name}", getattr(value, field.name)
    elif isinstance(value, enum.Enum):
        yield "", value.value


def check_json_value(value: Any, what: str, error: ErrorFactory = _input_error) -> str | None:
    """Walk ``value`` (without recursion) for what JSON cannot carry exactly: NaN and
    Infinity (orjson writes them as ``null``), non-string keys and lone surrogates.

    :returns: the JSON path of its first integer beyond 64 bits (which orjson cannot write),
        or None.
    :raises InvalidInputError: (or what ``error`` builds) naming ``what`` and the JSON path.
    """
    big: str | None = None
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > _MAX_WRITE_DEPTH:
            message = f"{what} nests deeper than {_MAX_WRITE_DEPTH} levels, or contains itself"
            raise error(message, path)
        if isinstance(item, str):
            index = _surrogate_at(item)
            if index is not None:
                raise error(_surrogate_message(f"{what} at {path}", item, index), path)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise error(f"{what} at {path} is {item!r}, which JSON does not have", path)
        elif isinstance(item, int):
            if big is None and item not in _ORJSON_INTS:
                big = path
        else:
            if isinstance(item, dict):
                for key in item:
                    if not isinstance(key, str):
                        raise error(
                            f"{what} at {path} has a key that is not a string: {key!r}", path
                        )
                    index = _surrogate_at(key)
                    if index is not None:
                        message = _surrogate_message(f"a key of {what} at {path}", key, index)
                        raise error(message, path)
            stack.extend((child, path + step, depth + 1) for step, child in _children(item))
    return big


def _holds_non_finite(value: Any) -> bool:
    """Whether ``value`` holds NaN or Infinity: only that, without paths (the fast pass for a
    value orjson wrote with a ``null``; `check_json_value` then says where)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif not isinstance(item, str | int) and item is not None:
            stack.extend(child for _, child in _children(item))
    return False


def _as_orjson_would(item: Any) -> Any:
    """What orjson writes for a type the stdlib does not know, as a plain JSON value."""
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return {field.name: getattr(item, field.name) for field in dataclasses.fields(item)}
    if isinstance(item, enum.Enum):
        return item.value
    return orjson.loads(orjson.dumps(item))  # a datetime, a UUID: orjson's own form


def _stdlib_json(value: Any) -> str:
    """Compact JSON by the stdlib, for a value orjson cannot write (an integer beyond 64 bits):
    the same separators, key order and UTF-8 as orjson, integers written exactly."""
    return json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_as_orjson_would
    )


def compact_json(value: Any, what: str = "the value") -> str:
    """Compact JSON as the Jev gateway sends it: no spaces, UTF-8 kept as is; integers exact
    at any size.

    :raises InvalidInputError: not a JSON value, or one holding NaN, Infinity, a non-string key
        or a lone surrogate (``what`` names it).
    """
    try:
        text = orjson.dumps(value)
    except TypeError as error:
        # orjson stops at the first thing it cannot write: find out what it was.
        if check_json_value(value, what) is None:
            raise InvalidInputError(f"{what} must be a JSON value: {error}") from None
        try:
            return _stdlib_json(value)
        except (TypeError, ValueError, RecursionError) as failure:
            raise InvalidInputError(f"{what} must be a JSON value: {failure}") from None
    # orjson writes NaN and Infinity as null: only a value that wrote a null can hold one.
    if b"null" in text and _holds_non_finite(value):
        check_json_value(value, what)
    return text.decode()


def render_state(state: Any) -> str:
    """A string as it is; any other JSON value as compact JSON (`compact_json`).

    :raises InvalidInputError: ``state`` is neither a string nor a JSON value, or holds NaN,
        Infinity or a lone surrogate (the message names where).
    """
    if isinstance(state, str):
        return check_text(state, "state")
    return compact_json(state, "state")


def parse_json(text: str | bytes) -> Any:
    """One JSON value; NaN and Infinity, which JSON does not have, are refused; integers of any
    size stay exact integers (orjson would read one beyond 64 bits as a float).

    :raises ValueError: (``orjson.JSONDecodeError`` or ``json.JSONDecodeError``) ``text`` is
        not JSON, or nests too deep to be read.
    """
    value = orjson.loads(text)
    raw = text.encode() if isinstance(text, str) else text
    if _LONG_DIGITS.search(raw) is None:
        return value
    # The text is valid, strict JSON (orjson read it): the stdlib reads it again the same way,
    # but keeps every integer exact.
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("the JSON value nests too deep to be read") from None


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


def record_key(record_id: Any) -> str:
    """A record id's identity: its JSON, keys sorted, so 5, 5.0, "5" and true differ (a batch's
    and an evaluation's duplicate checks and resumes, and the held-out split)."""
    return json.dumps(record_id, sort_keys=True)
