"""A fleet's endpoints: each one's routing state, its changes and their log records, and what
makes two endpoints' answers differ (`typevet_async._backends.fleet`).

Logs (``typevet_async.fleet``): one record per change of state, never one per health check: a
WARNING when an endpoint leaves the rotation (the error's type) and when it is back (how long
it was out), an ERROR when it comes back different; each failed health check is DEBUG.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

from typevet_async._backends.base import Backend
from typevet_async._core.reading.probe import Probe

__all__ = ["Endpoint", "differences"]

log = logging.getLogger("typevet_async.fleet")

State = Literal["up", "cooling", "checking", "excluded"]


class Endpoint:
    """One endpoint's backend and its routing state."""

    __slots__ = (
        "backend",
        "failures",
        "index",
        "last_pick",
        "name",
        "outstanding",
        "since",
        "slots",
        "state",
        "until",
    )

    def __init__(self, index: int, name: str, backend: Backend) -> None:
        self.index = index
        self.name = name
        self.backend = backend
        self.slots: int | None = backend.capabilities.max_concurrency
        self.outstanding = 0
        #: Transient failures in a row: the cooldown doubles with each.
        self.failures = 0
        self.state: State = "up"
        #: While cooling: when (`time.monotonic`) its health check is due.
        self.until = 0.0
        #: While out of the rotation: since when (`time.monotonic`).
        self.since = 0.0
        #: When it was last picked (the fleet's pick counter): among endpoints equally busy,
        #: the one picked longest ago goes next, so one read at a time still spreads.
        self.last_pick = 0

    def has_room(self) -> bool:
        return self.state == "up" and (self.slots is None or self.outstanding < self.slots)

    def out(self, seconds: float, error: BaseException | None) -> None:
        """Out of the rotation (again) for ``seconds`` before its next health check."""
        now = time.monotonic()
        was, self.state, self.until = self.state, "cooling", now + seconds
        fields = {"endpoint": self.name, "cooldown_s": seconds}
        if was != "up":  # a failed health check: no change of state
            log.debug(
                "endpoint %s is still out; next health check in %.1f s",
                self.name,
                seconds,
                extra=fields,
            )
            return
        self.since = now
        kind = "no answer" if error is None else type(error).__name__  # never its message
        log.warning(
            "endpoint %s is out of the rotation (%s); its reads go to the others, its health "
            "check is due in %.1f s",
            self.name,
            kind,
            seconds,
            extra={**fields, "error_type": kind},
        )

    def back(self) -> None:
        """Its health check passed: back in the rotation."""
        self.failures = 0
        self.state = "up"
        out = time.monotonic() - self.since
        log.warning(
            "endpoint %s is back in the rotation after %.1f s out",
            self.name,
            out,
            extra={"endpoint": self.name, "out_s": round(out, 3)},
        )

    def exclude(self, found: list[str]) -> None:
        """It came back different: out for good."""
        self.state = "excluded"
        log.error("endpoint %s came back different: %s", self.name, "; ".join(found))


def differences(reference: Probe, probe: Probe) -> list[str]:
    """What makes an answer read at ``probe`` differ from one read at ``reference``."""
    found = []
    if set(probe.model_ids) != set(reference.model_ids):
        found.append(f"models {list(probe.model_ids)} (not {list(reference.model_ids)})")
    if probe.family is not reference.family:
        found.append(f"template family {probe.family.value} (not {reference.family.value})")
    elif probe.rendered_template != reference.rendered_template:
        found.append("another rendering of the chat template")
    if probe.vocab_size != reference.vocab_size:
        found.append(f"vocabulary size {probe.vocab_size} (not {reference.vocab_size})")
    if dict(probe.control_ids) != dict(reference.control_ids):
        changed = sorted(
            control
            for control in set(probe.control_ids) | set(reference.control_ids)
            if probe.control_ids.get(control) != reference.control_ids.get(control)
        )
        found.append(f"other token ids for the controls {changed[:8]}")
    return found
