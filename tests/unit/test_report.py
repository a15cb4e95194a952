"""typevet_async._apps.evaluation.report: the PNG figures and the HTML page, written into
tmp_path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from typevet_async._apps.evaluation import report as _report
from typevet_async._apps.evaluation.evaluation import question_entry
from typevet_async._core.statistics.metrics import (
    confidence_and_correct,
    evaluate,
    order_sensitivity,
    per_label,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCRIPT_LABEL = "<script>alert(1)</script>"
LABELS = ["yes", "no", SCRIPT_LABEL]


def sample(n: int = 120, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probabilities = rng.dirichlet([0.5, 0.5, 0.5], size=n)
    right = rng.random(n) < 0.6
    gold = np.where(right, probabilities.argmax(axis=1), rng.integers(0, 3, n))
    return probabilities, gold


def sample_report() -> dict[str, Any]:
    probabilities, gold = sample()
    metrics = evaluate(probabilities, gold, resamples=50)
    labels = per_label(probabilities, gold, LABELS, resamples=50)
    rotated = np.stack([probabilities, probabilities[:, [1, 0, 2]]], axis=1)
    first = question_entry(
        LABELS,
        metrics,
        labels,
        order_sensitivity=order_sensitivity(rotated),
        calibration={"map": "temperature", "held-out NLL before": 0.91, "held-out NLL after": 0.8},
    )
    second = question_entry(LABELS, metrics, labels)
    return {
        "facts": {"model": "gemma-3-270m", "backend": "llama.cpp", "records": 120},
        "questions": {"sentiment": first, "topic & tone": second},
    }


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert 5_000 < len(data) < 500_000


def test_reliability_png(tmp_path: Path) -> None:
    probabilities, gold = sample()
    metrics = evaluate(probabilities, gold, resamples=0)
    for name, bins in (("width.png", metrics.bins_width), ("mass.png", metrics.bins_mass)):
        _report.reliability_png(bins, tmp_path / name, title=f"sentiment: {name}")
        assert_png(tmp_path / name)


def test_reliability_png_of_tied_and_no_bins(tmp_path: Path) -> None:
    # All confidences equal: every equal-mass bin has no width.
    tied = evaluate([[0.6, 0.4]] * 8, [0, 1] * 4, resamples=0)
    _report.reliability_png(tied.bins_mass, tmp_path / "tied.png", title="tied")
    assert_png(tmp_path / "tied.png")
    _report.reliability_png((), tmp_path / "empty.png", title="no bins")
    assert_png(tmp_path / "empty.png")


def test_confidence_png(tmp_path: Path) -> None:
    probabilities, gold = sample()
    confidence, correct = confidence_and_correct(probabilities, gold)
    _report.confidence_png(confidence, correct, str(tmp_path / "confidence.png"), title="c")
    assert_png(tmp_path / "confidence.png")
    # All right: the wrong stack is empty.
    _report.confidence_png([0.9, 0.8], [True, True], tmp_path / "right.png", title="c")
    assert_png(tmp_path / "right.png")


def test_confidence_png_refuses_mismatched_arrays(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one length"):
        _report.confidence_png([0.9, 0.8], [True], tmp_path / "x.png", title="c")


def test_html_report(tmp_path: Path) -> None:
    report = sample_report()
    json.dumps(report, allow_nan=False)  # the page reads the JSON report itself
    images = {"sentiment reliability": "sentiment-reliability.png", "tone": "topic tone.png"}
    path = tmp_path / "report.html"
    _report.html_report(report, path, images=images, title="Eval of gemma")
    html = path.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    assert "<title>Eval of gemma</title>" in html
    # Question ids, escaped where they need it, and the facts.
    assert "<h2>sentiment</h2>" in html
    assert "<h2>topic &amp; tone</h2>" in html
    assert "<th>model</th><td>gemma-3-270m</td>" in html
    assert "<th>records</th><td>120</td>" in html
    # Metric values as rendered: 4 decimals, the interval beside them.
    metrics = report["questions"]["sentiment"]["metrics"]
    accuracy = metrics["accuracy"]
    assert f'<td class="num">{accuracy["value"]:.4f}</td>' in html
    assert f"[{accuracy['low']:.4f}, {accuracy['high']:.4f}]" in html
    assert f"{metrics['aurc']['value']:.4f}" in html
    assert "ECE, equal-width bins (10)" in html
    assert "95% bootstrap percentile, 50 resamples" in html
    # Per label, selective accuracy, order sensitivity and calibration (first question only).
    yes = report["questions"]["sentiment"]["per_label"]["yes"]
    assert f'<td>yes</td><td class="num">{yes["support"]}</td>' in html
    assert f"{yes['nll']['value']:.4f} [{yes['nll']['low']:.4f}, {yes['nll']['high']:.4f}]" in html
    assert '<td class="num">100%</td><td class="num">120</td>' in html
    assert html.count("<h3>Order sensitivity</h3>") == 1
    assert html.count("<h3>Calibration</h3>") == 1
    assert "<th>map</th><td>temperature</td>" in html
    assert "<th>held-out NLL after</th><td>0.8000</td>" in html
    # The images, by relative name (a space URL-quoted).
    assert '<img src="sentiment-reliability.png" alt="sentiment reliability">' in html
    assert '<img src="topic%20tone.png" alt="tone">' in html


def test_a_label_is_escaped(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    _report.html_report(sample_report(), path, images={})
    html = path.read_text(encoding="utf-8")
    assert "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_missing_metric_reads_as_a_dash() -> None:
    # Label c is never gold nor predicted: recall, precision, NLL and Brier are undefined.
    probabilities = [[0.7, 0.2, 0.1], [0.6, 0.3, 0.1]]
    metrics = evaluate(probabilities, [0, 1], resamples=0)
    labels = per_label(probabilities, [0, 1], ["a", "b", "c"], resamples=0)
    report = {"facts": {}, "questions": {"q": question_entry("abc", metrics, labels)}}
    html = _report.render_html(report, images={})
    dash = _report.MISSING
    row = f'<td>c</td><td class="num">0</td><td class="num">0</td><td class="num">{dash}</td>'
    assert row in html
    assert "<h3>Order sensitivity</h3>" not in html


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../up.png", "javascript:alert(1)", "a\\b.png", ""]
)
def test_an_image_outside_the_folder_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="relative to the page"):
        _report.render_html({"questions": {}}, images={"x": name})


def test_a_question_without_metrics_is_named() -> None:
    with pytest.raises(ValueError, match=r"'q7'.*'metrics'"):
        _report.render_html({"questions": {"q7": {"type": "choice"}}}, images={})


def test_a_question_without_labelled_items_and_one_with_raw_metrics() -> None:
    probabilities, gold = sample()
    metrics = evaluate(probabilities, gold, resamples=0)
    raw = evaluate(probabilities[::-1], gold, resamples=0)  # any other metrics will do
    labels = per_label(probabilities, gold, LABELS, resamples=0)
    calibrated = question_entry(LABELS, metrics, labels)
    calibrated["raw_metrics"] = raw.to_json()
    unlabelled = {"type": "choice", "labels": LABELS, "metrics": None, "per_label": None}
    report = {"facts": {}, "questions": {"calibrated": calibrated, "unlabelled": unlabelled}}
    html = _report.render_html(report, images={})
    assert "no labelled items" in html
    assert html.count("<h3>Metrics</h3>") == 1
    assert html.count("<h3>Per label</h3>") == 1
    assert "<h3>Metrics of the raw probabilities (before the calibration map)</h3>" in html
    assert f'<td class="num">{raw.accuracy.value:.4f}</td>' in html
