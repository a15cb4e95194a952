"""The budget a server decodes what a client sends under: bytes, items, depth, parts, frames
and CPU time.

A server's decode is the first thing a hostile body reaches, before any key or shape is
checked, so every step of it charges a `DecodeBudget` and stops with a `DecodeError` the
moment a limit runs out. This module owns the budget, the CPU clock and the one walk of a
parsed JSON value (items and depth, without recursion), which the gateway and the MCP server
share; the gateway's HTTP decoding (``Content-Encoding``, multipart) spends the same budget
(`typevet_async._apps.gateway.encoding`, `typevet_async._apps.gateway.multipart`).
"""

from __future__ import annotations

import time
from typing import Any, Final

import attrs

from typevet_async._errors import BudgetExceededError, InvalidInputError

__all__ = ["CpuClock", "DecodeBudget", "check_json_budget"]

#: Containers walked between two looks at the CPU clock (each costs at most its children,
#: which the item budget bounds before they are pushed).
_CLOCK_EVERY: Final = 256


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


def check_json_budget(
    value: Any, budget: DecodeBudget, clock: CpuClock, what: str = "the body"
) -> None:
    """Walk a parsed JSON value once, without recursion, counting its items and depth.

    :raises BudgetExceededError: more than ``max_items`` values, deeper than ``max_depth``, or
        the CPU time used up.
    """
    items = containers = 1
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
        containers += 1
        if containers % _CLOCK_EVERY == 0:
            clock.check()
        stack.extend((child, depth + 1) for child in children)
