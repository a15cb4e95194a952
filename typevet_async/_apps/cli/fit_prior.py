"""``typevet-async fit-prior``: fit a pinned prior on unlabelled JSONL records
(`Session.fit_prior`) and write its artefact, for ``--prior`` on later runs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

import typevet_async as tv
from typevet_async._apps.cli.arguments import AddCommand, question_flags, session_flags
from typevet_async._apps.cli.exits import EXIT_OK, CommandLineError, reason
from typevet_async._apps.cli.inputs import json_lines, questions_from_args, session_from_args

__all__ = ["add_parser", "run_fit_prior"]


def add_parser(command: AddCommand) -> None:
    fit = command("fit-prior", "Fit a pinned prior on unlabelled JSONL records (no labels).")
    fit.add_argument("input", type=Path, help="the unlabelled JSONL records (a file)")
    question_flags(fit)
    fit.add_argument(
        "--out", type=Path, required=True, metavar="FILE", help="the prior's JSON file"
    )
    fit.add_argument("--no-progress", action="store_true", help="no progress bar")
    # The states are read as they are answered: no map or prior applies to them.
    session_flags(fit, skip=("calibration", "prior"))


def _states(path: Path) -> Iterator[tuple[int, Any]]:
    """Each record's line number and state (``{"id", "state", ...}``: its state; any other
    JSON value: a bare state), read as it goes; blank lines skipped.

    :raises CommandLineError: the file cannot be read, or a line is not JSON (naming it).
    """
    for number, data in json_lines(path):
        is_record = isinstance(data, dict) and {"id", "state"} <= set(data)
        yield number, data["state"] if is_record else data


def _shown(question: tv.Question, prior: tv.BatchPrior) -> str:
    if prior.probabilities is None:
        return f"no prior: {prior.skipped}"
    labels = [option.label for option in question.options()]
    pairs = zip(labels, prior.probabilities, strict=True)
    return "prior " + " ".join(f"{label}={p:.3f}" for label, p in pairs)


async def run_fit_prior(args: argparse.Namespace, out: TextIO) -> int:
    questions = questions_from_args(args)
    if args.out.exists() and args.out.resolve() == args.input.resolve():
        raise CommandLineError(f"--out {args.out} is the input: give the prior a file of its own")
    total = sum(1 for _ in _states(args.input))  # every line checked before any read
    session = session_from_args(args, os.environ)
    bar = tqdm(total=total, unit="rec", disable=True if args.no_progress else None, file=sys.stderr)

    def judged(_: tv.Progress) -> None:
        bar.update(1)

    with bar:
        async with session:
            prior = await session.fit_prior(
                (state for _, state in _states(args.input)),
                questions,
                on_progress=judged,
            )
    try:
        args.out.write_bytes(prior.to_json())
    except OSError as error:
        raise CommandLineError(f"cannot write --out {args.out}: {reason(error)}") from None
    for question_id, entry in prior.questions.items():
        shown = _shown(questions[question_id], entry.prior)
        print(f"{question_id:16} {entry.prior.items:>6} states  {shown}", file=out)
    print(f"prior: {args.out} ({prior.sha256})", file=out)
    return EXIT_OK
