"""The SDK client's own cost: CPU per question and memory while streaming a large batch.

A `CannedLlamaCppServer` (an aiohttp.web app on 127.0.0.1, in a CHILD process so its CPU is
not counted) answers the probe endpoints and every ``POST /completion`` at once with
pre-serialised bytes: ``n_probs`` entries, the controls' token ids first, then filler ids.
The session asks for a small read (``top_k=16``) so the server stays cheap.

Each size runs in a fresh client subprocess: open a session (``max_concurrency=64``), probe,
warm up with a short batch, then stream N states from a generator (never a list) through
``session.judge_many(..., max_in_flight=64)``. Measured in that subprocess: process CPU time
(``time.process_time``) per question, and peak RSS (``ru_maxrss``) after the warm-up and after
the N questions; RSS growth is the difference. The current RSS is also sampled at every tenth
of the run, to show whether it stays flat.

    python -m benchmarks.bench_client_cost [--sizes 10000 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

import typevet_async as tv

CONCURRENCY = 64
TOP_K = 16
WARM_UP = 500
QUESTIONS: dict[str, tv.Question] = {"refund": tv.Noul(instructions="Is a refund requested?")}
ISSUES = (
    "I was charged twice for order {n} and want my money back.",
    "My parcel {n} has been stuck in transit for three weeks.",
    "The app crashes when I open settings (build {n}).",
    "Please send a VAT invoice for order {n} by Friday.",
    "The jacket from order {n} is the wrong size, can I return it?",
    "Order {n} arrived with a cracked screen.",
)
#: The ids a read puts first: the digit controls (a Noul uses 0 and 1).
LEADING_CONTROLS = tuple("0123456789")
FILLER_BASE = 200_000


class CannedLlamaCppServer:
    """Answers like llama.cpp's server, instantly, from canned (mostly pre-serialised) bytes."""

    def __init__(self) -> None:
        self.token_ids: dict[str, int] = {}
        self._completions: dict[tuple[int, int], bytes] = {}
        self._template = orjson.dumps(
            {"prompt": "<start_of_turn>user\ntypevet-probe<end_of_turn>\n<start_of_turn>model\n"}
        )
        self._models = orjson.dumps(
            {"data": [{"id": "canned", "aliases": [], "meta": {"n_vocab": 262144}}]}
        )
        self._props = orjson.dumps({"modalities": {"vision": False}, "media_marker": "<__media__>"})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/apply-template", self.apply_template)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/props", self.props)
        app.router.add_post("/completion", self.completion)
        return app

    @staticmethod
    def _json(body: bytes) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    async def apply_template(self, request: web.Request) -> web.Response:
        await request.read()
        return self._json(self._template)

    async def models(self, request: web.Request) -> web.Response:
        return self._json(self._models)

    async def props(self, request: web.Request) -> web.Response:
        return self._json(self._props)

    async def tokenize(self, request: web.Request) -> web.Response:
        """One token per content; a distinct id per distinct content."""
        content = str(orjson.loads(await request.read())["content"])
        token_id = self.token_ids.setdefault(content, 100 + len(self.token_ids))
        return self._json(orjson.dumps({"tokens": [{"id": token_id, "piece": content}]}))

    async def completion(self, request: web.Request) -> web.Response:
        n_probs = int(orjson.loads(await request.read())["n_probs"])
        key = (n_probs, len(self.token_ids))
        body = self._completions.get(key)
        if body is None:
            body = self._completions[key] = self._completion_bytes(n_probs)
        return self._json(body)

    def _completion_bytes(self, n_probs: int) -> bytes:
        leading = [self.token_ids[c] for c in LEADING_CONTROLS if c in self.token_ids]
        others = [i for c, i in self.token_ids.items() if c not in LEADING_CONTROLS]
        ids = (leading + others + list(range(FILLER_BASE, FILLER_BASE + n_probs)))[:n_probs]
        top = [
            {"id": token_id, "token": "", "bytes": [], "logprob": -0.5 - 0.25 * rank}
            for rank, token_id in enumerate(ids)
        ]
        return orjson.dumps(
            {
                "content": "",
                "tokens_evaluated": 42,
                "timings": {"cache_n": 0},
                "generation_settings": {"n_probs": n_probs},
                "completion_probabilities": [
                    {"id": ids[0], "token": "", "logprob": top[0]["logprob"], "top_logprobs": top}
                ],
            }
        )


