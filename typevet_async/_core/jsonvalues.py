"""JSON values as the SDK writes and reads them: compact, UTF-8 as is, NaN and Infinity refused.

Parsing and writing bytes is not I/O, so the core owns it (orjson: a K=4,096 read is ~370 KB).
"""

from __future__ import annotations

from typing import Any

import orjson

from typevet_async._errors import InvalidInputError

__all__ = ["MAX_JSON_DEPTH", "compact_json", "json_depth", "parse_json", "render_state"]

#: Deepest nesting of a JSON value the SDK accepts from a server.
MAX_JSON_DEPTH = 128


def compact_json(value: Any) -> str:
    """Compact JSON as the Jev gateway sends it: no spaces, UTF-8 kept as is."""
    return orjson.dumps(value).decode()


def render_state(state: Any) -> str:
    """A string as it is; any other JSON value as compact JSON.

    :raises InvalidInputError: ``state`` is neither a string nor a JSON value.
    """
    if isinstance(state, str):
        return state
    try:
        return compact_json(state)
    except TypeError as error:
        raise InvalidInputError(f"state must be a string or a JSON value: {error}") from None


def parse_json(text: str | bytes) -> Any:
    """One JSON value; NaN and Infinity, which JSON does not have, are refused.

    :raises orjson.JSONDecodeError: (a ``ValueError``) ``text`` is not JSON.
    """
    return orjson.loads(text)


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
