"""The public-data benchmark's batch-calibrated rows: computed from stored reads, checked here
against a hand computation (the real-model figures live in benchmarks, not in CI)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmarks.real_answers.bench_public_data import (
    batch_calibrated,
    batch_size_sweep,
    bc_name,
    merge,
    paired_ece,
    with_batch_calibration,
)


def test_a_batch_prior_is_its_own_items_mean_divided_out() -> None:
    # Sixteen items (the floor), all in the held-out half, one batch: the prior is (0.7, 0.3).
    p = [[0.9, 0.1]] * 8 + [[0.5, 0.5]] * 8
    row = batch_calibrated({"p": p, "off": [0.0] * 16}, np.ones(16, dtype=bool), None)
    # 0.9 / 0.7 : 0.1 / 0.3 = 1.2857 : 0.3333, renormalised.
    first = (0.9 / 0.7) / (0.9 / 0.7 + 0.1 / 0.3)
    second = (0.5 / 0.7) / (0.5 / 0.7 + 0.5 / 0.3)
    assert row["p"][0] == pytest.approx([first, 1 - first])
    assert row["p"][15] == pytest.approx([second, 1 - second])
    assert row["batches"]["held_out"] == {"batches": 1, "skipped": 0}


def test_batches_follow_the_sample_order_within_each_half() -> None:
    # Forty items alternating dev / held-out; batches of 16 of the held-out twenty: 16, then 4.
    held_out = np.array([i % 2 == 1 for i in range(40)])
    p = [[0.2 + 0.015 * i, 0.8 - 0.015 * i] for i in range(40)]
    row = batch_calibrated({"p": p, "off": [0.0] * 40}, held_out, 16)
    first = [i for i in range(40) if held_out[i]][:16]
    prior = np.mean([p[i] for i in first], axis=0)
    weights = np.array(p[first[0]]) / prior
    assert row["p"][first[0]] == pytest.approx(list(weights / weights.sum()))
    # The last held-out batch has 4 items: below the floor, left as read.
    assert row["p"][39] == p[39]
    assert row["batches"]["held_out"] == {"batches": 2, "skipped": 1}
    assert row["batches"]["dev"] == {"batches": 2, "skipped": 1}


def test_only_rows_read_as_they_are_get_batch_rows() -> None:
    rows = {
        "plain": {"p": [[0.6, 0.4]] * 16, "off": [0.0] * 16},
        "letters+cf": {"p": [[0.6, 0.4]] * 16, "off": [0.0] * 16},
    }
    added = with_batch_calibration(rows, np.ones(16, dtype=bool))
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


def test_the_paired_ece_difference_is_the_difference_of_the_two_eces() -> None:
    # Four held-out items, two options. plain: confidences 0.6, 0.6, 0.9, 0.9, right on the
    # first three; row: the same but 0.7 on the first two. Equal-width bins of 0.1:
    # plain's ECE = (2 * |1 - 0.6| + |0.5 - 0.9| * 2) / 4 = (0.8 + 0.8) / 4 = 0.4;
    # row's ECE = (2 * |1 - 0.7| + 0.8) / 4 = 0.35: the difference is -0.05.
    gold = np.array([0, 0, 0, 1])
    plain = {"p": [[0.6, 0.4], [0.6, 0.4], [0.9, 0.1], [0.9, 0.1]]}
    row = {"p": [[0.7, 0.3], [0.7, 0.3], [0.9, 0.1], [0.9, 0.1]]}
    draws = np.random.default_rng(0).integers(0, 4, size=(200, 4))
    difference = paired_ece(row, plain, gold, np.ones(4, dtype=bool), draws)
    assert difference["value"] == pytest.approx(-0.05)
    # every resample has fewer items of the row's smaller gap or as many: never above 0
    assert difference["low"] <= -0.05 + 1e-12
    assert difference["high"] <= 0.0


def test_the_batch_size_sweep_divides_whole_batches_and_leaves_the_rest() -> None:
    # Two options, every item the same answer: each batch's prior is that answer, so every
    # divided item is uniform; with 6 items and batches of 4, two items stay as read.
    p = [[0.8, 0.2]] * 6
    gold = np.zeros(6, dtype=int)
    sweep = batch_size_sweep({"p": p}, gold, np.ones(6, dtype=bool))
    # NLL as read: -ln 0.8; divided: -ln 0.5 on 4 of 6 items.
    assert sweep["4"]["nll"] == pytest.approx(4 / 6 * (np.log(0.8) - np.log(0.5)))
    assert set(sweep) == {"4"}  # larger sizes than the items are not measured
