"""The evaluation report files: a reliability diagram, a confidence histogram, one HTML page.

This is an I/O shell around `typevet_async._core.statistics.metrics`: it draws and writes files and
computes nothing but layout.

The figures use matplotlib's ``Figure`` with an Agg canvas directly, never pyplot: no global
figure registry to close, no backend switch, safe from any thread. A figure is freed when its
function returns.

The HTML page reads the JSON report itself, this shape (one question is built by
`typevet_async._apps.evaluation.evaluation.question_entry`)::

    {
      "facts": {"model": "...", "backend": "...", "template family": "...", "records": 200, ...},
      "questions": {
        "<question id>": {
          "type": "choice",
          "labels": ["yes", "no", ...],                       # option order
          "metrics": Metrics.to_json() or None,               # None: no labelled items
          "per_label": {"<label>": LabelMetrics.to_json(), ...} or None,
          "order_sensitivity": OrderSensitivity.to_json() or None,
          "calibration": {"<name>": str | number | None, ...} or None,
          "raw_metrics": Metrics.to_json() or None,           # optional: before a map
        },
        ...
      },
    }

Only "questions" and each question's "metrics" key are required; a table whose key is absent
or None is left out, and other keys are ignored. Facts and calibration items are shown as
given, in their order: strings as they are, floats to 4 decimals, nested values as compact
JSON. Every string reaches the page escaped (Jinja's autoescape): labels and ids may hold any
text. Images are referenced by relative file name, URL-quoted.
"""

from __future__ import annotations

import functools
import json
import math
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import attrs
import jinja2
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

from typevet_async._core.statistics.reliability import Bin

__all__ = [
    "confidence_png",
    "html_report",
    "reliability_png",
    "render_html",
]

FilePath = str | os.PathLike[str]

#: Shown where a metric is undefined (no support, nothing predicted).
MISSING = "\N{EN DASH}"
_DPI = 100
_ACCURACY_COLOUR = "#4c72b0"
_WRONG_COLOUR = "#dd8452"


# --- figures -------------------------------------------------------------------------------


def reliability_png(bins: Sequence[Bin], path: FilePath, *, title: str) -> None:
    """A reliability diagram: per non-empty bin, accuracy against its mean confidence.

    Above: each bin's span as a bar as high as its accuracy, the (mean confidence, accuracy)
    points joined, and the diagonal of perfect calibration. Below: the items in each bin.
    """
    figure = Figure(figsize=(5.5, 6.0), layout="constrained")
    FigureCanvasAgg(figure)
    curve, counts = figure.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    lefts = [b.lower for b in bins]
    # An equal-mass bin of tied confidences has no width: give it a visible sliver.
    widths = [max(b.upper - b.lower, 0.01) for b in bins]
    curve.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
    curve.bar(
        lefts,
        [b.accuracy for b in bins],
        width=widths,
        align="edge",
        color=_ACCURACY_COLOUR,
        alpha=0.3,
        edgecolor=_ACCURACY_COLOUR,
        label="bin accuracy",
    )
    curve.plot(
        [b.confidence for b in bins],
        [b.accuracy for b in bins],
        marker="o",
        color=_ACCURACY_COLOUR,
        label="accuracy at mean confidence",
    )
    curve.set(xlim=(0.0, 1.0), ylim=(0.0, 1.0), ylabel="accuracy")
    curve.set_title(title, parse_math=False)  # plain text: an id's "$" is no math markup
    curve.legend(loc="upper left", fontsize="small")
    bars = counts.bar(lefts, [b.count for b in bins], width=widths, align="edge", color="grey")
    counts.bar_label(bars, fontsize="x-small")
    counts.set(xlabel="confidence (top probability)", ylabel="items")
    counts.margins(y=0.25)
    figure.savefig(path, format="png", dpi=_DPI)