async def serve_canned() -> None:
    """Child process: serve on a free port, print the URL, stop when stdin closes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    runner = web.AppRunner(CannedLlamaCppServer().app(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock, backlog=1024).start()
    print(json.dumps({"url": f"http://127.0.0.1:{sock.getsockname()[1]}"}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


def states(count: int, start: int = 0) -> Iterator[str]:
    """Distinct short tickets, made one at a time."""
    for n in range(start, start + count):
        yield ISSUES[n % len(ISSUES)].format(n=n)


def current_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


async def measure(url: str, count: int) -> dict[str, Any]:
    """Client subprocess: stream ``count`` questions and report CPU and memory."""
    async with tv.Session.llama_cpp(url, top_k=TOP_K, max_concurrency=CONCURRENCY) as session:
        await session.probe()
        async for item in session.judge_many(
            states(WARM_UP, start=10**9), QUESTIONS, max_in_flight=CONCURRENCY
        ):
            if not item.ok:
                raise RuntimeError(f"warm-up record {item.index} failed: {item.error!r}")
        peak_before = peak_rss_kib()
        samples: list[int] = []
        step = max(count // 10, 1)
        done = failed = 0
        first_error = ""
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        async for item in session.judge_many(
            states(count), QUESTIONS, ordered=True, max_in_flight=CONCURRENCY
        ):
            done += 1
            if item.judgment is None or item.judgment["refund"].noul is None:
                failed += 1
                first_error = first_error or repr(item.error)
            if done % step == 0:
                samples.append(current_rss_kib())
        cpu = time.process_time() - cpu_started
        wall = time.perf_counter() - wall_started
    return {
        "count": count,
        "done": done,
        "failed": failed,
        "first_error": first_error,
        "cpu_us_per_question": cpu / count * 1e6,
        "wall_s": wall,
        "questions_per_s": count / wall,
        "peak_before_kib": peak_before,
        "peak_after_kib": peak_rss_kib(),
        "rss_samples_kib": samples,
    }


def run_measurement(url: str, count: int) -> dict[str, Any]:
    """One size in a fresh client process, so each peak RSS is its own."""
    command = [sys.executable, "-m", "benchmarks.bench_client_cost", "--measure", str(count)]
    done = subprocess.run(
        [*command, "--url", url], capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"the client process for {count} questions exited {done.returncode}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(sizes: list[int]) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_client_cost", "--serve-canned"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = json.loads(server.stdout.readline())["url"]
        results = [run_measurement(url, count) for count in sizes]
    finally:
        assert server.stdin is not None
        server.stdin.close()  # the child stops when its stdin closes
        server.wait(timeout=30)

    mib = 1024
    print(
        f"CannedLlamaCppServer in a child process; client: judge_many, max_in_flight "
        f"{CONCURRENCY}, top_k {TOP_K}, one Noul per state, states from a generator; "
        f"warm-up {WARM_UP} questions per client process"
    )
    print(
        f"{'questions':>9} {'wall s':>7} {'q/s':>6} {'CPU us/q':>8} "
        f"{'peak before':>11} {'peak after':>10} {'growth':>7}  RSS at each tenth (MiB)"
    )
    for r in results:
        growth = (r["peak_after_kib"] - r["peak_before_kib"]) / mib
        tenths = " ".join(f"{s / mib:.0f}" for s in r["rss_samples_kib"])
        print(
            f"{r['count']:>9} {r['wall_s']:7.1f} {r['questions_per_s']:6.0f} "
            f"{r['cpu_us_per_question']:8.0f} {r['peak_before_kib'] / mib:8.1f} MiB "
            f"{r['peak_after_kib'] / mib:6.1f} MiB {growth:+5.1f} MiB  {tenths}"
        )
        if r["failed"]:
            print(f"  {r['failed']} of {r['done']} failed; the first: {r['first_error']}")
    if len(results) >= 2:
        first, last = results[0], results[-1]
        delta = (last["peak_after_kib"] - first["peak_after_kib"]) / mib
        print(
            f"peak RSS after {last['count']} vs after {first['count']}: {delta:+.1f} MiB "
            f"({last['count'] / first['count']:.0f}x the questions)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--serve-canned", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_canned:
        asyncio.run(serve_canned())
    elif args.measure is not None:
        print(json.dumps(asyncio.run(measure(args.url, args.measure))), flush=True)
    else:
        run(args.sizes)


if __name__ == "__main__":
    main()
