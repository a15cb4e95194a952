"""The public-data benchmark's batch-calibrated rows: computed from stored reads, checked here
against a hand computation (the real-model figures live in benchmarks, not in CI)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.real_answers.bench_public_data import (
    batch_calibrated,
    bc_name,
    merge,
    with_batch_calibration,
)


def test_a_batch_prior_is_its_own_items_mean_divided_out() -> None:
    # Ten items, all in the held-out half, one batch: the prior is (0.7, 0.3).
    p = [[0.9, 0.1]] * 5 + [[0.5, 0.5]] * 5
    row = batch_calibrated({"p": p, "off": [0.0] * 10}, np.ones(10, dtype=bool), None)
    # 0.9 / 0.7 : 0.1 / 0.3 = 1.2857 : 0.3333, renormalised.
    first = (0.9 / 0.7) / (0.9 / 0.7 + 0.1 / 0.3)
    second = (0.5 / 0.7) / (0.5 / 0.7 + 0.5 / 0.3)
    assert row["p"][0] == pytest.approx([first, 1 - first])
    assert row["p"][9] == pytest.approx([second, 1 - second])
    assert row["batches"]["held_out"] == {"batches": 1, "skipped": 0}


def test_batches_follow_the_sample_order_within_each_half() -> None:
    # Twenty items alternating dev / held-out; batches of 8 of the held-out ten: 8 then 2.
    held_out = np.array([i % 2 == 1 for i in range(20)])
    p = [[0.2 + 0.03 * i, 0.8 - 0.03 * i] for i in range(20)]
    row = batch_calibrated({"p": p, "off": [0.0] * 20}, held_out, 8)
    first = [i for i in range(20) if held_out[i]][:8]
    prior = np.mean([p[i] for i in first], axis=0)
    weights = np.array(p[first[0]]) / prior
    assert row["p"][first[0]] == pytest.approx(list(weights / weights.sum()))
    # The last held-out batch has 2 items: below the floor, left as read.
    assert row["p"][19] == p[19]
    assert row["batches"]["held_out"] == {"batches": 2, "skipped": 1}
    assert row["batches"]["dev"] == {"batches": 2, "skipped": 1}


def test_only_rows_read_as_they_are_get_batch_rows() -> None:
    rows = {
        "plain": {"p": [[0.6, 0.4]] * 8, "off": [0.0] * 8},
        "letters+cf": {"p": [[0.6, 0.4]] * 8, "off": [0.0] * 8},
    }
    added = with_batch_calibration(rows, np.ones(8, dtype=bool))
    assert set(added) - set(rows) == {bc_name("plain", size) for size in (10, 50, None)}


def results_of(ids: list[str], rows: dict[str, list[float]]) -> dict[str, Any]:
    """A results file's skeleton: one task, ``rows`` of one-option reads by arm."""
    items = {
        "ids": ids,
        "rows": {
            name: {"p": [[p] for p in ps], "off": [0.0] * len(ps)} for name, ps in rows.items()
        },
    }
    return {
        "model": "m",
        "items": {"t": items},
        "data": {"tasks": {"t": {}}},
        "priors": {"t": {}},
        "first_prompts": {"t": {}},
        "seconds": {},
        "settings": {name: {} for name in rows},
        "runs": [],
    }


def test_a_merged_run_on_more_items_gives_its_reads_of_these() -> None:
    half = results_of(["b", "d"], {"hand": [0.2, 0.4]})
    whole = results_of(["a", "b", "c", "d"], {"plain": [0.1, 0.2, 0.3, 0.4]})
    merge(half, whole, "whole")
    assert half["items"]["t"]["rows"]["plain"]["p"] == [[0.2], [0.4]]
    with pytest.raises(SystemExit, match="read already"):
        merge(half, whole, "whole")
    with pytest.raises(SystemExit, match="not the ones already read"):
        merge(whole, results_of(["a", "b"], {"hand": [0.5, 0.6]}), "half")
