"""``typevet-async judge``: judge one state and print the typed answers (JSON, or a table)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TextIO

import typevet_async as tv
from typevet_async._apps.cli.arguments import (
    AddCommand,
    question_flags,
    session_flags,
)
from typevet_async._apps.cli.exits import EXIT_OK
from typevet_async._apps.cli.inputs import (
    questions_from_args,
    read_state,
    session_from_args,
)
from typevet_async._apps.presenting import judgment_fields

__all__ = ["add_parser", "run_judge"]


def add_parser(command: AddCommand) -> None:
    judge = command("judge", "Judge one state and print the typed answers (JSON, or --table).")
    judge.add_argument(
        "state",
        help="the state: the text itself; - to read stdin; @FILE to read a file; @@TEXT for "
        "the literal text @TEXT. Read text that parses as JSON is judged as that JSON value",
    )
    question_flags(judge)
    judge.add_argument("--table", action="store_true", help="print a readable table, not JSON")
    session_flags(judge)


def _table(judgment: tv.Judgment) -> str:
    lines = []
    for question_id, answer in judgment.items():
        if isinstance(answer, tv.NoulAnswer):
            shown = f"P(true) = {answer.noul:.3f}"
        elif isinstance(answer, tv.ChoiceAnswer):
            shown = f"{answer.choice}  " + " ".join(
                f"{k}={p:.2f}" for k, p in answer.probabilities.items()
            )
        else:
            shown = f"{answer.score:.2f}  ({answer.legend[round(answer.score)]})"
        lines.append(f"{question_id:16} {shown}   confidence {answer.confidence:.3f}")
    return "\n".join(lines)


async def run_judge(args: argparse.Namespace, out: TextIO) -> int:
    questions = questions_from_args(args)
    session = session_from_args(args, os.environ)
    state = read_state(args.state, sys.stdin)
    async with session:
        judgment = await session.judge(state, questions)
    if args.table:
        print(_table(judgment), file=out)
    else:
        data = judgment_fields(judgment)
        data.pop("diagnostics")
        print(json.dumps(data, indent=2, ensure_ascii=False), file=out)
    return EXIT_OK
