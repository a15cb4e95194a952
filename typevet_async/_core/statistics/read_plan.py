"""What a session's read plan is: how each question is read under a call's options, and what
a calibration map or a fitted prior fitted on those reads is pinned to (`Session.read_plan`)."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from typevet_async._core.statistics.calibration import CalibrationMap, Pins, Reading
from typevet_async._core.statistics.fitted_prior import FittedPrior

__all__ = ["ReadPlan"]


@attrs.frozen
class ReadPlan:
    """How a session reads a set of questions under a call's options, and what a calibration
    map (or a fitted prior) fitted on those reads is pinned to (`Session.read_plan`; what
    ``evaluate`` records)."""

    #: How each question's probabilities are read, by question id.
    readings: Mapping[str, Reading]
    #: What a map fitted on these reads carries, and a judgment's map must match.
    pins: Pins
    #: The options as resolved against the session's settings.
    permutations: int | Mapping[str, int]
    label_prior: bool
    calibration: CalibrationMap | None
    prior: FittedPrior | None = None
