"""Evaluating a session's answers on labelled records, and fitting a calibration map on them.

`evaluate` judges labelled records through `Session.judge_many` (bounded concurrency and
memory, typed error items), keeps each question's probabilities, raw probabilities and
rotations with its gold option, and can append every record's reads to a JSONL file as it
goes, so a long run resumes where it stopped. The `Evaluation` it returns computes the report
(`typevet_async._core.statistics.metrics`), writes it (JSON, HTML, PNGs:
`typevet_async._apps.evaluation.report`) and fits
a pinned `CalibrationMap` (`typevet_async._core.statistics.fitting`).

This module needs the ``eval`` extra (numpy, scipy, matplotlib, jinja2); importing the SDK
does not import it.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import orjson

from typevet_async._apps.jsonl import (
    Resumable,
    read_resumable,
)
from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading.answers import Usage
from typevet_async._core.statistics import fitting, metrics
from typevet_async._core.statistics.calibration import (
    CalibrationMap,
    Pins,
    QuestionMap,
    Reading,
    question_hash,
)
from typevet_async._core.statistics.eval_reads import reads_line
from typevet_async._core.statistics.fitted_prior import FittedPrior
from typevet_async._core.statistics.reliability import Bin
from typevet_async._core.wires.jsonvalues import record_key
from typevet_async._core.wires.system_one import questions_from_system_one
from typevet_async._errors import InvalidInputError

log = logging.getLogger("typevet_async.eval")

__all__ = ["Evaluation", "QuestionReads", "question_entry", "read_lines"]

#: Bootstrap resamples of the report's intervals, unless the call says otherwise.
DEFAULT_RESAMPLES = 1000


@attrs.define
class QuestionReads:
    """One question's labelled reads, in the order judged."""

    #: Record id keys (`record_key`), for the held-out split.
    keys: list[str] = attrs.Factory(list)
    gold: list[int] = attrs.Factory(list)
    #: The answers' probabilities (calibrated, where a map applied), option order.
    probabilities: list[tuple[float, ...]] = attrs.Factory(list)
    #: Before any calibration map.
    raw: list[tuple[float, ...]] = attrs.Factory(list)
    #: Each rotation's probabilities (empty without permutations).
    rotations: list[tuple[tuple[float, ...], ...]] = attrs.Factory(list)

    def labelled(self, *, raw: bool = False) -> fitting.Labelled:
        rows = self.raw if raw else self.probabilities
        return fitting.Labelled(np.array(rows, dtype=np.float64), np.array(self.gold))


