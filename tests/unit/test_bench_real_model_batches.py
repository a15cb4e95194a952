"""bench_real_model's batch calibration of the shipped tickets: computed from stored reads with
bench_public_data's arithmetic, checked here against a hand computation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.real_answers.bench_real_model import (
    batch_calibration,
    gold_index,
    load_set,
    with_batch_calibration,
)


def reads_of(every: int) -> tuple[dict, list, dict]:  # type: ignore[type-arg]
    tickets, questions = load_set(every)
    ordered = sorted(tickets, key=lambda t: str(t["id"]))
    reads: dict = {}  # type: ignore[type-arg]
    for shift, arm in ((0.0, "plain"), (0.3, "sdk")):
        reads[arm] = {}
        for qid, question in questions.items():
            n = len(question.options())
            rows = []
            for i, ticket in enumerate(ordered):
                weights = np.array(
                    [1.0 + ((i * 7 + k * 3) % 5) * 0.4 + shift * k for k in range(n)]
                )
                rows.append({"id": ticket["id"], "p": list(weights / weights.sum()), "off": 0.0})
            reads[arm][qid] = rows
    return reads, tickets, questions


def test_the_whole_set_batch_is_its_mean_divided_out() -> None:
    # 20 tickets: one batch of 50 is the whole set; batches of 10 are under the floor (16)
    reads, tickets, questions = reads_of(15)
    section = batch_calibration(reads, tickets, questions)
    ordered = sorted(tickets, key=lambda t: str(t["id"]))
    for qid, question in questions.items():
        p = np.array([row["p"] for row in reads["plain"][qid]])
        divided = p / p.mean(axis=0)
        divided /= divided.sum(axis=1, keepdims=True)
        gold = np.array([gold_index(question, t["labels"][qid]) for t in ordered])
        nll = -np.log(divided[np.arange(len(gold)), gold]).mean()
        summary = section["summary"][qid]
        for name in ("plain+bcall", "plain+bc50"):
            assert summary[name]["all"]["nll"]["value"] == pytest.approx(nll)
        raw = -np.log(p[np.arange(len(gold)), gold]).mean()
        assert summary["plain+bc10"]["all"]["nll"]["value"] == pytest.approx(raw)  # as read
        assert summary["plain+bc10"]["held_out"]["batches"] == {"batches": 2, "skipped": 2}
        assert summary["plain+bcall"]["all"]["vs_plain"]["nll"]["value"] == pytest.approx(nll - raw)
        assert summary["plain+bcall"]["held_out"]["batches"] == {"batches": 1, "skipped": 0}
        assert "defaults+bc50" in summary
    assert "**refund** (`defaults` = `sdk`)" in section["table"]


def test_a_file_without_reads_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"every": 1, "questions_file": "examples/eval/questions.json"}))
    with pytest.raises(SystemExit, match="holds no per-item reads"):
        with_batch_calibration(path)


def test_the_section_is_written_into_the_file(tmp_path: Path) -> None:
    reads, _, _ = reads_of(30)
    path = tmp_path / "run.json"
    path.write_text(
        json.dumps({"every": 30, "questions_file": "examples/eval/questions.json", "reads": reads})
    )
    with_batch_calibration(path)
    written = json.loads(path.read_text())["batch_calibration"]
    assert set(written["summary"]) == {"refund", "route", "urgency"}
