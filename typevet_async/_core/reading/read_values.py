"""The read cache's values: a validated `CandidateRead` as bytes, and back, strictly.

What is stored is the read, not the answer: the candidates' logprobs and how they were read
(top-K, policy, clamping, whether the off-menu mass is known, the prompt scored, the endpoint,
a code question's reads after its first tokens). A calibration map, rotations or a threshold
applied later work on a stored read as on a fresh one. What a read cost is not stored: a hit
costs nothing (every count is 0).

Decoding trusts nothing it reads (a store is a file other processes write, or a foreign
store): the bytes are capped (`MAX_VALUE_BYTES`), the format named, every field of its exact
type (an int is an int, not ``"1"`` nor ``true``; a float is finite), no field unknown, and
the read must then pass the very checks a fresh read passes against this request
(`interpret_read`: only ids the request asked for, none twice, every option present, each
logprob valid, the candidates' mass at most 1). Anything else is a miss (None), never an
error and never another request's read.

Pure: cattrs and orjson, no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs
import cattrs
import orjson

from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.interpreting import interpret_read
from typevet_async._core.reading.readings import CandidateRead
from typevet_async._errors import TypevetError

__all__ = ["MAX_VALUE_BYTES", "READ_VALUE_FORMAT", "decode_read", "encode_read"]

#: The format of a stored value, and its version.
READ_VALUE_FORMAT: Final = "typevet_async.read-value/1"
#: The largest value decoded (or stored): a read is its candidates and its prompt, a few KB;
#: a whole-context prompt of a large model, hundreds. Past this it is not cached.
MAX_VALUE_BYTES: Final = 4 * 1024 * 1024
#: The policies a backend reads under (`LlamaCppConfig.on_missing`; other backends: exact).
_POLICIES: Final = frozenset({"exact", "clamp", "error"})


@attrs.frozen
class _After:
    """A code question's read after one first token, as stored."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_k: int
    off_menu_known: bool
    prompt: str
    policy: str
    truncated: bool
    clamped: int = 0


@attrs.frozen
class _Stored(_After):
    """A read as stored: what it read, not what it cost (a code question's reads after its
    first tokens too)."""

    endpoint: str | None = attrs.field(kw_only=True)
    after: tuple[_After, ...] = attrs.field(kw_only=True)


def _exactly(kind: type) -> Any:
    def structure(value: Any, _: Any) -> Any:
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return structure


def _finite(value: Any, _: Any) -> float:
    if type(value) is not float or not math.isfinite(value):
        raise ValueError(f"expected a finite float, got {value!r}")
    return value


_converter = cattrs.Converter(forbid_extra_keys=True)
for _kind in (int, str, bool):
    _converter.register_structure_hook(_kind, _exactly(_kind))
_converter.register_structure_hook(float, _finite)


def encode_read(read: CandidateRead) -> bytes:
    """``read`` (validated, as a backend returned it) as a stored value."""

    def kept(one: CandidateRead) -> dict[str, Any]:
        return {
            "token_ids": list(one.token_ids),
            "logprobs": [float(value) for value in one.logprobs],
            "top_k": one.top_k,
            "off_menu_known": one.off_menu_known,
            "prompt": one.prompt,
            "policy": one.policy,
            "truncated": one.truncated,
            "clamped": one.clamped,
        }

    stored = {
        **kept(read),
        "endpoint": read.endpoint,
        "after": [kept(after) for after in read.after],
    }
    return orjson.dumps({"format": READ_VALUE_FORMAT, "read": stored})


def decode_read(data: bytes, request: ScoringRequest) -> CandidateRead | None:
    """The read a stored value holds, as a hit of ``request`` (every count 0, ``cache="hit"``);
    None when the value is not one this request may use (module docstring)."""
    if not isinstance(data, bytes) or len(data) > MAX_VALUE_BYTES:
        return None
    try:
        raw = orjson.loads(data)
        if not isinstance(raw, dict) or raw.keys() != {"format", "read"}:
            return None
        if raw["format"] != READ_VALUE_FORMAT:
            return None
        stored = _converter.structure(raw["read"], _Stored)
    except (ValueError, TypeError, KeyError, AttributeError, cattrs.BaseValidationError):
        return None
    reads: tuple[_Stored | _After, ...] = (stored, *stored.after)
    if any(not _plausible(one) for one in reads) or (bool(stored.after) != bool(request.codes)):
        return None
    read = _hit(stored, after=tuple(_hit(after) for after in stored.after))
    try:  # the checks a fresh read passes (with no threshold: nothing else to raise)
        interpret_read(request, read)
    except TypevetError:
        return None
    return read


def _plausible(read: _Stored | _After) -> bool:
    return (
        len(read.token_ids) == len(read.logprobs)
        and read.top_k >= 1
        and read.policy in _POLICIES
        and 0 <= read.clamped <= len(read.token_ids)
        and all(token >= 0 for token in read.token_ids)
    )


def _hit(stored: _Stored | _After, after: tuple[CandidateRead, ...] = ()) -> CandidateRead:
    return CandidateRead(
        stored.token_ids,
        stored.logprobs,
        stored.top_k,
        reads=0,
        prompt_tokens=0,
        cached_tokens=0,
        off_menu_known=stored.off_menu_known,
        prompt=stored.prompt,
        policy=stored.policy,
        truncated=stored.truncated,
        clamped=stored.clamped,
        attempts=0,
        endpoint=stored.endpoint if isinstance(stored, _Stored) else None,
        after=after,
        cache="hit",
    )
