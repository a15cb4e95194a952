"""The command line's parser: one subcommand per module of this package, each adding its own
flags."""

from __future__ import annotations

import argparse

import typevet_async as tv
from typevet_async._apps.cli import (
    batch,
    calibrate,
    evaluate,
    fit_prior,
    generate,
    judge,
    mcp,
    serve,
)
from typevet_async._apps.cli.arguments import CommandParser
from typevet_async._apps.cli.exits import PROG
from typevet_async._apps.cli.help_texts import EXAMPLES, EXIT_CODES
from typevet_async._apps.cli.logs import logging_flags

__all__ = ["build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog=PROG,
        description="Typed questions to language-model servers, typed answers with probabilities.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {tv.__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="the command; COMMAND --help"
    )

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name != "serve-local":  # its flags are the embedded server's own
            logging_flags(parser)
        return parser

    for module in (judge, batch, evaluate, calibrate, fit_prior, generate, serve, mcp):
        module.add_parser(command)
    # Its flags are the embedded server's own (serve_local.build_parser): listed here only.
    command("serve-local", "Run the embedded llama.cpp server in the foreground.").add_argument(
        "options",
        nargs=argparse.REMAINDER,
        help="--model NAME|GGUF, --host, --port, --ctx-size, --parallel, ...: see "
        "serve-local --help",
    )
    return parser
