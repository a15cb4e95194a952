"""The vocabulary of settings: the `UNSET` sentinel and the validators every config record uses.

Each rule about a setting's value is written here once; the attrs records (`SessionSettings`,
the backends' configs, `HttpSettings`, `RetryPolicy`) and the per-call overrides all use these
validators, so a value is refused in the same words wherever it is given.
"""

from __future__ import annotations

import enum
import math
import types
import typing
import urllib.parse
from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs

from typevet_async._errors import ConfigurationError
from typevet_async._redaction import redact

__all__ = [
    "UNSET",
    "Unset",
    "api_key",
    "boolean",
    "callable_or_none",
    "check_argument",
    "instance_of",
    "non_empty_text",
    "non_negative_int",
    "non_negative_number",
    "one_of",
    "optional",
    "positive_int",
    "positive_number",
    "probability_or_none",
    "resolve",
    "sequence_of",
    "unset_or",
    "url",
]

T = TypeVar("T")
Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


class Unset(enum.Enum):
    """The type of `UNSET`: "not given, use the session's setting" (distinct from None)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


#: The default of every per-call override: fall back to the session's (or backend's) setting.
UNSET: Final = Unset.UNSET


def check_argument(name: str, value: Any, validator: Validator) -> None:
    """Hold one call argument to a record's validator, refused under its own ``name`` (a
    call's ``record_timeout`` becomes its reads' ``timeout``)."""
    validator(None, typing.cast("attrs.Attribute[Any]", types.SimpleNamespace(name=name)), value)


def resolve(value: T | Unset, default: T) -> T:
    """``value``, or ``default`` where the caller left it `UNSET`."""
    return default if isinstance(value, Unset) else value


def _refuse(attribute: attrs.Attribute[Any], wanted: str, value: Any) -> None:
    raise ConfigurationError(f"{attribute.name} must be {wanted}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not _is_int(value) or value < 1:
        _refuse(attribute, "a positive integer", value)


def non_negative_int(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not _is_int(value) or value < 0:
        _refuse(attribute, "an integer >= 0", value)


def _is_finite_number(value: Any) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value)


def positive_number(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not _is_finite_number(value) or not value > 0:
        _refuse(attribute, "a positive, finite number", value)


def non_negative_number(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not _is_finite_number(value) or value < 0:
        _refuse(attribute, "a finite number >= 0", value)


def probability_or_none(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not _is_finite_number(value) or not 0.0 <= value <= 1.0:
        _refuse(attribute, "in [0, 1] or None", value)


def boolean(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        _refuse(attribute, "True or False", value)


def _is_text(value: Any) -> bool:
    """A non-empty string that UTF-8 can carry (no lone surrogate)."""
    if not isinstance(value, str) or not value.strip():
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def non_empty_text(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not _is_text(value):
        _refuse(attribute, "a non-empty string (with no lone surrogate)", value)


def url(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """A server's http(s) URL: the one rule every backend config and a fleet's URL list use
    (the transport then adds its own: no credentials in it beside an API key)."""
    if not _is_text(value):
        _refuse(attribute, "an http(s) URL (a non-empty string)", value)
    try:
        parts = urllib.parse.urlsplit(value.strip())
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as error:
        raise ConfigurationError(
            f"{attribute.name} is not a valid URL ({error}): {redact(value)!r}"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"{attribute.name} must be an http(s) URL with a host, got {redact(value)!r}"
        )


#: What an HTTP header value may carry unquoted: visible ASCII, no spaces, no line breaks.
_HEADER_SAFE = frozenset(map(chr, range(0x21, 0x7F)))


def api_key(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """None, or a key that can go in an ``Authorization: Bearer`` header as it is. The key is
    never shown: the message names what is wrong with it (a key read from a file often ends in
    a newline, which would otherwise fail inside aiohttp at the first request)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{attribute.name} must be a string or None, got {type(value).__name__}"
        )
    if not value:
        raise ConfigurationError(f"{attribute.name} is empty; pass None for no key")
    if value != value.strip():
        raise ConfigurationError(
            f"{attribute.name} starts or ends with whitespace (a trailing newline?); strip it "
            "(the key is not shown)"
        )
    if not _HEADER_SAFE.issuperset(value):
        raise ConfigurationError(
            f"{attribute.name} must be visible ASCII with no spaces or control characters, "
            "as an HTTP header carries it (the key is not shown)"
        )


def instance_of(kind: type | tuple[type, ...], wanted: str) -> Validator:
    """A validator for a value of ``kind`` (``wanted`` says it in words)."""

    def check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, kind):
            _refuse(attribute, wanted, value)

    return check


def sequence_of(kind: type, wanted: str) -> Validator:
    """A validator for a list or tuple whose every item is a ``kind``."""

    def check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, list | tuple) or not all(isinstance(v, kind) for v in value):
            _refuse(attribute, wanted, value)

    return check


def callable_or_none(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not callable(value):
        _refuse(attribute, "a callable or None", value)


def one_of(kind: Any) -> Validator:
    """A validator for the values of a ``Literal`` type, read from the type itself."""
    allowed = typing.get_args(kind)
    wanted = "one of " + ", ".join(repr(value) for value in allowed)

    def check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, str) or value not in allowed:
            _refuse(attribute, wanted, value)

    return check


def optional(validator: Validator) -> Validator:
    """``validator``, or None."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            validator(instance, attribute, value)

    return check


def unset_or(validator: Validator) -> Validator:
    """``validator``, or `UNSET`."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, Unset):
            validator(instance, attribute, value)

    return check
