"""The one redaction step: no secret a session holds reaches an error, a repr or a log line.

Every `TypevetError` passes its message, each attribute it is given and each note added to it
through `redact` (`typevet_async._errors`), whoever raises it: the HTTP client, a reply's
decoder or the generation pipeline. Every repr that shows a server's URL shows ``redact(url)``.

What is redacted:

- a URL's user and password (``http://user:pass@host`` -> ``http://***@host``), wherever a
  URL appears;
- every secret registered with `register_secret`, wherever it appears, case-insensitively.
  An `HttpClient` registers its API key and its URL's user and password
  (`typevet_async._backends.http_secrets`), each with the other forms a server may echo
  (``Bearer <key>``, percent-encoded, JSON-escaped, ``user:password``, the Basic-auth
  header's base64). A secret stays registered for the life of the process: an error raised,
  or printed, after its session closed is still redacted.

A form shorter than `SHORT` characters is not registered: masked everywhere, so short a string
would garble unrelated text in every error of the process (the unit tests' key ``"k"`` turned
every ``top_k`` into ``top_***``), and it is no secret worth the name. Its longer forms still
are (``Bearer k`` is 8 characters). A text that ends with the first `PARTIAL` or more
characters of a secret (an excerpt cut in the middle of an echoed key) has that fragment
masked too. A secret's mask is shorter than the secret: no excerpt grows past its cap.

Pure: no I/O. The registry is process-wide state that only grows.
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = [
    "MASK",
    "PARTIAL",
    "SHORT",
    "excerpt",
    "redact",
    "redact_value",
    "redacted_repr",
    "register_secret",
]

MASK: Final = "***"
#: Forms shorter than this are not registered.
SHORT: Final = 8
#: The shortest trailing fragment of a secret that is masked.
PARTIAL: Final = 4

#: A URL's ``user:password@``, up to the last ``@`` of the authority (lenient parsers, such as
#: urllib's, take the host after the last one).
_USERINFO = re.compile(r"://[^/?#\s]*@")

_secrets: set[str] = set()
#: The forms whose trailing fragments are masked too (not a header's, whose first word is not
#: secret).
_fragmentable: set[str] = set()
#: The pattern of `_secrets` and the secrets it was built from (rebuilt when they change).
_compiled: tuple[frozenset[str], re.Pattern[str] | None] = (frozenset(), None)


def register_secret(*forms: str, fragments: bool = True) -> None:
    """Mask each of ``forms`` (each a form of a secret) of at least `SHORT` characters in every
    text redacted from now on; ``fragments``: also a text's trailing fragment of one."""
    kept = [form for form in forms if len(form) >= SHORT]
    _secrets.update(kept)
    if fragments:
        _fragmentable.update(kept)


def _pattern() -> tuple[frozenset[str], re.Pattern[str] | None]:
    global _compiled
    secrets = frozenset(_secrets)
    if secrets != _compiled[0]:
        # Longest first: at each position the longest form that matches is masked whole.
        forms = sorted(secrets, key=len, reverse=True)
        alternatives = "|".join(re.escape(form) for form in forms)
        _compiled = (secrets, re.compile(alternatives, re.IGNORECASE) if forms else None)
    return _compiled


def _mask_trailing_fragment(text: str) -> str:
    folded = text.casefold()
    for form in tuple(_fragmentable):
        prefix = form.casefold()
        for size in range(len(form) - 1, PARTIAL - 1, -1):
            if folded.endswith(prefix[:size]):
                return text[:-size] + MASK
    return text


def redact(text: str) -> str:
    """``text`` with every URL's user and password and every registered secret masked."""
    text = _USERINFO.sub(f"://{MASK}@", text)
    _, pattern = _pattern()
    if pattern is None:
        return text
    return _mask_trailing_fragment(pattern.sub(MASK, text))


def excerpt(text: str, limit: int) -> str:
    """The first ``limit`` characters of ``text``, redacted: a secret that straddles the cut
    is masked whole, not cut in two."""
    longest = max((len(form) for form in _pattern()[0]), default=0)
    return redact(text[: limit + longest])[:limit]


#: How deep `redact_value` walks: a JSON value the SDK keeps is never deeper (the parsed
#: outputs are capped at 64 levels); a deeper, hand-built payload is kept as it is below it.
_MAX_DEPTH = 200


def _needs_redacting(value: Any, active: set[int], depth: int) -> bool:
    if isinstance(value, str):
        return redact(value) != value
    if isinstance(value, bytes | bytearray):
        return redact(bytes(value).decode("latin-1")) != value.decode("latin-1")
    if not isinstance(value, list | tuple | dict) or id(value) in active or depth > _MAX_DEPTH:
        return False  # a cycle's back-reference is walked once, where it starts
    active.add(id(value))
    try:
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        return any(_needs_redacting(item, active, depth + 1) for item in items)
    finally:
        active.discard(id(value))


def _rebuilt(value: Any, active: set[int], depth: int) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, bytes | bytearray):
        # Latin-1 maps each byte to one character and back: only the masked bytes change.
        return redact(bytes(value).decode("latin-1")).encode("latin-1")
    if not isinstance(value, list | tuple | dict) or depth > _MAX_DEPTH:
        return value
    if id(value) in active:
        return MASK  # a cycle: the copy must not point back at the unredacted original
    active.add(id(value))
    try:
        if isinstance(value, dict):
            return {
                _rebuilt(key, active, depth + 1): _rebuilt(item, active, depth + 1)
                for key, item in value.items()
            }
        items = [_rebuilt(item, active, depth + 1) for item in value]
        return items if isinstance(value, list) else tuple(items)
    finally:
        active.discard(id(value))


def redact_value(value: Any) -> Any:
    """``value`` with `redact` applied to every string (and bytes) in it, through lists,
    tuples and dicts (a JSON value, a reply's payload): a redacted copy, or the value itself
    if there is nothing to redact in it (cyclic values included)."""
    if isinstance(value, str):
        return redact(value)
    if not _needs_redacting(value, set(), 0):
        return value
    return _rebuilt(value, set(), 0)


def redacted_repr(value: str | None) -> str:
    """``repr`` of a URL (or None) with its credentials masked: for the reprs of records that
    hold one (``attrs.field(repr=redacted_repr)``)."""
    return repr(redact(value) if value is not None else None)
