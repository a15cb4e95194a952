"""The embedded default backend: llama.cpp's own HTTP server (xllamacpp) with a local model.

The models are those of `typevet_async._backends.local_models` (by default Gemma 3 270M, a
small base model; ``qwen2.5-coder-1.5b`` is a real instruction model), assembled once into the
cache folder. The server runs in a child process (so it never shares the
caller's GIL) on a free port, and exits when its parent closes its stdin, or dies.

`AsyncLlamaCpp` starts and stops it for a session with no URL (``Session.local``);
``typevet-async serve-local`` serves it in the foreground.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from typevet_async._backends.local_models import (
    DEFAULT_LOCAL_MODEL,
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
            "typevet_async._apps.cli.serve_local",
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
        #: What decides this server's reads whatever port it listens on (set by `start`):
        #: part of the read cache's key of a session on it (`AsyncLlamaCpp.read_identity`).
        self.read_identity: dict[str, Any] | None = None

    def start(self) -> str:
        model_path = self.options.model_path or ensure_model(self.options.model)
        self.read_identity = _read_identity(self.options, model_path)
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


def _read_identity(options: ServerOptions, model_path: Path) -> dict[str, Any]:
    """What decides the reads of a server started with ``options`` on ``model_path``: the
    model file (a local model by the sha256 it was verified against, any other GGUF by its
    path, size and modification time), the template, the context and slots, the sliding-window
    cache and the llama.cpp build (xllamacpp's version); not the port, new at each start."""
    if options.model_path is None:
        model: dict[str, Any] = {"name": options.model, "sha256": local_model(options.model).sha256}
    else:
        stat = model_path.stat()
        model = {
            "path": str(model_path.resolve()),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
        }
    try:
        build: str | None = importlib.metadata.version("xllamacpp")
    except importlib.metadata.PackageNotFoundError:
        build = None
    return {
        "model": model,
        "chat_template": options.chat_template,
        "jinja": options.jinja,
        "n_ctx": options.n_ctx,
        "n_parallel": options.n_parallel,
        "swa_full": options.swa_full,
        "xllamacpp": build,
    }


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


def local_model_name(environ: Mapping[str, str]) -> str:
    """``TYPEVET_LOCAL_MODEL`` if set (checked), else the default local model.

    :raises ConfigurationError: it names no local model.
    """
    name = environ.get("TYPEVET_LOCAL_MODEL", "").strip() or DEFAULT_LOCAL_MODEL
    try:
        return local_model(name).name
    except ConfigurationError as error:
        raise ConfigurationError(f"TYPEVET_LOCAL_MODEL: {error}") from None
