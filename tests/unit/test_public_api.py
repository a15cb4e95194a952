from __future__ import annotations

import inspect

import attrs

import typevet_async as tv
from typevet_async import _errors


def _isort_key(name: str) -> tuple[int, str]:
    """Ruff's RUF022 order: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_all_is_sorted_and_complete() -> None:
    assert list(tv.__all__) == sorted(tv.__all__, key=_isort_key)
    public = {
        name
        for name, value in vars(tv).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(tv.__all__)


def test_the_exported_errors_are_exactly_the_errors_defined() -> None:
    defined = {
        name
        for name, value in vars(_errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == _errors.__name__
    }
    exported = {
        name
        for name in tv.__all__
        if inspect.isclass(getattr(tv, name)) and issubclass(getattr(tv, name), BaseException)
    }
    assert exported == defined
    assert set(_errors.__all__) == defined
    for name in defined:
        assert issubclass(getattr(_errors, name), tv.TypevetError)
        assert getattr(tv, name) is getattr(_errors, name)


def test_the_error_tree() -> None:
    for cls in (
        tv.InvalidInputError,
        tv.QuestionError,
        tv.TooManyOptionsError,
        tv.SchemaError,
        tv.ConfigurationError,
        tv.PromptTooLongError,
    ):
        assert issubclass(cls, tv.InvalidInputError)
        assert issubclass(cls, ValueError)
    assert issubclass(tv.DeadlineExceededError, TimeoutError)
    assert not issubclass(tv.DeadlineExceededError, tv.BackendError)
    assert issubclass(tv.RequestTimeoutError, TimeoutError)
    assert issubclass(tv.RequestTimeoutError, tv.BackendError)
    assert issubclass(tv.TransportError, ConnectionError)
    assert issubclass(tv.SessionStateError, RuntimeError)
    for generation in (tv.GenerationError, tv.TruncatedOutputError, tv.OutputValidationError):
        assert issubclass(generation, tv.GenerationError)
        assert not issubclass(generation, tv.BackendError)
    # Renamed and removed in the 0.x architecture change.
    for gone in ("JudgmentTimeoutError", "ReadTimeoutError"):
        assert not hasattr(tv, gone)


def test_py_typed_ships() -> None:
    from importlib.resources import files

    assert files("typevet_async").joinpath("py.typed").is_file()


def test_the_read_cache_is_public() -> None:
    from typevet_async._backends import base
    from typevet_async._session import read_cache as _read_cache

    assert tv.ReadCache is _read_cache.ReadCache
    assert tv.MemoryReadCache is _read_cache.MemoryReadCache
    assert tv.SqliteReadCache is _read_cache.SqliteReadCache
    assert tv.ReadIdentifying is base.ReadIdentifying
    for name in ("ReadCache", "MemoryReadCache", "SqliteReadCache", "ReadIdentifying"):
        assert name in tv.__all__
    # Both stores are read caches, and a session's settings take them.
    assert isinstance(tv.MemoryReadCache(), tv.ReadCache)
    assert isinstance(tv.SqliteReadCache("unused.db"), tv.ReadCache)
    assert "cache" in {field.name for field in attrs.fields(tv.SessionSettings)}
