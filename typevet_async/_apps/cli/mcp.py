"""``typevet-async mcp``: the typed questions as Model Context Protocol tools over stdio."""

from __future__ import annotations

import argparse
import os
from typing import TextIO

from typevet_async._apps.cli.arguments import AddCommand, session_flags
from typevet_async._apps.cli.exits import EXIT_OK, CommandLineError
from typevet_async._apps.cli.inputs import session_from_args

__all__ = ["add_parser", "run_mcp"]


def add_parser(command: AddCommand) -> None:
    mcp = command("mcp", "Serve the typed questions as Model Context Protocol tools over stdio.")
    session_flags(mcp)


async def run_mcp(args: argparse.Namespace, out: TextIO) -> int:
    """``typevet-async mcp``: serve until the client closes stdin (or SIGTERM). ``out`` is not
    written: stdout is the protocol's."""
    try:
        from typevet_async._apps import mcp as _mcp
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != "mcp":
            raise
        raise CommandLineError(
            "typevet-async mcp needs the mcp extra: pip install 'typevet_async[mcp]'"
        ) from None
    session = session_from_args(args, os.environ)
    await _mcp.serve_stdio(session)
    # Only the interpreter's exit is left, and the MCP SDK's modules make its garbage
    # collections take about 0.6 s (measured; more on a busy machine), while a stdio client
    # sends SIGTERM 2 s after it closes our stdin. The session is closed: nothing left
    # needs collecting before the process ends.
    import gc

    gc.freeze()
    return EXIT_OK
