"""Record real reply bodies: of every endpoint the SDK reads, on both servers, for the wire tests;
and of llama.cpp scoring reads at many K, for the benchmarks' replay server.

    .venv/bin/python scripts/record_replies.py [--only llama_cpp|vllm|system_one|
        openai_compatible|bodies|probe]
        [--ks 16 64 ...]

Starts the servers the way the live tests do (tests/live/conftest.py: the embedded llama.cpp
server with the built-in ``gemma`` template; tests/live/servers.py: vLLM on CPU with
``--logprobs-mode raw_logprobs``), sends each request body exactly as the SDK builds it (the
``*_wire`` body builders, on prompts the SDK itself rendered) and saves each reply's bytes as
the server sent them under tests/fixtures/replies/<server>/ (the top-4,096 read gzipped), with
``requests.json`` naming each request. tests/unit/test_wire.py decodes and mutates them.
``system_one`` records what ``typevet-async serve`` (the real command, no keys) answers in
front of that llama.cpp server: ``POST /v1/systemone`` and ``GET /v1/models``.

``--only bodies`` records, under benchmarks/client_cost/recorded/llama_cpp/, what
``benchmarks.client_cost.replay_server`` replays (it prefers the fixtures above where they have a
reply):

- ``POST /completion`` scoring reads of the benchmarks' Noul prompt (the prompt the SDK itself
  rendered for ticket 0) at each K of ``--ks``, as the SDK's body builder makes them but without
  its ``response_fields`` (``completion_top{K}.json``, gzipped above 16 KB: the whole reply,
  real ``token`` and ``bytes`` fields included), and with them
  (``completion_top{K}_sdk_fields.json``: the very reply the SDK's request gets);
- the same read at K=64 with several ``response_fields`` lists, so the replay server's
  emulation of that field filter can be checked against the real server
  (``python -m benchmarks.client_cost.replay_server --check``);
- ``POST /tokenize`` for every control the SDK probes, with and without a leading space
  (``tokenize.json``: content -> reply body); ``/v1/models``, ``/props`` and the probe's
  ``/apply-template``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import attrs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import typevet_async as tv  # noqa: E402
from benchmarks._shared import ticket  # noqa: E402
from tests.live.helpers import TICKET, questions  # noqa: E402
from tests.live.servers import VLLM_MODEL_ID, VllmServerProcess  # noqa: E402
from typevet_async._backends import (  # noqa: E402
    llama_cpp_wire,
    openai_compatible,
    openai_compatible_wire,
    system_one_wire,
    vllm_wire,
)
from typevet_async._backends.embedded import wait_healthy  # noqa: E402
from typevet_async._core.prompts.controls import PROBED_CONTROLS  # noqa: E402
from typevet_async._core.prompts.framing import (  # noqa: E402
    GEMMA_FRAMES,
    PROBE_MESSAGE,
    TRIM_PROBE_MESSAGE,
    TemplateFamily,
)
from typevet_async._core.prompts.layouts import Message  # noqa: E402
from typevet_async._core.prompts.markers import marker_runs  # noqa: E402
from typevet_async._core.statistics.content_free import CONTENT_FREE_STATES  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "replies"
BODIES = ROOT / "benchmarks" / "client_cost" / "recorded" / "llama_cpp"
DEFAULT_KS = (16, 20, 32, 64, 128, 256, 1024, 2048, 4096)
#: The benchmarks' question (`benchmarks.client_cost.bench_client_cost` and the replay server's
#: prompt).
BENCHMARK_QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul(instructions="Is a refund requested?")
}
#: Field filters whose real replies are kept to check the replay server's emulation.
RESPONSE_FIELDS_CHECKS: dict[str, list[str]] = {
    "fields_sdk_like": [
        "completion_probabilities",
        "generation_settings/n_probs",
        "tokens_evaluated",
        "timings/cache_n",
    ],
    "fields_into_array": ["completion_probabilities/0/top_logprobs"],
    "fields_whole_object": ["generation_settings", "missing_field"],
}
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
    def __init__(self, folder: Path, url: str) -> None:
        self.folder = folder
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

    def record_refusal(self, name: str, path: str, body: Any) -> bytes:
        """A request the server refuses (an HTTP error): its error body, kept as the rest."""
        try:
            self.record(name, "POST", path, body)
        except urllib.error.HTTPError as error:
            raw = error.read()
            (self.folder / f"{name}.json").write_bytes(raw)
            entry = {"file": f"{name}.json", "method": "POST", "path": path, "body": body}
            self.requests[name] = {**entry, "status": error.code}
            print(f"{self.folder.name}/{name}.json: HTTP {error.code}, {len(raw):,} bytes")
            return raw
        raise AssertionError(f"{name}: the server accepted the request")

    def save(self, extra: dict[str, Any] | None = None) -> None:
        """``requests.json``: the requests by name (with ``extra``: under ``"requests"``)."""
        payload = self.requests if extra is None else {"requests": self.requests, **extra}
        text = json.dumps(payload, indent=1, ensure_ascii=False)
        (self.folder / "requests.json").write_text(text + "\n")


async def scored(session: tv.Session) -> tv.Judgment:
    async with session:
        return await session.judge(TICKET, questions())


def llama_cpp_server(name: str) -> tv.EmbeddedServer:
    """The embedded server as the live tests start it (built-in ``gemma`` template)."""
    logs = tv.cache_dir() / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    options = tv.ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=4)
    return tv.EmbeddedServer(attrs.evolve(options, log_file=logs / f"{name}.log"))


#: Marker runs as a session puts them to the tokenizer (`Backend.special_runs`): a control
#: token, an unused one, ordinary markup, a user-defined image boundary, a run of ordinary
#: tokens, and characters whose pieces are bytes that are not UTF-8 on their own.
PIECES_CONTENT = "<start_of_turn>\n<unused5>\n<b>\n<start_of_image>\n[INST]\n<ǅꙮ𓂀>"


def record_llama_cpp() -> None:
    server = llama_cpp_server("record-gemma3")
    server.start()
    try:
        url = server.url
        judgment = anyio.run(scored, tv.Session.llama_cpp(url))
        route = judgment.diagnostics["route"]
        recorder = Recorder(OUT / "llama_cpp", url)
        for k in (64, 4096):
            body = llama_cpp_wire.completion_body(route.prompt, k, cache_prompt=True)
            recorder.record(f"completion_top{k}", "POST", "/completion", body, compress=k > 64)
        recorder.record("tokenize", "POST", "/tokenize", llama_cpp_wire.tokenize_body(" A"))
        body = llama_cpp_wire.tokenize_body(PIECES_CONTENT, with_pieces=True)
        recorder.record("tokenize_pieces", "POST", "/tokenize", body)
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


def record_openai_compatible() -> None:
    """llama.cpp's own ``/v1/chat/completions`` as `Session.openai_compatible` reads it: the
    probe's reads (a window of 64 here), a scoring read of the top 20, the same without
    ``top_logprobs`` and without ``logprobs``, ``/v1/models`` and ``/tokenize``."""
    server = llama_cpp_server("record-openai-compatible")
    server.start()
    try:
        url = server.url
        recorder = Recorder(OUT / "openai_compatible", url)
        wire = openai_compatible_wire
        letters, words = (Message("user", q) for q in openai_compatible.PROBE_QUESTIONS)
        ticket_message = Message("user", f"{TICKET}\n\nWhich team? A. billing B. shipping")
        for name, message, top in (
            ("probe_letters", letters, 64),
            ("probe_words", words, 64),
            ("chat_top20", ticket_message, 20),
        ):
            body = wire.scoring_body("gemma", [message], top, thinking_switch=True)
            recorder.record(name, "POST", "/v1/chat/completions", body)
        body = wire.scoring_body("gemma", [ticket_message], 20, thinking_switch=True)
        plain = {key: value for key, value in body.items() if "logprobs" not in key}
        recorder.record("chat_no_logprobs", "POST", "/v1/chat/completions", plain)
        recorder.record(
            "chat_no_top_logprobs", "POST", "/v1/chat/completions", {**body, "top_logprobs": 0}
        )
        recorder.record("models", "GET", "/v1/models")
        recorder.record("tokenize", "POST", "/tokenize", wire.tokenize_body("gemma", " A"))
        alone = {key: value for key, value in body.items() if key != "logprobs"}
        recorder.record_refusal("chat_top_logprobs_alone", "/v1/chat/completions", alone)
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
        recorder = Recorder(OUT / "vllm", url)
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def record_system_one() -> None:
    server = llama_cpp_server("record-system-one")
    server.start()
    port = _free_port()
    command = "from typevet_async._apps.cli import main; main()"
    serve = [sys.executable, "-c", command, "serve", "--base-url", server.url]
    gateway = subprocess.Popen([*serve, "--port", str(port), "--no-auth"])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 120.0, path="/readyz")
        recorder = Recorder(OUT / "system_one", url)
        body = system_one_wire.judgment_body("gemma-3-270m", TICKET, list(questions().items()))
        recorder.record("judgment", "POST", "/v1/systemone", body)
        recorder.record("models", "GET", "/v1/models")
        recorder.save()
    finally:
        gateway.terminate()
        gateway.wait(timeout=60)
        server.stop()


async def benchmark_prompt(url: str) -> str:
    async with tv.Session.llama_cpp(url) as session:
        judgment = await session.judge(ticket(0), BENCHMARK_QUESTIONS)
    return judgment.diagnostics["refund"].prompt


def record_bodies(ks: list[int]) -> None:
    server = llama_cpp_server("record-bodies")
    server.start()
    try:
        url = server.url
        recorder = Recorder(BODIES, url)
        prompt = anyio.run(benchmark_prompt, url)
        for k in ks:
            body = llama_cpp_wire.completion_body(prompt, k, cache_prompt=True)
            sdk_fields = body.pop("response_fields", None)
            big = k > 128  # above about 16 KB: gzipped
            recorder.record(f"completion_top{k}", "POST", "/completion", body, compress=big)
            if sdk_fields:  # and the SDK's very request, fields filter included
                body = {**body, "response_fields": sdk_fields}
                name = f"completion_top{k}_sdk_fields"
                recorder.record(name, "POST", "/completion", body, compress=big)
        for name, fields in RESPONSE_FIELDS_CHECKS.items():
            body = {**llama_cpp_wire.completion_body(prompt, 64, cache_prompt=True)}
            body["response_fields"] = fields
            recorder.record(f"completion_top64_{name}", "POST", "/completion", body)
        contents = sorted(
            {*PROBED_CONTROLS, *(c.strip() for c in PROBED_CONTROLS)}
            | {" " + c.strip() for c in PROBED_CONTROLS}
        )
        tokenized = {
            content: send(url, "POST", "/tokenize", llama_cpp_wire.tokenize_body(content)).decode()
            for content in contents
        }
        text = json.dumps(tokenized, indent=0, ensure_ascii=False)
        (BODIES / "tokenize.json").write_text(text + "\n")
        print(f"tokenize.json: {len(tokenized)} contents")
        recorder.record("models", "GET", "/v1/models")
        recorder.record("props", "GET", "/props")
        body = llama_cpp_wire.probe_template_body()
        recorder.record("apply_template", "POST", "/apply-template", body)
        recorder.save({"prompt": prompt, "ticket": ticket(0), "ks": ks})
    finally:
        server.stop()


def record_probe() -> None:
    """``probe.json``: the probe's requests beyond ``tokenize.json`` and ``apply_template``:
    each control tokenized in context (after the Gemma 3 frame's answer position), and the
    template's renderings of the whitespace probe and of the split layout's roles."""
    server = llama_cpp_server("record-probe")
    server.start()
    try:
        url = server.url
        context = GEMMA_FRAMES[TemplateFamily.GEMMA3].prefix(PROBE_MESSAGE)
        tokenized = {
            context + control: send(
                url, "POST", "/tokenize", llama_cpp_wire.tokenize_body(context + control)
            ).decode()
            for control in ("", *PROBED_CONTROLS)
        }
        # The content-free states' marker runs ("[MASK]"): a session asks whether they are
        # special tokens before a Score's prior is read (`Backend.special_runs`).
        for run in sorted(marker_runs(CONTENT_FREE_STATES)):
            for parse in (True, False):
                body = llama_cpp_wire.tokenize_body(run, parse_special=parse, with_pieces=True)
                tokenized.setdefault(run, send(url, "POST", "/tokenize", body).decode())
        renderings = []
        for body in (
            llama_cpp_wire.probe_template_body(TRIM_PROBE_MESSAGE),
            llama_cpp_wire.split_probe_body(),
            llama_cpp_wire.history_probe_body(),
        ):
            renderings.append(
                {"body": body, "reply": send(url, "POST", "/apply-template", body).decode()}
            )
        text = json.dumps({"tokenize": tokenized, "apply_template": renderings}, indent=1,
                          ensure_ascii=False)  # fmt: skip
        (BODIES / "probe.json").write_text(text + "\n")
        print(f"probe.json: {len(tokenized)} tokenizations, {len(renderings)} renderings")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        choices=["llama_cpp", "vllm", "system_one", "openai_compatible", "bodies", "probe"],
        help="one recording (default: the fixtures of both servers; bodies only when asked)",
    )
    parser.add_argument(
        "--ks", type=int, nargs="+", default=list(DEFAULT_KS), help="the K of each body read"
    )
    args = parser.parse_args()
    if args.only == "bodies":
        record_bodies(args.ks)
        return
    if args.only == "probe":
        record_probe()
        return
    if args.only in (None, "llama_cpp"):
        record_llama_cpp()
    if args.only in (None, "vllm"):
        record_vllm()
    if args.only in (None, "system_one"):
        record_system_one()
    if args.only in (None, "openai_compatible"):
        record_openai_compatible()


if __name__ == "__main__":
    main()
