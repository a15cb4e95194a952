"""Record real llama.cpp reply bodies for the replay server (`benchmarks.replay_server`).

Starts the embedded llama.cpp server (Gemma 3 270M, the built-in ``gemma`` template, as the
live tests do) and saves, under ``benchmarks/recorded/llama_cpp/``, the bytes the server sent:

- ``POST /tokenize`` for every control the SDK probes, with and without a leading space
  (``tokenize.json``: content -> reply body);
- ``POST /completion`` scoring reads of the benchmarks' Noul prompt (the prompt the SDK itself
  rendered for ticket 0) at several K, as the SDK's own body builder makes them but without
  its ``response_fields`` (``completion_top{K}.json``, gzipped above 16 KB: the whole reply,
  real ``token`` and ``bytes`` fields included), and with them
  (``completion_top{K}_sdk_fields.json``: the very reply the SDK's request gets);
- the same read at K=64 with several ``response_fields`` lists, so the replay server's
  emulation of that field filter can be checked against the real server
  (``python -m benchmarks.replay_server --check``);
- ``/v1/models``, ``/props`` and the probe's ``/apply-template``.

``requests.json`` names each request. The replay server prefers the bodies recorded by
``scripts/record_replies.py`` under ``tests/fixtures/replies/llama_cpp/`` and falls back to
these.

    python -m benchmarks.record_llama_cpp_bodies [--ks 16 20 32 64 128 256 1024 4096]
"""

from __future__ import annotations

import argparse
import gzip
import json
import urllib.request
from pathlib import Path
from typing import Any

import anyio

import typevet_async as tv
from benchmarks._shared import ticket
from typevet_async._core.controls import PROBED_CONTROLS

OUT = Path(__file__).resolve().parent / "recorded" / "llama_cpp"
DEFAULT_KS = (16, 20, 32, 64, 128, 256, 1024, 2048, 4096)
GZIP_ABOVE = 16_000
QUESTIONS: dict[str, tv.Question] = {"refund": tv.Noul(instructions="Is a refund requested?")}
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


def send(url: str, method: str, path: str, body: Any = None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return bytes(response.read())


def completion_body(prompt: str, k: int) -> dict[str, Any]:
    """The SDK's own scoring body (cache on), whatever the current source builds."""
    from typevet_async._backends import llama_cpp_wire

    return dict(llama_cpp_wire.completion_body(prompt, k, cache_prompt=True))


async def sdk_prompt(url: str) -> str:
    async with tv.Session.llama_cpp(url) as session:
        judgment = await session.judge(ticket(0), QUESTIONS)
    return judgment.diagnostics["refund"].prompt


class Recorder:
    def __init__(self, url: str) -> None:
        OUT.mkdir(parents=True, exist_ok=True)
        self.url = url
        self.requests: dict[str, dict[str, Any]] = {}

    def record(self, name: str, method: str, path: str, body: Any = None) -> bytes:
        raw = send(self.url, method, path, body)
        compress = len(raw) > GZIP_ABOVE
        file = f"{name}.json.gz" if compress else f"{name}.json"
        (OUT / file).write_bytes(gzip.compress(raw, mtime=0) if compress else raw)
        self.requests[name] = {"file": file, "method": method, "path": path, "body": body}
        print(f"{file}: {len(raw):,} bytes")
        return raw

    def save(self, extra: dict[str, Any]) -> None:
        payload = {"requests": self.requests, **extra}
        text = json.dumps(payload, indent=1, ensure_ascii=False)
        (OUT / "requests.json").write_text(text + "\n")


def record(url: str, ks: list[int]) -> None:
    recorder = Recorder(url)
    prompt = anyio.run(sdk_prompt, url)
    for k in ks:
        body = completion_body(prompt, k)
        sdk_fields = body.pop("response_fields", None)
        recorder.record(f"completion_top{k}", "POST", "/completion", body)
        if sdk_fields:  # and the SDK's very request, fields filter included
            body = {**body, "response_fields": sdk_fields}
            recorder.record(f"completion_top{k}_sdk_fields", "POST", "/completion", body)
    for name, fields in RESPONSE_FIELDS_CHECKS.items():
        body = {**completion_body(prompt, 64), "response_fields": fields}
        recorder.record(f"completion_top64_{name}", "POST", "/completion", body)
    contents = sorted(
        {*PROBED_CONTROLS, *(c.strip() for c in PROBED_CONTROLS)}
        | {" " + c.strip() for c in PROBED_CONTROLS}
    )
    tokenized: dict[str, str] = {}
    for content in contents:
        reply = send(url, "POST", "/tokenize", {"content": content, "add_special": False})
        tokenized[content] = reply.decode()
    (OUT / "tokenize.json").write_text(json.dumps(tokenized, indent=0, ensure_ascii=False) + "\n")
    print(f"tokenize.json: {len(tokenized)} contents")
    recorder.record("models", "GET", "/v1/models")
    recorder.record("props", "GET", "/props")
    probe_body = {"messages": [{"role": "user", "content": "typevet-probe"}]}
    recorder.record("apply_template", "POST", "/apply-template", probe_body)
    recorder.save({"prompt": prompt, "ticket": ticket(0), "ks": ks})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--ks", type=int, nargs="+", default=list(DEFAULT_KS))
    parser.add_argument("--url", help="a running llama.cpp server (default: the embedded one)")
    args = parser.parse_args()
    if args.url:
        record(args.url, args.ks)
        return
    options = tv.ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=4)
    with tv.EmbeddedServer(options) as server:
        record(server.url, args.ks)


if __name__ == "__main__":
    main()
