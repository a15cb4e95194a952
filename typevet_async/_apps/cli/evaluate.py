"""``typevet-async eval``: judge labelled JSONL records and write the report (reads,
metrics with intervals, reliability figures)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

import typevet_async as tv
from typevet_async._apps.cli.arguments import (
    AddCommand,
    non_negative_int,
    positive_int,
    question_flags,
    session_flags,
)
from typevet_async._apps.cli.exits import EXIT_FAILED_RECORDS, EXIT_OK, CommandLineError
from typevet_async._apps.cli.inputs import json_lines, questions_from_args, session_from_args
from typevet_async._core.statistics.labels import gold_indices, labelled_record

__all__ = ["add_parser", "evaluation_module", "run_eval"]


def add_parser(command: AddCommand) -> None:
    evaluation = command("eval", "Evaluate the answers on labelled JSONL records: the report.")
    evaluation.add_argument("input", type=Path, help="the labelled JSONL records (a file)")
    question_flags(evaluation)
    evaluation.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="the report's folder (reads.jsonl, report.json, report.html, PNGs)",
    )
    evaluation.add_argument(
        "--resume", action="store_true", help="continue DIR/reads.jsonl: skip records it has"
    )
    evaluation.add_argument(
        "--bins",
        type=positive_int,
        default=10,
        metavar="N",
        help="calibration bins (default: 10)",
    )
    evaluation.add_argument(
        "--resamples",
        type=non_negative_int,
        default=1000,
        metavar="N",
        help="bootstrap resamples of the intervals (default: 1000; 0: none)",
    )
    evaluation.add_argument(
        "--cache",
        type=Path,
        metavar="PATH",
        help="keep every read in the SQLite file PATH (created if missing) and take the reads "
        "it already holds from it: a re-run with the same model, server, template and records "
        "sends no read (default: none, every read is sent)",
    )
    evaluation.add_argument("--no-progress", action="store_true", help="no progress bar")
    session_flags(evaluation)


def evaluation_module() -> Any:
    """`tv` once its ``eval`` extra's names (``tv.evaluate``, ``tv.Evaluation``) load.

    :raises CommandLineError: the extra is not installed, naming what is missing.
    """
    try:
        tv.Evaluation  # noqa: B018 (loaded when first named)
    except ImportError as error:
        missing = error.__cause__.name if isinstance(error.__cause__, ImportError) else None
        raise CommandLineError(
            f"eval and calibrate need {missing or 'the eval extra'}: "
            "pip install 'typevet_async[eval]'"
        ) from None
    return tv


async def run_eval(args: argparse.Namespace, out: TextIO) -> int:
    module = evaluation_module()
    questions = questions_from_args(args)
    checked = list(questions.items())
    total = 0
    for number, record in json_lines(args.input):  # every line checked before any read
        try:
            _, _, labels = labelled_record(record)
            gold_indices(labels, checked)
        except tv.InvalidInputError as error:
            raise CommandLineError(f"{args.input} line {number}: {error}") from None
        total += 1
    records = (record for _, record in json_lines(args.input))
    cache = None if args.cache is None else tv.SqliteReadCache(args.cache)
    session = session_from_args(args, os.environ, cache=cache)
    bar = tqdm(
        total=total,
        unit="rec",
        disable=True if args.no_progress else None,
        file=sys.stderr,
    )
    async with contextlib.AsyncExitStack() as owned:
        if cache is not None:  # the command owns the cache: open before, closed after
            await owned.enter_async_context(cache)
        with bar:
            async with session:
                evaluation = await module.evaluate(
                    session,
                    records,
                    questions,
                    out=args.out / "reads.jsonl",
                    resume=args.resume,
                    on_progress=lambda progress: bar.update(1),
                )
    report = evaluation.write(args.out, bins=args.bins, resamples=args.resamples)
    print(_report_lines(report), file=out)
    print(_reads_line(evaluation.usage, cache), file=out)
    print(f"report: {args.out / 'report.html'}", file=out)
    return EXIT_FAILED_RECORDS if evaluation.failed else EXIT_OK


def _reads_line(usage: tv.Usage, cache: tv.SqliteReadCache | None) -> str:
    """What the run read: an eval measures the served model, so a re-run says whether it
    read it again or took the reads from ``--cache``."""
    line = f"reads sent: {usage.reads:,}"
    if cache is not None:
        line += f"; answered by the read cache {cache.path}: {usage.cache_hits:,}"
        if cache.failed_stores:  # a locked or full file: the run went on, uncached
            line += f"; reads it failed to store: {cache.failed_stores:,} (see the log)"
    return line


def _report_lines(report: Mapping[str, Any]) -> str:
    lines = [f"{'question':16} {'items':>6} {'accuracy':>9} {'NLL':>7} {'Brier':>7} {'ECE':>7}"]
    for question_id, entry in report["questions"].items():
        found = entry["metrics"]
        if found is None:
            lines.append(f"{question_id:16} {0:>6}")
            continue
        lines.append(
            f"{question_id:16} {entry['items']:>6} {found['accuracy']['value']:>9.3f} "
            f"{found['nll']['value']:>7.3f} {found['brier']['value']:>7.3f} "
            f"{found['ece_width']['value']:>7.3f}"
        )
    return "\n".join(lines)
