"""Record real reply bodies of every endpoint the SDK reads, on both servers, for the wire tests.

    .venv/bin/python scripts/record_replies.py [--only llama_cpp|vllm]

Starts the servers the way the live tests do (tests/live/conftest.py: the embedded llama.cpp
server with the built-in ``gemma`` template; tests/live/servers.py: vLLM on CPU with
``--logprobs-mode raw_logprobs``), sends each request body exactly as the SDK builds it (the
``*_wire`` body builders, on prompts the SDK itself rendered) and saves each reply's bytes as
the server sent them under tests/fixtures/replies/<server>/ (the top-4,096 read gzipped), with
``requests.json`` naming each request. tests/unit/test_wire.py decodes and mutates them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import attrs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import typevet_async as tv  # noqa: E402
from tests.live.helpers import TICKET, questions  # noqa: E402
from tests.live.servers import VLLM_MODEL_ID, VllmServerProcess  # noqa: E402
from typevet_async._backends import llama_cpp_wire, vllm_wire  # noqa: E402
from typevet_async._core.layouts import Message  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "replies"
SCHEMA = {
    "type": "object",
    "properties": {"team": {"type": "string", "enum": ["billing", "shipping", "technical"]}},
    "required": ["team"],
}


def send(url: str, method: str, path: str, body: Any = None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return bytes(response.read())


class Recorder:
    def __init__(self, server: str, url: str) -> None:
        self.folder = OUT / server
        self.folder.mkdir(parents=True, exist_ok=True)
        self.url = url
        self.requests: dict[str, dict[str, Any]] = {}

    def record(
        self, name: str, method: str, path: str, body: Any = None, *, compress: bool = False
    ) -> bytes:
        raw = send(self.url, method, path, body)
        file = f"{name}.json.gz" if compress else f"{name}.json"
        data = gzip.compress(raw, mtime=0) if compress else raw
        (self.folder / file).write_bytes(data)
        self.requests[name] = {"file": file, "method": method, "path": path, "body": body}
        print(f"{self.folder.name}/{file}: {len(raw):,} bytes ({len(data):,} stored)")
        return raw

    def save(self) -> None:
        text = json.dumps(self.requests, indent=1, ensure_ascii=False)
        (self.folder / "requests.json").write_text(text + "\n")


async def scored(session: tv.Session) -> tv.Judgment:
    async with session:
        return await session.judge(TICKET, questions())


def record_llama_cpp() -> None:
    logs = tv.cache_dir() / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    options = tv.ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=4)
    server = tv.EmbeddedServer(attrs.evolve(options, log_file=logs / "record-gemma3.log"))
    server.start()
    try:
        url = server.url
        judgment = anyio.run(scored, tv.Session.llama_cpp(url))
        route = judgment.diagnostics["route"]
        recorder = Recorder("llama_cpp", url)
        for k in (64, 4096):
            body = llama_cpp_wire.completion_body(route.prompt, k, cache_prompt=True)
            recorder.record(f"completion_top{k}", "POST", "/completion", body, compress=k > 64)
        recorder.record("tokenize", "POST", "/tokenize", llama_cpp_wire.tokenize_body(" A"))
        recorder.record(
            "apply_template", "POST", "/apply-template", llama_cpp_wire.probe_template_body()
        )
        recorder.record("models", "GET", "/v1/models")
        recorder.record("props", "GET", "/props")
        request = tv.GenerationRequest(f"Route this ticket: {TICKET}", SCHEMA, (), 64)
        body = llama_cpp_wire.generation_body(request)
        recorder.record("chat_generation", "POST", "/v1/chat/completions", body)
        recorder.save()
    finally:
        server.stop()


def record_vllm() -> None:
    server = VllmServerProcess("record-vllm")
    server.start()
    try:
        url = server.url
        judgment = anyio.run(scored, tv.Session.vllm(url, model=VLLM_MODEL_ID))
        route = judgment.diagnostics["route"]
        ids = [token for token, _ in route.candidates]
        recorder = Recorder("vllm", url)
        body = vllm_wire.scoring_body(VLLM_MODEL_ID, [Message("user", route.prompt)], ids)
        recorder.record("chat_scoring", "POST", "/v1/chat/completions", body)
        request = tv.GenerationRequest(f"Route this ticket: {TICKET}", SCHEMA, (), 64)
        body = vllm_wire.generation_body(VLLM_MODEL_ID, request)
        recorder.record("chat_generation", "POST", "/v1/chat/completions", body)
        body = vllm_wire.tokenize_body(VLLM_MODEL_ID, " A")
        recorder.record("tokenize_prompt", "POST", "/tokenize", body)
        body = vllm_wire.render_body(VLLM_MODEL_ID)
        recorder.record("tokenize_messages", "POST", "/tokenize", body)
        recorder.record("models", "GET", "/v1/models")
        recorder.save()
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["llama_cpp", "vllm"])
    only = parser.parse_args().only
    if only in (None, "llama_cpp"):
        record_llama_cpp()
    if only in (None, "vllm"):
        record_vllm()


if __name__ == "__main__":
    main()
