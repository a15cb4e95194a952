"""The installed distribution's version, read once: what the read cache keys on (an upgrade
never reads an older SDK's entries) and the telemetry's instrumentation scope names."""

from __future__ import annotations

import functools
import importlib.metadata

__all__ = ["installed_version"]


@functools.cache
def installed_version() -> str:
    """The installed ``typevet_async`` distribution's version (``"unknown"`` when it runs
    from a tree that was never installed)."""
    try:
        return importlib.metadata.version("typevet_async")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
