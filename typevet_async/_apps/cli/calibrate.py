"""``typevet-async calibrate``: fit a pinned calibration map on an eval run's reads."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final, TextIO

from typevet_async._apps.cli.arguments import AddCommand, fraction, non_negative_int
from typevet_async._apps.cli.evaluate import evaluation_module
from typevet_async._apps.cli.exits import EXIT_OK, CommandLineError, reason

__all__ = ["add_parser", "run_calibrate"]

#: The files eval writes in its folder: calibrate's --out must be none of them.
_EVAL_FILES: Final = ("reads.jsonl", "reads.jsonl.run.json", "report.json", "report.html")


def add_parser(command: AddCommand) -> None:
    calibrate = command("calibrate", "Fit a pinned calibration map on an eval report's reads.")
    calibrate.add_argument("report", type=Path, help="the folder eval wrote (its reads.jsonl)")
    calibrate.add_argument(
        "--out", type=Path, required=True, metavar="FILE", help="the map's JSON file"
    )
    calibrate.add_argument(
        "--holdout",
        type=fraction,
        default=0.3,
        metavar="F",
        help="the share of records held out to choose the map by (default: 0.3)",
    )
    calibrate.add_argument(
        "--seed", type=non_negative_int, default=0, help="the held-out split's seed (default: 0)"
    )


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.samefile(b)  # a hard link, or another path to it
    except OSError:
        return False


async def run_calibrate(args: argparse.Namespace, out: TextIO) -> int:
    for name in _EVAL_FILES:
        if _same_file(args.out, args.report / name):
            raise CommandLineError(
                f"--out {args.out} is the eval run's own {name}: writing the map there would "
                "replace it; give the map a file of its own"
            )
    evaluation = evaluation_module().Evaluation.from_reads(args.report / "reads.jsonl")
    calibration = evaluation.fit(holdout=args.holdout, seed=args.seed)
    try:
        args.out.write_bytes(calibration.to_json())
    except OSError as error:
        raise CommandLineError(f"cannot write --out {args.out}: {reason(error)}") from None
    for question_id, entry in calibration.questions.items():
        figures = entry.report
        kept = figures.get("kept", "none")
        raw = figures.get("heldout_nll_raw")
        if raw is None:
            shown = figures.get("why", "")
        elif kept == "none":
            shown = f"held-out NLL {raw:.4f}: no candidate lowered it, the raw answers stay"
        else:
            shown = f"held-out NLL {raw:.4f} -> {figures['heldout_nll'][kept]:.4f}"
        print(f"{question_id:16} {kept:20} {shown}", file=out)
    print(f"map: {args.out} ({calibration.sha256})", file=out)
    return EXIT_OK
