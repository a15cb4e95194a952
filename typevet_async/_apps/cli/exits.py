"""The command line's exit codes, its own failure, and how any failure reads on stderr."""

from __future__ import annotations

import sys
from typing import Final

import typevet_async as tv

__all__ = [
    "EXIT_ERROR",
    "EXIT_FAILED_RECORDS",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "PROG",
    "CommandLineError",
    "fail",
    "failure_message",
    "reason",
    "unreachable_server",
]

EXIT_OK: Final = 0
#: A batch wrote an error line for at least one record (it still judged every other one).
EXIT_FAILED_RECORDS: Final = 1
#: The command failed: one line on stderr.
EXIT_ERROR: Final = 2
EXIT_INTERRUPTED: Final = 130

PROG: Final = "typevet-async"


class CommandLineError(Exception):
    """The command line itself failed (a flag, a file, --out): printed as one line, exit 2."""


def reason(error: OSError) -> str:
    """An OS error's own words ("No such file or directory")."""
    return error.strerror or str(error)


def fail(message: str) -> int:
    """Print the failure as one line on stderr; `EXIT_ERROR`."""
    # One line, whatever the message holds (a server's reply may have line breaks).
    one_line = message.replace("\r", "\\r").replace("\n", "\\n")
    print(f"{PROG}: {one_line}", file=sys.stderr)
    return EXIT_ERROR


def failure_message(error: BaseException) -> str | None:
    """What a failure of the command says on its line; None for a bug (its traceback shows)."""
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return failure_message(error.exceptions[0])
    if isinstance(error, CommandLineError):
        return str(error)
    if isinstance(error, tv.TypevetError):
        return f"{type(error).__name__}: {error}"
    if isinstance(error, OSError):  # any other file or socket failure
        where = f": {error.filename}" if error.filename else ""
        return f"{type(error).__name__}: {reason(error)}{where}"
    return None


def unreachable_server(error: BaseException, command: str, url_given: bool) -> str | None:
    """What a failure to reach the server given by URL says, with what to do about it (the
    retries that came before it were for a server still starting); None for any other
    failure, or for the embedded server (no URL was given: it is this command's own)."""
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return unreachable_server(error.exceptions[0], command, url_given)
    if not url_given or not isinstance(error, tv.TransportError):
        return None
    return (
        f"{type(error).__name__}: {error}; is a model server running at that URL? Start it, "
        "or leave out --base-url (and TYPEVET_BASE_URL) and give --local-model MODEL to "
        f"start llama.cpp here (see '{PROG} {command} --help')"
    )
