"""The order the suite runs in: the unit tests first, so a failure shows in minutes rather than
after the live tier's half hour, and the vLLM tests last (their server starts once, and shares
the two cores with nothing timing-sensitive after it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).parent.parent.parent


def _collected(*paths: str) -> list[str]:
    """The test ids in the order pytest would run them, given the paths in this order (`pytest
    tests` collects `tests/live` before `tests/unit`)."""
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in completed.stdout.splitlines() if "::" in line]


def test_the_unit_tests_run_before_the_live_tests_and_vllm_last() -> None:
    ids = _collected("tests/live/test_generation_live.py", "tests/unit/test_http.py")
    tiers = [
        "unit" if test.startswith("tests/unit/") else "vllm" if "vllm" in test else "live"
        for test in ids
    ]
    assert {"unit", "live", "vllm"} <= set(tiers)
    first_live = tiers.index("live")
    assert set(tiers[:first_live]) == {"unit"}, ids
    assert set(tiers[first_live:]) <= {"live", "vllm"}, ids
    assert tiers[tiers.index("vllm") :] == ["vllm"] * (len(tiers) - tiers.index("vllm")), ids
