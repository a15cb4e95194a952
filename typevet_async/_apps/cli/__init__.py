"""The ``typevet-async`` command line: judge, batch, eval, calibrate, fit-prior, generate,
serve, mcp, serve-local; one module per command.

Backend, URL, model, API key and concurrency come from flags or the ``TYPEVET_*`` variables
(flags win); with no URL the embedded llama.cpp server is started.

Exit codes: 0 done; 1 a batch wrote an error line for some record (and went on); 2 the command
itself failed (a flag, a file, the server, an SDK error): one line on stderr, starting
``typevet-async: ``; 130 interrupted (Ctrl-C).

Only `exits` is imported here: ``serve-local``'s child process (``python -m
typevet_async._apps.cli.serve_local``) starts without the other commands' modules.
"""

from __future__ import annotations

import logging
import os
import sys

from typevet_async._apps.cli.exits import (
    EXIT_ERROR,
    EXIT_FAILED_RECORDS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    PROG,
    CommandLineError,
    fail,
    failure_message,
    unreachable_server,
)

__all__ = [
    "EXIT_ERROR",
    "EXIT_FAILED_RECORDS",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "CommandLineError",
    "main",
]


def _run(argv: list[str]) -> int:
    import anyio

    from typevet_async._apps.cli import serve_local
    from typevet_async._apps.cli.help_texts import EXAMPLES

    if argv[:1] == ["serve-local"]:  # its flags are the embedded server's own
        serve_local.main(argv[1:], prog=f"{PROG} serve-local", epilog=EXAMPLES["serve-local"])
        return EXIT_OK

    import asyncio

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
    from typevet_async._apps.cli.logs import configure_logging
    from typevet_async._apps.cli.parser import build_parser

    args = build_parser().parse_args(argv)
    # The servers log every request at INFO; a one-shot command only what went wrong.
    configure_logging(
        args, default=logging.INFO if args.command in ("serve", "mcp") else logging.WARNING
    )
    runners = {
        "judge": judge.run_judge,
        "batch": batch.run_batch,
        "eval": evaluate.run_eval,
        "calibrate": calibrate.run_calibrate,
        "fit-prior": fit_prior.run_fit_prior,
        "generate": generate.run_generate,
        "mcp": mcp.run_mcp,
    }
    try:
        if args.command == "serve":  # aiohttp's server runs on asyncio
            return asyncio.run(serve.run_serve(args, sys.stdout))
        return anyio.run(runners[args.command], args, sys.stdout)
    except Exception as error:
        url_given = bool(getattr(args, "base_url", None) or os.environ.get("TYPEVET_BASE_URL"))
        message = unreachable_server(error, args.command, url_given)
        if message is None:
            raise
        raise CommandLineError(message) from None


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code (see the module's docstring)."""
    try:
        return _run(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as done:  # --help
        return EXIT_OK if done.code is None else done.code if isinstance(done.code, int) else 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        message = failure_message(error)
        if message is None:
            raise
        return fail(message)
