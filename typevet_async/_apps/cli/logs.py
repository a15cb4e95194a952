"""The command line's logs: ``-v``/``-vv`` and ``--log-format text|json`` on every command,
one handler on stderr for the ``typevet_async`` logger hierarchy (stdout carries only the
command's output, MCP's protocol among it).

JSON lines come from python-json-logger: one object per record, ``time``, ``level``,
``name``, ``message`` and the record's structured fields (the SDK's ``extra``:
``question_id``, ``attempts``, ``status``, ``duration_ms``, ...), what a log pipeline indexes.
"""

from __future__ import annotations

import argparse
import logging
import sys

__all__ = ["configure_logging", "logging_flags"]

#: The level of each ``-v`` count: 0 warnings (escalations), 1 info (retries too), 2 debug
#: (every read and judgment).
_LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)
_TEXT = "%(asctime)s %(name)s %(levelname)s %(message)s"
#: The SDK's logger of each retry of a transient failure.
_RETRIES = "typevet_async.retry"


class _RetriesAtInfo(logging.Filter):
    """A retry is the client waiting for a server that may be starting, not a problem: on the
    command line it is an INFO record (-v shows it). If the retries fail, the command's own
    failure line says what went wrong and what to do; if one succeeds, nothing went wrong."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self._level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == _RETRIES and record.levelno == logging.WARNING:
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return record.levelno >= self._level


def logging_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logs (on stderr)")
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more log records: -v info (retries too), -vv debug (each read and judgment); "
        "default: warnings (escalations; serve and mcp: info)",
    )
    group.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text lines (default) or one JSON object per record, with its structured fields",
    )


def configure_logging(args: argparse.Namespace, *, default: int = logging.WARNING) -> None:
    """One stderr handler on the ``typevet_async`` logger (and the root logger's level for
    the libraries'), unless the program that called `main` configured logging itself."""
    if logging.getLogger().handlers:
        return
    verbose = getattr(args, "verbose", 0)
    level = min(default, _LEVELS[min(verbose, len(_LEVELS) - 1)])
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RetriesAtInfo(level))
    if getattr(args, "log_format", "text") == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "{asctime}{levelname}{name}{message}",
                style="{",
                rename_fields={"asctime": "time", "levelname": "level"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter(_TEXT))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("typevet_async").setLevel(level)
