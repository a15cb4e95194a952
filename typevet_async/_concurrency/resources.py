"""`AsyncResource`: what ``async with`` does for the SDK's resources that have ``open`` and
``aclose`` (a session, a read cache), written once."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncResource"]


class AsyncResource:
    """Opened on entering ``async with``, closed on leaving it (whatever the block raised)."""

    async def open(self) -> None:
        """Nothing to open, unless a subclass has something."""

    async def aclose(self) -> None:
        """Nothing to release, unless a subclass has something."""

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
