"""Fixtures the unit test modules share."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def no_typevet_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``TYPEVET_*`` variable of the machine (but the cache folder) reaches the test."""
    for name in list(os.environ):
        if name.startswith("TYPEVET_") and name != "TYPEVET_CACHE_DIR":
            monkeypatch.delenv(name)
