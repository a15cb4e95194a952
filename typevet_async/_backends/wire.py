"""Strict decoding of server replies, shared by both backends: typed msgspec Structs from bytes.

Every reply the SDK reads has one decoder (in ``llama_cpp_wire``, ``vllm_wire`` and
``openai_chat``) built on the types here. A decoder is a `msgspec.Struct` tree that names only
the fields the SDK uses, decoded straight from the body's bytes by a `msgspec.json.Decoder`
in strict mode: an id must be a JSON integer (``100.9``, ``"100"`` and ``true`` are refused), a
count a non-negative integer, an object an object (a string, a list or ``null`` where an object
goes is refused); fields the server adds are skipped without being built
(``forbid_unknown_fields=False``), and an optional field has a default.

Why msgspec: it checks the types while it parses, in C, and builds nothing it was not asked
for. The recorded top-4,096 llama.cpp read (370 KB, about 12,000 JSON containers, each entry
carrying token text and bytes the SDK never reads) decodes and passes the entry checks in
1.4 ms, against 4.9 to 5.3 ms for ``orjson.loads``, building the entry tuples and the same
checks (timeit, garbage collector on, 2-core VM); a top-64 read in 20 to 25 µs against 35 to
39 µs. Most of orjson's cost is building, then collecting, dicts and lists nobody reads, and it
would still need a Python pass over every value to check its type. The Structs are
``gc=False`` (a decoded reply holds no cycles): the garbage collector tracks only the few
lists holding them, not the thousands of entries.

Every failure is a typed error: `ProtocolError` for a reply that is not JSON or not the shape
the protocol promises (the message names the JSON path, ``payload`` keeps at most
`EXCERPT_BYTES` of the body, never the body), `InvalidLogprobsError` for bad logprob values
(`typevet_async._core.reading.readings` owns those rules).
"""

from __future__ import annotations

from typing import Annotated, TypeVar

import msgspec

from typevet_async._errors import ProtocolError

__all__ = [
    "EXCERPT_BYTES",
    "Count",
    "Reply",
    "TokenId",
    "decode",
    "decoder_for",
    "excerpt",
    "protocol_error",
]

#: How much of an offending body a `ProtocolError` keeps in ``payload``.
EXCERPT_BYTES = 2048

#: A token id on the wire: a JSON integer, never negative. Whether it is below the vocabulary
#: size is `typevet_async._core.reading.readings.validated_entries`' rule (it knows the vocabulary).
TokenId = Annotated[int, msgspec.Meta(ge=0)]
#: A token count (prompt tokens, cached tokens, ``n_probs``): a non-negative JSON integer.
Count = Annotated[int, msgspec.Meta(ge=0)]

T = TypeVar("T")


class Reply(msgspec.Struct, forbid_unknown_fields=False, gc=False):
    """Base of every reply shape: servers add fields, which are skipped; no cycles, no GC."""


def decoder_for(shape: type[T]) -> msgspec.json.Decoder[T]:
    """A strict decoder of ``shape`` from JSON bytes (built once per shape, at import)."""
    return msgspec.json.Decoder(shape, strict=True)


def excerpt(raw: bytes) -> str:
    """At most `EXCERPT_BYTES` of a body, as text (what a `ProtocolError` keeps)."""
    return raw[:EXCERPT_BYTES].decode("utf-8", "replace")


def protocol_error(what: str, message: str, raw: bytes) -> ProtocolError:
    return ProtocolError(f"{what}: {message}", payload=excerpt(raw))


def decode(decoder: msgspec.json.Decoder[T], raw: bytes, what: str) -> T:
    """``raw`` decoded as the decoder's shape.

    :raises ProtocolError: not JSON, not the shape (the message names the JSON path), or
        nested too deeply to decode.
    """
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as error:
        raise protocol_error(what, f"unexpected reply: {error}", raw) from error
    except msgspec.DecodeError as error:
        raise protocol_error(what, f"reply is not valid JSON ({error})", raw) from error
    except RecursionError:
        raise protocol_error(what, "reply is nested too deeply", raw) from None
