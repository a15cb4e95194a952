"""``typevet-async generate``: one JSON value that passes a JSON Schema."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TextIO

from typevet_async._apps.cli.arguments import AddCommand, session_flags
from typevet_async._apps.cli.exits import EXIT_OK
from typevet_async._apps.cli.inputs import read_json_file, session_from_args

__all__ = ["add_parser", "run_generate"]


def add_parser(command: AddCommand) -> None:
    generate = command("generate", "Generate one JSON value that passes a JSON Schema.")
    generate.add_argument("prompt", help="the instructions, as one user message")
    generate.add_argument(
        "--schema",
        type=Path,
        required=True,
        metavar="FILE",
        help="a JSON Schema (Draft 2020-12) file; local $refs only",
    )
    session_flags(generate)  # --max-tokens among them: a value cut off by it is truncated


async def run_generate(args: argparse.Namespace, out: TextIO) -> int:
    schema = read_json_file(args.schema, "--schema")
    session = session_from_args(args, os.environ)
    async with session:
        result = await session.generate(args.prompt, schema=schema)
    print(json.dumps(result.value, indent=2, ensure_ascii=False), file=out)
    return EXIT_OK
