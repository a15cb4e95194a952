"""Shared test settings: asyncio debug mode (slow callbacks and never-awaited coroutines
are reported)."""

from __future__ import annotations

import os

os.environ.setdefault("PYTHONASYNCIODEBUG", "1")
