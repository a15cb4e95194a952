"""``typevet-async serve``: the System One API (``POST /v1/systemone``) over a session."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TextIO

from typevet_async._apps import gateway
from typevet_async._apps.cli.arguments import (
    AddCommand,
    non_negative_int,
    port,
    positive_float,
    positive_int,
    session_flags,
)
from typevet_async._apps.cli.exits import EXIT_OK, CommandLineError, reason
from typevet_async._apps.cli.inputs import session_from_args

__all__ = ["add_parser", "run_serve"]


def add_parser(command: AddCommand) -> None:
    serve = command("serve", "Serve the System One API (POST /v1/systemone) over a session.")
    serve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)"
    )
    serve.add_argument("--port", type=port, default=8000, help="the port (default: 8000)")
    _auth_flags(serve)
    _limit_flags(serve)
    _trace_flags(serve)
    # --max-connections and --max-batch-states are the gateway's own caps here (the session's:
    # TYPEVET_MAX_CONNECTIONS, TYPEVET_MAX_BATCH_STATES).
    session_flags(serve, skip=("max_connections", "max_batch_states"))


def _auth_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--keys-file",
        type=Path,
        metavar="FILE",
        help="bearer keys, one per line (blank lines and # comments skipped)",
    )
    serve.add_argument(
        "--keys-env",
        metavar="VAR",
        help="an environment variable of comma-separated bearer keys, added to --keys-file's; "
        f"without it, {gateway.DEFAULT_KEYS_ENV} is read if set. A named file or variable that "
        "holds no key is an error (exit 2)",
    )
    serve.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without bearer keys: anyone who reaches the port can use the model. "
        "Without keys and without this flag, serve refuses to start (exit 2)",
    )


def _trace_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--forward-tracestate-baggage",
        action="store_true",
        help="forward the caller's W3C tracestate and baggage headers to the model server "
        "(with OpenTelemetry on). By default they stop at the gateway: their content is the "
        "caller's choice; the caller's traceparent is joined either way",
    )


def _limit_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--max-connections",
        type=positive_int,
        default=None,
        metavar="N",
        help="open connections at once; one more closes the connection idle longest, or is "
        "answered 503 and closed when every one has a request in progress (default: half the "
        "process's file-descriptor limit)",
    )
    serve.add_argument(
        "--max-questions",
        type=positive_int,
        default=400,
        metavar="N",
        help="questions a request may ask; past it a 422 naming the limit (default: 400)",
    )
    serve.add_argument(
        "--max-batch-states",
        type=positive_int,
        default=64,
        metavar="N",
        help="states a POST /v1/systemone/batch may carry; past it a 422 naming the limit "
        "(default: 64; at most --max-active-requests plus the queue)",
    )
    serve.add_argument(
        "--max-active-requests",
        type=positive_int,
        default=8,
        metavar="N",
        help="requests judged at once (default: 8)",
    )
    serve.add_argument(
        "--max-queue",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="requests that may wait for a slot at most; one more is a 429 with Retry-After "
        f"(default: {gateway.DEFAULT_AUTO_QUEUE} before anything is measured, then "
        f"{gateway.MAX_AUTO_QUEUE}); once service times are measured, a request that would not "
        "be judged within --request-deadline behind those admitted is a 429 at once",
    )
    serve.add_argument(
        "--request-deadline",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="seconds per request, its wait for a slot included; past it a 504 (default: 60)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=gateway.DEFAULT_MAX_BODY_BYTES,
        metavar="N",
        help="the largest request body, compressed or decompressed; past it a 413 "
        f"(default: {gateway.DEFAULT_MAX_BODY_BYTES})",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="seconds a shutdown waits for in-flight requests (default: 30)",
    )


async def run_serve(args: argparse.Namespace, out: TextIO) -> int:
    keys_env = args.keys_env
    if keys_env is None and os.environ.get(gateway.DEFAULT_KEYS_ENV, "").strip():
        keys_env = gateway.DEFAULT_KEYS_ENV
    try:
        keys = gateway.load_keys(args.keys_file, keys_env, os.environ)
    except (OSError, UnicodeDecodeError) as error:
        why = reason(error) if isinstance(error, OSError) else "not UTF-8 text"
        raise CommandLineError(f"--keys-file {args.keys_file}: cannot read it: {why}") from None
    except gateway.NoKeysError as error:
        raise CommandLineError(f"{error}: auth would be off; give keys, or --no-auth") from None
    if keys and args.no_auth:
        raise CommandLineError("--no-auth with bearer keys: choose one")
    if not keys and not args.no_auth:
        raise CommandLineError(
            f"no bearer keys: give --keys-file FILE or --keys-env VAR (or set "
            f"{gateway.DEFAULT_KEYS_ENV}), or pass --no-auth to serve without auth"
        )
    config = gateway.GatewayConfig(
        keys=keys,
        max_questions=args.max_questions,
        max_batch_states=args.max_batch_states,
        max_connections=args.max_connections,
        max_active_requests=args.max_active_requests,
        max_queue=args.max_queue,
        request_deadline=args.request_deadline,
        max_body_bytes=args.max_body_bytes,
        shutdown_timeout=args.shutdown_timeout,
        forward_tracestate_baggage=args.forward_tracestate_baggage,
    )
    session = session_from_args(args, os.environ)
    await gateway.serve(session, config, args.host, args.port)
    return EXIT_OK
