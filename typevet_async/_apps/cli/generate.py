"""``typevet-async generate``: one JSON value that passes a JSON Schema."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TextIO

import typevet_async as tv
from typevet_async._apps.cli.arguments import AddCommand, connection_flags, positive_int
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
    generate.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="the most tokens to generate (default: the session's, 512); a value cut off "
        "by it is a TruncatedOutputError",
    )
    connection_flags(generate)


async def run_generate(args: argparse.Namespace, out: TextIO) -> int:
    schema = read_json_file(args.schema, "--schema")
    session = session_from_args(args, os.environ)
    max_tokens = tv.UNSET if args.max_tokens is None else args.max_tokens
    async with session:
        result = await session.generate(args.prompt, schema=schema, max_tokens=max_tokens)
    print(json.dumps(result.value, indent=2, ensure_ascii=False), file=out)
    return EXIT_OK
