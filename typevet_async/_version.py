"""The package's version, in one place: pyproject.toml reads it (``dynamic = ["version"]``),
``tv.__version__`` re-exports it, ``typevet-async --version`` and ``serve`` show it, the read
cache keys on it (an upgrade never reads an older SDK's entries) and the telemetry names its
instrumentation scope with it."""

from __future__ import annotations

from typing import Final

__all__ = ["__version__"]

__version__: Final = "0.1.0"