@attrs.define
class Evaluation:
    """Labelled reads of a question set, and what was read with what."""

    questions: tuple[tuple[str, Question], ...]
    pins: Pins
    readings: Mapping[str, Reading]
    #: The calibration map the answers went through, if any (its SHA-256 is in the report).
    calibration: CalibrationMap | None
    reads: dict[str, QuestionReads]
    records: int = 0
    failed: int = 0
    #: The first few failures, ``(record id, error type, message)``.
    failures: list[tuple[Any, str, str]] = attrs.Factory(list)
    #: What this run's judgments cost the server (none for records resumed from a file):
    #: ``reads`` sent, ``cache_hits`` answered by the session's read cache.
    usage: Usage = attrs.Factory(Usage)
    #: The fitted prior the answers were divided by, if any (its SHA-256 is in the report;
    #: None in an evaluation read back from its files).
    prior: FittedPrior | None = None

    @classmethod
    def from_reads(cls, path: str | os.PathLike[str]) -> Evaluation:
        """The evaluation a reads file (``evaluate(out=...)``) holds, with what it was made
        with (its ``.run.json``), to fit a map on without judging again.

        A last line cut short (a killed run) is left out, with a warning; any other line
        that is not what `evaluate` writes is refused.

        :raises InvalidInputError: either file is missing or not what `evaluate` writes, naming
            the file, the line and the problem.
        """
        reads = Path(path)
        facts_path = reads.with_name(reads.name + ".run.json")
        try:
            facts = orjson.loads(facts_path.read_bytes())
            questions = tuple(questions_from_system_one(facts["questions"]).items())
            readings = {qid: Reading(**reading) for qid, reading in facts["readings"].items()}
            if set(readings) != {qid for qid, _ in questions}:
                raise ValueError("its readings are not those of its questions")
            reads_of = {qid: QuestionReads() for qid, _ in questions}
            evaluation = cls(questions, Pins(**facts["pins"]), readings, None, reads_of)
        except (OSError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise InvalidInputError(
                f"{facts_path} is not an eval run's facts (typevet-async eval writes it next "
                f"to reads.jsonl): {error}"
            ) from None
        if read_lines(evaluation, reads, set(), then="run it again").cut_at is not None:
            log.warning(
                "%s: its last line was cut short (a killed run?): that record is left out", reads
            )
        return evaluation

    def add_line(self, line: Any) -> None:
        """Take one reads line (`evaluate`'s JSONL shape).

        :raises InvalidInputError: it is not one
        (`typevet_async._core.statistics.eval_reads.reads_line`);
            nothing of it is taken.
        """
        checked = reads_line(line, self.questions, self.readings)
        self.records += 1
        if checked.error is not None:
            self.failed += 1
            if len(self.failures) < 20:
                self.failures.append((checked.record_id, *checked.error))
            return
        key = record_key(checked.record_id)
        for question_id, read in checked.reads.items():
            target = self.reads[question_id]
            target.keys.append(key)
            target.gold.append(read.gold)
            target.probabilities.append(read.probabilities)
            target.raw.append(read.raw)
            target.rotations.append(read.rotations)

    def facts(self) -> dict[str, Any]:
        """The run's facts, as the report shows them."""
        rotations = sorted({reading.rotations for reading in self.readings.values()})
        return {
            "model": self.pins.model,
            "backend": self.pins.backend,
            "template family": self.pins.template_family,
            "question set": self.pins.questions,
            "records": self.records,
            "failed records": self.failed,
            "permutations": ", ".join(map(str, rotations)),
            "label prior": any(reading.label_prior for reading in self.readings.values()),
            "calibration": "none" if self.calibration is None else self.calibration.sha256,
            **({} if self.prior is None else {"prior": self.prior.sha256}),
        }

    def report(
        self, *, bins: int = 10, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
    ) -> dict[str, Any]:
        """The JSON report: per question, the metrics (with bootstrap intervals), per label,
        the order sensitivity (with permutations) and the raw metrics (with a map)."""
        options = {"bins": bins, "resamples": resamples, "seed": seed}
        questions: dict[str, Any] = {}
        for question_id, question in self.questions:
            reads = self.reads[question_id]
            labels = [option.label for option in question.options()]
            kind = type(question).__name__.lower()
            calibrated = self._calibration_facts(question_id)
            if not reads.gold:
                questions[question_id] = question_entry(
                    labels, None, None, kind=kind, items=0, calibration=calibrated
                )
                continue
            data = reads.labelled()
            raw_metrics = None
            if self.calibration is not None:
                raw = reads.labelled(raw=True)
                raw_metrics = metrics.evaluate(raw.probabilities, raw.gold, **options)
            order = None
            if reads.rotations and len(reads.rotations[0]) > 1:
                order = metrics.order_sensitivity(np.array(reads.rotations, dtype=np.float64))
            questions[question_id] = question_entry(
                labels,
                metrics.evaluate(data.probabilities, data.gold, **options),
                metrics.per_label(data.probabilities, data.gold, labels, **options),
                kind=kind,
                items=len(reads.gold),
                order_sensitivity=order,
                raw_metrics=raw_metrics,
                calibration=calibrated,
            )
        return {"facts": self.facts(), "questions": questions}

    def _calibration_facts(self, question_id: str) -> dict[str, Any] | None:
        """What the report shows of the map applied to a question (None: no map)."""
        if self.calibration is None:
            return None
        entry = self.calibration.questions[question_id]
        figures = entry.report
        kept = figures.get("kept", "none")
        return {
            "map": self.calibration.sha256,
            "transform": "none" if entry.transform is None else entry.transform.kind,
            "fitted on": entry.fitted_on or "-",
            "held-out NLL, raw": figures.get("heldout_nll_raw"),
            "held-out NLL, mapped": figures.get("heldout_nll", {}).get(kept),
        }

    def write(
        self,
        directory: str | os.PathLike[str],
        *,
        bins: int = 10,
        resamples: int = DEFAULT_RESAMPLES,
        seed: int = 0,
    ) -> dict[str, Any]:
        """Write ``report.json``, ``report.html`` and, per question, a reliability diagram and
        a confidence histogram (PNG) into ``directory``; returns the report."""
        from typevet_async._apps.evaluation import report as _report

        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        report = self.report(bins=bins, resamples=resamples, seed=seed)
        images: dict[str, str] = {}
        failed: list[str] = []
        for question_id, _ in self.questions:
            reads = self.reads[question_id]
            if not reads.gold:
                continue
            stem = _file_stem(question_id)
            entry = report["questions"][question_id]
            bins_width = [Bin(**item) for item in entry["metrics"]["bins_width"]]
            reliability, histogram = f"{stem}-reliability.png", f"{stem}-confidence.png"
            data = reads.labelled()
            confidence, correct = metrics.confidence_and_correct(data.probabilities, data.gold)
            figures = (
                (
                    reliability,
                    "reliability diagram",
                    functools.partial(
                        _report.reliability_png,
                        bins_width,
                        folder / reliability,
                        title=f"{question_id}: reliability",
                    ),
                ),
                (
                    histogram,
                    "confidence histogram",
                    functools.partial(
                        _report.confidence_png,
                        confidence,
                        correct,
                        folder / histogram,
                        title=f"{question_id}: confidence",
                    ),
                ),
            )
            for name, what, draw in figures:
                try:  # a figure that fails costs that figure, never the report
                    draw()
                except Exception as error:
                    problem = f"{question_id}: {what}: {type(error).__name__}: {error}"
                    log.warning("not drawn: %s", problem)
                    failed.append(problem)
                    continue
                images[f"{question_id}: {what}"] = name
        if failed:
            report["figures_not_drawn"] = failed
        (folder / "report.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
        _report.html_report(report, folder / "report.html", images=images)
        return report

    def fit(self, *, holdout: float = 0.3, seed: int = 0) -> CalibrationMap:
        """Fit a map per question on the raw probabilities of the records outside the held-out
        split (``holdout`` of them, by a hash of the id), and keep each only if it lowers the
        held-out NLL (`fitting.choose_transform`; its figures are in each entry's report)."""
        if not 0 < holdout < 1:
            raise InvalidInputError(f"holdout must be between 0 and 1, got {holdout!r}")
        fits: dict[str, fitting.Labelled] = {}
        heldouts: dict[str, fitting.Labelled] = {}
        for question_id, _ in self.questions:
            reads = self.reads[question_id]
            data = reads.labelled(raw=True)
            mask = np.array(
                [fitting.is_heldout(key, holdout, seed) for key in reads.keys], dtype=np.bool_
            )
            if not reads.gold:
                data = fitting.Labelled(np.zeros((0, 2)), np.zeros(0, dtype=np.int64))
                mask = np.zeros(0, dtype=np.bool_)
            fits[question_id], heldouts[question_id] = data.subset(~mask), data.subset(mask)
        kinds = {question_id: type(question).__name__ for question_id, question in self.questions}
        pooled = fitting.pooled_by_type(fits, kinds)
        entries: dict[str, QuestionMap] = {}
        for question_id, question in self.questions:
            best, figures = fitting.choose_transform(
                fits[question_id], heldouts[question_id], pooled[question_id]
            )
            figures["holdout"], figures["seed"] = holdout, seed
            entries[question_id] = QuestionMap(
                question_hash(question),
                self.readings[question_id],
                None if best is None else best.transform,
                "" if best is None else best.fitted_on,
                figures,
            )
        created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        return CalibrationMap(self.pins, entries, created)


#: Characters of a question id a figure's file name keeps.
_STEM_LENGTH = 48


def _file_stem(question_id: str) -> str:
    """A figure's file-name stem: the id itself where it is a short, plain name; otherwise its
    first characters made plain, and a digest of the whole id, so two ids never share files
    ("a b" and "a_b") and no name is too long for the file system."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in question_id)
    if safe == question_id and 0 < len(safe) <= _STEM_LENGTH:
        return safe
    digest = hashlib.sha256(question_id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{safe[:_STEM_LENGTH] or 'question'}-{digest}"


def question_entry(
    labels: Sequence[str],
    found: metrics.Metrics | None,
    per_label: Mapping[str, metrics.LabelMetrics] | None,
    *,
    kind: str = "choice",
    items: int | None = None,
    order_sensitivity: metrics.OrderSensitivity | None = None,
    raw_metrics: metrics.Metrics | None = None,
    calibration: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One question of the JSON report (the shape `typevet_async._apps.evaluation.report`
    renders)."""
    return {
        "type": kind,
        "labels": list(labels),
        "items": found.count if items is None and found is not None else (items or 0),
        "metrics": None if found is None else found.to_json(),
        "per_label": None
        if per_label is None
        else {label: each.to_json() for label, each in per_label.items()},
        "order_sensitivity": None if order_sensitivity is None else order_sensitivity.to_json(),
        "raw_metrics": None if raw_metrics is None else raw_metrics.to_json(),
        "calibration": None if calibration is None else dict(calibration),
    }


def read_lines(
    evaluation: Evaluation, path: Path, done: set[str], *, then: str = "resume again"
) -> Resumable:
    """Each reads line of ``path`` into ``evaluation`` (its record key into ``done``), and
    where the file continues (`typevet_async._apps.jsonl.read_resumable`: a last line cut short by
    a kill is judged again; any other bad line, or a record id a second time, is refused,
    naming it, and the half-filled evaluation is dropped with the command; ``then`` says what
    to do once the line is mended)."""
    first_seen: dict[str, int] = {}

    def take(number: int, line: Any) -> None:
        evaluation.add_line(line)
        key = record_key(line["id"])
        if key in first_seen:  # counted twice, a record would weigh twice in a fit
            raise InvalidInputError(
                f"the record id {key[:40]} is on line {first_seen[key]} already"
            )
        first_seen[key] = number
        done.add(key)

    return read_resumable(path, take, shape="a reads line", then=then)
