from __future__ import annotations

import inspect

import typevet_async as tv
from typevet_async import errors


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


def test_every_error_is_exported_and_derives_from_typevet_error() -> None:
    classes = [
        value
        for value in vars(errors).values()
        if inspect.isclass(value) and issubclass(value, Exception)
    ]
    assert len(classes) >= 15
    for cls in classes:
        assert issubclass(cls, tv.TypevetError)
        assert cls.__name__ in tv.__all__


def test_bad_input_errors_are_value_errors() -> None:
    for cls in (
        tv.InvalidInputError,
        tv.QuestionError,
        tv.TooManyOptionsError,
        tv.ConfigurationError,
    ):
        assert issubclass(cls, ValueError)
    assert issubclass(tv.JudgmentTimeoutError, TimeoutError)
    assert issubclass(tv.ReadTimeoutError, TimeoutError)
    assert issubclass(tv.TransportError, ConnectionError)


def test_py_typed_ships() -> None:
    from importlib.resources import files

    assert files("typevet_async").joinpath("py.typed").is_file()
