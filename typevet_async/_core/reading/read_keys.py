"""The read cache's key: one SHA-256 over everything that decides a read's bytes.

A stored read may answer a request only if the server would have been sent the very same
read: the same backend kind, server and configuration (the backend's ``read_identity``,
`typevet_async._backends.base.ReadIdentifying`), the same probe (served models, template
family and rendering, frame, control ids, vocabulary: `probe_digest`, so a changed model pin,
template or frame misses), and the same request: the exact prompt or messages and answer
prefill, the lead tokens, the candidate ids, option groups, read ids and codes, and each
image's SHA-256 (`read_key`). Everything goes through one canonical encoding (`canonical`):
each value tagged by its type and each string and list prefixed by its length, so no two
different inputs encode alike (no separator can be forged by caller text), and the digest
does not depend on dict order.

Pure: hashlib and cattrs, no I/O (the shell, `typevet_async._session.read_cache`, does the storing).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any, Final

import cattrs

from typevet_async._core.prompts.layouts import Message
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.probe import Probe

__all__ = ["READ_KEY_FORMAT", "canonical", "probe_digest", "read_key"]

#: What the key is, and the version of how it is made: changing what decides a read, or how
#: a read is made, means a new version here (so every older entry misses).
READ_KEY_FORMAT: Final = "typevet_async.read-key/1"

_converter = cattrs.Converter()


def canonical(value: Any) -> bytes:
    """``value`` (None, bool, int, float, str, bytes, a list, tuple or mapping of them) as
    bytes no other value encodes to: each item tagged by its type, strings and containers by
    their length, mapping items sorted by their encoded key.

    :raises TypeError: a value of another type (a bug: the key's ingredients are known).
    """
    parts: list[bytes] = []
    _encode(value, parts)
    return b"".join(parts)


def _encode(value: Any, parts: list[bytes]) -> None:
    if value is None or isinstance(value, bool):
        parts.append({None: b"n", True: b"t", False: b"f"}[value])
    elif isinstance(value, int):
        parts.append(b"i%d;" % value)
    elif isinstance(value, float):
        parts.append(b"d" + (value.hex() if math.isfinite(value) else repr(value)).encode() + b";")
    elif isinstance(value, str):
        # surrogatepass: caller text may hold a lone surrogate; it still encodes one way.
        encoded = value.encode("utf-8", "surrogatepass")
        parts.append(b"s%d:" % len(encoded))
        parts.append(encoded)
    elif isinstance(value, bytes):
        parts.append(b"b%d:" % len(value))
        parts.append(value)
    elif isinstance(value, list | tuple):
        parts.append(b"l%d:" % len(value))
        for item in value:
            _encode(item, parts)
    elif isinstance(value, Mapping):
        items = sorted((canonical(key), item) for key, item in value.items())
        parts.append(b"m%d:" % len(items))
        for key, item in items:
            parts.append(key)
            _encode(item, parts)
    else:
        raise TypeError(f"no canonical encoding for {type(value).__name__}")


def probe_digest(probe: Probe) -> str:
    """The hex SHA-256 of what the probe learnt (cattrs-unstructured: the served models, the
    template's family, rendering and frame, the controls' ids and leads, the vocabulary,
    vision), computed once per probe, part of every read's key. Every field but ``slots`` and
    ``context_tokens``: how many reads the server runs at once, and how long a prompt it
    takes, decide what is sent, not what one read reads (and a fleet's endpoints may differ
    in them)."""
    learnt = _converter.unstructure(probe)
    del learnt["slots"], learnt["context_tokens"]
    if learnt["chat_server"] is None:  # the other backends' keys as they always were
        del learnt["chat_server"]
    return hashlib.sha256(canonical(learnt)).hexdigest()


def _message_key(message: Message) -> tuple[Any, ...]:
    """A message in a read's key: its role, text and images (by SHA-256); its inline images
    with their offsets only when it has some, so a key without them is as it always was."""
    key: tuple[Any, ...] = (message.role, message.content, [i.sha256 for i in message.images])
    if message.inline:
        key += ([(offset, image.sha256) for offset, image in message.inline],)
    return key


def read_key(identity: str, probe: str, request: ScoringRequest) -> str:
    """The hex SHA-256 key of ``request``'s read from the backend ``identity`` names
    (`ReadIdentifying.read_identity`) under the probe ``probe`` (`probe_digest`).

    What only interprets a read (the question's labels, the rotation's order, which judgment
    it belongs to) is not in the key: those decide the answer made from the read, not the
    read, and they are applied to a stored read as to a fresh one.
    """
    messages = [_message_key(message) for message in request.messages]
    ingredients = (
        READ_KEY_FORMAT,
        identity,
        probe,
        request.prompt,
        messages,
        request.answer_prefill,
        request.lead,
        request.token_ids,
        request.option_groups,
        request.read_ids,
        request.codes,
    )
    return hashlib.sha256(canonical(ingredients)).hexdigest()