def confidence_png(
    confidences: ArrayLike, correct: ArrayLike, path: FilePath, *, title: str
) -> None:
    """A histogram of the top probability in 20 bins on [0, 1], correct and wrong stacked."""
    confidence = np.asarray(confidences, dtype=np.float64)
    right = np.asarray(correct, dtype=np.bool_)
    if confidence.ndim != 1 or confidence.shape != right.shape:
        raise ValueError(
            f"confidences and correct must be two 1-D arrays of one length; got shapes "
            f"{confidence.shape} and {right.shape}"
        )
    figure = Figure(figsize=(5.5, 3.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    axes.hist(
        [confidence[right], confidence[~right]],
        bins=[step / 20 for step in range(21)],
        stacked=True,
        color=[_ACCURACY_COLOUR, _WRONG_COLOUR],
        label=[f"correct ({int(right.sum())})", f"wrong ({int((~right).sum())})"],
    )
    axes.set(xlim=(0.0, 1.0), xlabel="confidence (top probability)", ylabel="items")
    axes.set_title(title, parse_math=False)  # plain text: an id's "$" is no math markup
    axes.legend(loc="upper left", fontsize="small")
    figure.savefig(path, format="png", dpi=_DPI)


# --- the report dict -----------------------------------------------------------------------


# --- the HTML page -------------------------------------------------------------------------


def html_report(
    report: Mapping[str, Any],
    path: FilePath,
    *,
    images: Mapping[str, str],
    title: str = "Evaluation report",
) -> None:
    """Write `render_html`'s page to ``path`` (UTF-8); the images sit next to it."""
    Path(path).write_text(render_html(report, images=images, title=title), encoding="utf-8")


def render_html(
    report: Mapping[str, Any], *, images: Mapping[str, str], title: str = "Evaluation report"
) -> str:
    """The report page: facts, then per question its metrics, per-label table, selective
    accuracy, order sensitivity and calibration, then the figures (caption -> file name)."""
    return _template().render(
        title=title,
        facts=[(str(name), _text(value)) for name, value in report.get("facts", {}).items()],
        questions=[_QuestionView.of(qid, entry) for qid, entry in report["questions"].items()],
        images=[(caption, _image_source(name)) for caption, name in images.items()],
    )


@attrs.frozen
class _Row:
    """A table row of formatted cells."""

    cells: tuple[str, ...]


@attrs.frozen
class _QuestionView:
    """One question's tables, every cell already text; None for a table not in the report."""

    qid: str
    kind: str
    labels: str
    note: str
    metrics: tuple[_Row, ...] | None
    raw_metrics: tuple[_Row, ...] | None
    per_label: tuple[_Row, ...] | None
    selective: tuple[_Row, ...] | None
    order_sensitivity: tuple[_Row, ...] | None
    calibration: tuple[_Row, ...] | None

    @classmethod
    def of(cls, qid: str, entry: Mapping[str, Any]) -> _QuestionView:
        metrics = _required(entry, "metrics", qid)  # None: no labelled items
        raw, labels = entry.get("raw_metrics"), entry.get("per_label")
        order, calibration = entry.get("order_sensitivity"), entry.get("calibration")
        return cls(
            qid=str(qid),
            kind=str(entry.get("type", "choice")),
            labels=", ".join(str(label) for label in entry.get("labels", ())),
            note="no labelled items" if metrics is None else _interval_note(metrics),
            metrics=None if metrics is None else _metric_rows(metrics),
            raw_metrics=None if raw is None else _metric_rows(raw),
            per_label=None if labels is None else _label_rows(labels),
            selective=None if metrics is None else _selective_rows(metrics),
            order_sensitivity=None if order is None else _order_rows(order),
            calibration=None if calibration is None else _scalar_rows(calibration),
        )


def _required(entry: Mapping[str, Any], key: str, qid: str) -> Any:
    if key not in entry:
        raise ValueError(f"question {qid!r} of the report has no {key!r}")
    return entry[key]


#: The metrics table: (key in Metrics, row name).
_METRIC_NAMES: tuple[tuple[str, str], ...] = (
    ("accuracy", "accuracy"),
    ("nll", "NLL (nats)"),
    ("brier", "Brier (multi-class)"),
    ("ece_width", "ECE, equal-width bins"),
    ("ece_mass", "ECE, equal-mass bins"),
    ("aurc", "AURC"),
)


def _metric_rows(metrics: Mapping[str, Any]) -> tuple[_Row, ...]:
    rows = [_Row(("items", str(metrics["count"]), ""))]
    for key, name in _METRIC_NAMES:
        if key.startswith("ece_"):
            name = f"{name} ({metrics['bins']})"
        rows.append(_Row((name, *_interval_cells(metrics[key]))))
    return tuple(rows)


def _interval_note(metrics: Mapping[str, Any]) -> str:
    return (
        f"intervals: {_percent(metrics['level'])} bootstrap percentile, "
        f"{metrics['resamples']} resamples"
    )


def _selective_rows(metrics: Mapping[str, Any]) -> tuple[_Row, ...]:
    return tuple(
        _Row(
            (
                _percent(point["coverage"]),
                str(point["kept"]),
                _text(point["accuracy"]),
                _text(point["threshold"]),
            )
        )
        for point in metrics["selective"]
    )


def _label_rows(labels: Mapping[str, Mapping[str, Any]]) -> tuple[_Row, ...]:
    return tuple(_label_row(label, values) for label, values in labels.items())


def _label_row(label: str, values: Mapping[str, Any]) -> _Row:
    return _Row(
        (
            str(label),
            str(values["support"]),
            str(values["predicted"]),
            _text(values["recall"]),
            _text(values["precision"]),
            _text(values["mean_probability"]),
            _interval_text(values["nll"]),
            _interval_text(values["brier"]),
            _interval_text(values["ece"]),
        )
    )


def _order_rows(order: Mapping[str, Any]) -> tuple[_Row, ...]:
    return (
        _Row(("items", str(order["items"]))),
        _Row(("option orders", str(order["rotations"]))),
        _Row(("flip rate (argmax not the same in every order)", _text(order["flip_rate"]))),
        _Row(("mean change of a probability", _text(order["mean_change"]))),
        _Row(("largest change of a probability", _text(order["max_change"]))),
    )


def _scalar_rows(values: Mapping[str, Any]) -> tuple[_Row, ...]:
    return tuple(_Row((str(name), _text(value))) for name, value in values.items())


def _interval_cells(interval: Mapping[str, Any] | None) -> tuple[str, str]:
    """(value, "[low, high]"), or (MISSING, "") for an undefined metric."""
    if interval is None:
        return MISSING, ""
    return _text(interval["value"]), f"[{_text(interval['low'])}, {_text(interval['high'])}]"


def _interval_text(interval: Mapping[str, Any] | None) -> str:
    """ "value [low, high]" in one cell, or MISSING."""
    return " ".join(cell for cell in _interval_cells(interval) if cell)


def _text(value: Any) -> str:
    """A cell: None as MISSING, floats to 4 decimals, nested values as compact JSON."""
    if value is None:
        return MISSING
    if isinstance(value, bool | int | str):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else str(value)
    return json.dumps(value, separators=(", ", ": "), default=str)


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _image_source(name: str) -> str:
    """A relative file name made a URL path; anything that could leave the folder is refused."""
    parts = PurePosixPath(name).parts
    if not name or name.startswith("/") or "\\" in name or ":" in name or ".." in parts:
        raise ValueError(f"an image must be a file name relative to the page; got {name!r}")
    return urllib.parse.quote(name)


@functools.cache
def _template() -> jinja2.Template:
    environment = jinja2.Environment(
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return environment.from_string(_PAGE)


_PAGE = """\
{% macro metrics_table(rows) %}
<table>
<tr><th>metric</th><th>value</th><th>interval</th></tr>
{% for row in rows %}
<tr><td>{{ row.cells[0] }}</td><td class="num">{{ row.cells[1] }}</td>\
<td class="num">{{ row.cells[2] }}</td></tr>
{% endfor %}
</table>
{% endmacro %}
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
body { font-family: system-ui, sans-serif; color: #222; line-height: 1.45;
       max-width: 68rem; margin: 2rem auto; padding: 0 1rem; }
h1 { font-size: 1.6rem; }
h2 { font-size: 1.3rem; margin-top: 2.5rem; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05rem; margin: 1.5rem 0 0.3rem; }
table { border-collapse: collapse; margin: 0.3rem 0 1rem; }
th, td { padding: 0.25rem 0.7rem; border-bottom: 1px solid #e6e6e6; text-align: left; }
th { background: #f5f5f5; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.note { color: #666; font-size: 0.9rem; }
figure { display: inline-block; margin: 0.5rem 1rem 1rem 0; vertical-align: top; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.9rem; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
{% if facts %}
<table class="facts">
{% for name, value in facts %}
<tr><th>{{ name }}</th><td>{{ value }}</td></tr>
{% endfor %}
</table>
{% endif %}
{% for q in questions %}
<section>
<h2>{{ q.qid }}</h2>
<p class="note">{{ q.kind }} question; options: {{ q.labels }}; {{ q.note }}</p>
{% if q.metrics is not none %}
<h3>Metrics</h3>
{{ metrics_table(q.metrics) }}
{% endif %}
{% if q.raw_metrics is not none %}
<h3>Metrics of the raw probabilities (before the calibration map)</h3>
{{ metrics_table(q.raw_metrics) }}
{% endif %}
{% if q.per_label is not none %}
<h3>Per label</h3>
<table>
<tr><th>label</th><th>support</th><th>predicted</th><th>recall</th><th>precision</th>\
<th>mean P</th><th>NLL [interval]</th><th>Brier [interval]</th>\
<th>class-wise ECE [interval]</th></tr>
{% for row in q.per_label %}
<tr><td>{{ row.cells[0] }}</td>{% for cell in row.cells[1:] %}<td class="num">{{ cell }}</td>\
{% endfor %}</tr>
{% endfor %}
</table>
<p class="note">NLL and Brier over the items whose gold is the label; class-wise ECE of
P(label) against the label being gold, over all items.</p>
{% endif %}
{% if q.selective is not none %}
<h3>Selective accuracy</h3>
<table>
<tr><th>coverage</th><th>items kept</th><th>accuracy</th><th>lowest confidence kept</th></tr>
{% for row in q.selective %}
<tr>{% for cell in row.cells %}<td class="num">{{ cell }}</td>{% endfor %}</tr>
{% endfor %}
</table>
{% endif %}
{% if q.order_sensitivity is not none %}
<h3>Order sensitivity</h3>
<table>
{% for row in q.order_sensitivity %}
<tr><th>{{ row.cells[0] }}</th><td class="num">{{ row.cells[1] }}</td></tr>
{% endfor %}
</table>
{% endif %}
{% if q.calibration is not none %}
<h3>Calibration</h3>
<table>
{% for row in q.calibration %}
<tr><th>{{ row.cells[0] }}</th><td>{{ row.cells[1] }}</td></tr>
{% endfor %}
</table>
{% endif %}
</section>
{% endfor %}
{% if images %}
<h2>Figures</h2>
{% for caption, source in images %}
<figure><img src="{{ source }}" alt="{{ caption }}"><figcaption>{{ caption }}</figcaption></figure>
{% endfor %}
{% endif %}
</body>
</html>
"""
