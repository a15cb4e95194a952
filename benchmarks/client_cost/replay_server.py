"""A llama.cpp server that replays real recorded reply bodies at once, for client-cost benchmarks;
with ``--service-time`` and ``--slots``, a SIMULATED llama.cpp server of fixed capacity; with
``--derive``, a replaying upstream whose every read is marked by the prompt it was asked for.

Not a benchmark itself: `bench_client_cost`, `bench_event_loop_lag` and `bench_memory` start it
in a CHILD process (`ReplayServerProcess`), so its CPU is never counted as the client's; the
gateway's load test (``tests/live/test_gateway_load_live.py``) starts it with ``--derive``.

Every body it sends was recorded from the real server (xllamacpp, llama.cpp build 11549, Gemma 3
270M), with real ``token`` and ``bytes`` fields in every entry:

- ``POST /completion``: the recorded read of the ``n_probs`` the request asks for (exact
  candidate ids included, since they are the ids the same server tokenized the controls to).
  A request with ``response_fields`` gets the recorded body filtered the way llama.cpp filters
  it (each path ``a/b`` looked up in the object and kept under the key ``"a/b"``; a path into
  an array is dropped): ``--check`` compares that emulation with real filtered replies. A K
  with no recording is answered 501 and counted, so a benchmark fails loudly instead of
  measuring something else;
- ``POST /tokenize``, ``GET /v1/models``, ``GET /props``, ``POST /apply-template`` (the probe:
  its controls tokenized in context and its renderings, ``probe.json``), ``GET /health``.

Bodies come from ``tests/fixtures/replies/llama_cpp/`` (``scripts/record_replies.py``) where
that folder has them, else from ``benchmarks/client_cost/recorded/llama_cpp/``
(``scripts/record_replies.py --only bodies``).

``GET /_replay/stats`` reports what was asked (requests per path, ``n_probs`` and
``response_fields`` seen, unanswered requests); ``GET /_replay/last-completion`` returns the
last ``/completion`` request body as received, so a floor client can send the very bodies the
SDK sends; ``POST /_replay/reset`` zeroes the counters (between two measured runs).

**Derived reads** (``--derive``, or ``ReplayServerProcess(derive=True)``): each ``POST
/completion`` is answered with the recorded body of its ``n_probs`` (and fields) as above, two
values in it then derived from the prompt the request carried, so that a client can tie each
read it got back to the prompt it sent, with no model: ``tokens_evaluated`` becomes the prompt's
size (`prompt_size`: its text's UTF-8 bytes, plus one per token id after the text) and
``timings/cache_n`` 0, and each entry of the first position's ``top_logprobs`` is lowered by
the size times `DERIVED_SHIFT` times ``1 + id % 5`` (`derived_logprob`; then sorted again), so
the answer read from them moves with the prompt's size too. It is a stub, and proves only what
is *not* the model: that each read's reply reached the request that asked for it.

**The simulation** (``--service-time SECONDS --slots N``, or
``ReplayServerProcess(service_time=..., slots=...)``): a server whose capacity is fixed and
known, for benchmarks where the servers must be the bottleneck (two real llama.cpp servers on
2 cores share the same CPUs and cannot show it). Each ``POST /completion`` waits for one of N
slots (arrivals beyond N queue, as llama.cpp queues requests beyond its slots), holds it for
the service time (``asyncio.sleep``: no CPU) and then answers with the recorded body as above,
so at most N reads are served at once and a server of N slots serves at most N / service time
reads per second. The probe's endpoints answer at once. It is a simulation: the bodies are
real, the timing is not a model's. Its stats add ``"simulation"``: the service time and slots,
completions served, the most slots held at once and the most requests queued at once, the
connections opened for them (client connections whose first request since the last reset was
a ``/completion``: a client that reuses a pool opened by its probe opens none), and the first
arrival and last answer of a ``/completion`` (seconds on the server's monotonic clock: their
difference is the span the server was busy with a run).

    # the emulation against real filtered replies
    python -m benchmarks.client_cost.replay_server --check
    # prints {"url": ...}; stops when stdin closes
    python -m benchmarks.client_cost.replay_server --serve
    # the simulation
    python -m benchmarks.client_cost.replay_server --serve --service-time 0.3 --slots 8
    # reads marked by their prompts
    python -m benchmarks.client_cost.replay_server --serve --derive

    with ReplayServerProcess(service_time=0.05, slots=4) as server: ...   # one, in a child
    with replay_servers(2, service_time=0.05, slots=4) as servers: ...    # N, started at once
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gzip
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from aiohttp import web

import typevet_async as tv
from benchmarks._shared import ticket
from typevet_async._backends.embedded import stop_child

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "replies" / "llama_cpp"
RECORDED = Path(__file__).resolve().parent / "recorded" / "llama_cpp"


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def _find(name: str) -> tuple[bytes, Path] | None:
    """A recorded body by name: the fixtures first, then this folder's recordings."""
    for folder in (FIXTURES, RECORDED):
        for suffix in (".json", ".json.gz"):
            path = folder / f"{name}{suffix}"
            if path.exists():
                return _read(path), path
    return None


def _messages_key(messages: Any) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)


#: ``--derive``: each logprob of a read is lowered by its prompt's size times this, times
#: ``1 + id % 5`` (`derived_logprob`).
DERIVED_SHIFT = 1e-4


def derived_logprob(recorded: float, token_id: int, size: int) -> float:
    """``--derive``'s logprob of ``token_id`` for a prompt of ``size`` (`prompt_size`): the
    recorded one lowered by ``size * DERIVED_SHIFT * (1 + token_id % 5)``; the digits' ids
    (0, 1, 2) differ mod 5 in Gemma 3's vocabulary, so their softmax moves with the size."""
    return recorded - size * DERIVED_SHIFT * (1 + token_id % 5)


def prompt_size(prompt: Any) -> int:
    """``--derive``'s mark of a ``/completion`` prompt: its text's UTF-8 bytes, plus one per
    token id after it (llama.cpp's ``[text, *ids]``); ``{"prompt_string"}`` for one with images."""
    if isinstance(prompt, dict):
        prompt = prompt.get("prompt_string", "")
    if isinstance(prompt, list):
        text = "".join(part for part in prompt if isinstance(part, str))
        return len(text.encode()) + sum(1 for part in prompt if isinstance(part, int))
    return len(prompt.encode()) if isinstance(prompt, str) else 0


def derived_reply(recorded: dict[str, Any], prompt: Any) -> bytes:
    """``recorded`` (a parsed ``/completion`` body, left as it is) marked by ``prompt``:
    ``tokens_evaluated`` its size, nothing cached, the first position's logprobs each
    `derived_logprob`, most likely first as llama.cpp sends them."""
    size = prompt_size(prompt)
    reply = dict(recorded)
    reply["tokens_evaluated"] = size
    if "timings/cache_n" in reply:
        reply["timings/cache_n"] = 0
    if isinstance(reply.get("timings"), dict):
        reply["timings"] = {**reply["timings"], "cache_n": 0}
    first, *rest = reply["completion_probabilities"]
    entries = [
        {**entry, "logprob": derived_logprob(entry["logprob"], entry["id"], size)}
        for entry in first["top_logprobs"]
    ]
    entries.sort(key=lambda entry: -entry["logprob"])
    reply["completion_probabilities"] = [{**first, "top_logprobs": entries}, *rest]
    return orjson.dumps(reply)


def filter_fields(payload: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """llama.cpp's ``response_fields``: each ``/``-separated path, kept under its own text."""
    kept: dict[str, Any] = {}
    for path in paths:
        current: Any = payload
        found = True
        for key in path.split("/"):
            if isinstance(current, dict) and key in current:
                current = current[key]
            else:
                found = False
                break
        if found:
            kept[path] = current
    return kept


def _requests(folder: Path) -> dict[str, dict[str, Any]]:
    """File name -> the request body that recorded it, from the folder's ``requests.json``
    (``scripts/record_replies.py``'s shape, or ours with a top-level ``requests``)."""
    index = folder / "requests.json"
    if not index.exists():
        return {}
    named = json.loads(index.read_text())
    named = named.get("requests", named)
    return {
        entry["file"]: entry.get("body") or {}
        for entry in named.values()
        if isinstance(entry, dict) and entry.get("path") == "/completion"
    }


class RecordedBodies:
    """Every recorded reply the replay server can send, and where each came from."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}
        #: Bodies recorded without ``response_fields``, by K: filtered here when asked.
        self.completions: dict[int, bytes] = {}
        #: Bodies recorded with ``response_fields``, by (K, fields): sent as they are.
        self.filtered: dict[tuple[int, tuple[str, ...]], bytes] = {}
        for folder in (RECORDED, FIXTURES):  # fixtures last: they win
            requests = _requests(folder)
            for path in sorted(folder.glob("completion*.json*")):
                request = requests.get(path.name)
                if request is None:  # no request named: K from the name, no field filter
                    stem = path.name.split(".")[0].removeprefix("completion_top")
                    if not stem.isdigit():
                        continue
                    request = {"n_probs": int(stem)}
                k = request.get("n_probs")
                if not isinstance(k, int) or request.get("n_predict", 0) != 0:
                    continue
                fields = tuple(request.get("response_fields") or ())
                source = str(path.relative_to(ROOT))
                if fields:
                    self.filtered[k, fields] = _read(path)
                    self.sources[f"completion_top{k} {list(fields)}"] = source
                else:
                    self.completions[k] = _read(path)
                    self.sources[f"completion_top{k}"] = source
        self.fixed: dict[str, bytes] = {}
        for name in ("models", "props", "apply_template"):
            found = _find(name)
            if found is None:
                raise SystemExit(
                    f"no recorded {name} reply: run scripts/record_replies.py --only bodies"
                )
            self.fixed[name] = found[0]
            self.sources[name] = str(found[1].relative_to(ROOT))
        tokenized = RECORDED / "tokenize.json"
        if not tokenized.exists():
            raise SystemExit(
                "no recorded /tokenize replies: run scripts/record_replies.py --only bodies"
            )
        self.tokens: dict[str, bytes] = {
            content: reply.encode() for content, reply in json.loads(tokenized.read_text()).items()
        }
        self.sources["tokenize"] = str(tokenized.relative_to(ROOT))
        # The probe's in-context tokenizations and its other renderings (``--only probe``).
        probe = RECORDED / "probe.json"
        if not probe.exists():
            raise SystemExit("no recorded probe.json: run scripts/record_replies.py --only probe")
        recorded_probe = json.loads(probe.read_text())
        self.tokens.update(
            (content, reply.encode()) for content, reply in recorded_probe["tokenize"].items()
        )
        self.renderings: dict[str, bytes] = {
            _messages_key(entry["body"]["messages"]): entry["reply"].encode()
            for entry in recorded_probe["apply_template"]
        }
        self.sources["probe"] = str(probe.relative_to(ROOT))
        # The fixtures' own /tokenize reply must agree with ours.
        fixture_requests = FIXTURES / "requests.json"
        if fixture_requests.exists():
            named = json.loads(fixture_requests.read_text()).get("tokenize")
            if named and (FIXTURES / named["file"]).exists():
                content = named["body"]["content"]
                fixture_reply = orjson.loads((FIXTURES / named["file"]).read_bytes())
                if content in self.tokens and orjson.loads(self.tokens[content]) != fixture_reply:
                    raise SystemExit(f"recorded /tokenize of {content!r} differs from the fixture")
        if not self.completions and not self.filtered:
            raise SystemExit(
                "no recorded /completion bodies: run scripts/record_replies.py --only bodies"
            )


class Simulation:
    """A fixed capacity: each ``/completion`` holds one of ``slots`` for ``service_time`` s."""

    def __init__(self, service_time: float, slots: int) -> None:
        if not service_time > 0 or not slots >= 1:
            raise ValueError(
                f"a simulation needs a service time > 0 and slots >= 1, got {service_time}, {slots}"
            )
        self.service_time = service_time
        self.slots = slots
        self._free = asyncio.Semaphore(slots)
        self.reset()

    def reset(self) -> None:
        self.served = 0
        #: Connections whose first request (since the reset) was a ``/completion``.
        self.opened = 0
        self.held = self.waiting = 0
        self.peak_held = self.peak_waiting = 0
        self.first_arrival: float | None = None
        self.last_answer: float | None = None

    async def serve(self) -> None:
        """Wait for a free slot, hold it for the service time."""
        if self.first_arrival is None:
            self.first_arrival = time.monotonic()
        if self._free.locked():  # every slot is held: it queues
            self.waiting += 1
            self.peak_waiting = max(self.peak_waiting, self.waiting)
            try:
                await self._free.acquire()
            finally:
                self.waiting -= 1
        else:
            await self._free.acquire()
        self.held += 1
        self.peak_held = max(self.peak_held, self.held)
        try:
            await asyncio.sleep(self.service_time)
        finally:
            self.held -= 1
            self._free.release()
        self.served += 1
        self.last_answer = time.monotonic()

    def stats(self) -> dict[str, Any]:
        return {
            "service_time": self.service_time,
            "slots": self.slots,
            "served": self.served,
            "peak_slots_held": self.peak_held,
            "peak_queued": self.peak_waiting,
            "connections_opened": self.opened,
            "first_arrival": self.first_arrival,
            "last_answer": self.last_answer,
        }


class ReplayLlamaCppServer:
    def __init__(
        self, bodies: RecordedBodies, simulation: Simulation | None = None, derive: bool = False
    ) -> None:
        self.bodies = bodies
        self.simulation = simulation
        self.derive = derive
        #: ``--derive``: the parsed body replayed for each (K, fields).
        self._parsed_replies: dict[tuple[int, tuple[str, ...]], dict[str, Any]] = {}
        self.requests: collections.Counter[str] = collections.Counter()
        self.n_probs: collections.Counter[int] = collections.Counter()
        self.fields: collections.Counter[str] = collections.Counter()
        self.unanswered: list[str] = []
        self.last_completion = b""
        self._filtered: dict[tuple[int, tuple[str, ...]], bytes] = {}
        self._parsed: dict[int, dict[str, Any]] = {}
        #: The clients' (host, port) seen since the reset: one per connection.
        self._peers: set[Any] = set()

    @web.middleware
    async def _note_peer(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Count, for the simulation, the connections a ``/completion`` was the first use of."""
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer not in self._peers:
            self._peers.add(peer)
            if request.path == "/completion" and self.simulation is not None:
                self.simulation.opened += 1
        response: web.StreamResponse = await handler(request)
        return response

    def reset(self) -> None:
        self._peers.clear()
        self.requests.clear()
        self.n_probs.clear()
        self.fields.clear()
        self.unanswered.clear()
        if self.simulation is not None:
            self.simulation.reset()

    def app(self) -> web.Application:
        middlewares = [self._note_peer] if self.simulation is not None else []
        app = web.Application(client_max_size=64 * 1024**2, middlewares=middlewares)
        app.router.add_post("/completion", self.completion)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/apply-template", self.apply_template)
        app.router.add_get("/v1/models", self.fixed("models"))
        app.router.add_get("/props", self.fixed("props"))
        app.router.add_get("/health", self.health)
        app.router.add_get("/_replay/stats", self.stats)
        app.router.add_get("/_replay/last-completion", self.last)
        app.router.add_post("/_replay/reset", self.reset_counters)
        return app

    @staticmethod
    def _json(body: bytes, status: int = 200) -> web.Response:
        return web.Response(body=body, status=status, content_type="application/json")

    def _refuse(self, what: str) -> web.Response:
        if len(self.unanswered) < 20:
            self.unanswered.append(what)
        self.requests["unanswered"] += 1
        return self._json(orjson.dumps({"error": {"code": 501, "message": what}}), status=501)

    def fixed(self, name: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            self.requests[request.path] += 1
            return self._json(self.bodies.fixed[name])

        return handler

    async def health(self, request: web.Request) -> web.Response:
        return self._json(b'{"status":"ok"}')

    async def apply_template(self, request: web.Request) -> web.Response:
        self.requests[request.path] += 1
        body = orjson.loads(await request.read())
        messages = body.get("messages") or [{}]
        if len(messages) == 1 and messages[0].get("content") == "typevet-probe":
            return self._json(self.bodies.fixed["apply_template"])
        recorded = self.bodies.renderings.get(_messages_key(messages))
        if recorded is None:
            return self._refuse(f"no recorded /apply-template rendering of {messages!r:.200}")
        return self._json(recorded)

    async def tokenize(self, request: web.Request) -> web.Response:
        self.requests[request.path] += 1
        content = orjson.loads(await request.read()).get("content")
        reply = self.bodies.tokens.get(content) if isinstance(content, str) else None
        if reply is None:
            return self._refuse(f"no recorded /tokenize of {content!r:.100}")
        return self._json(reply)

    async def completion(self, request: web.Request) -> web.Response:
        self.requests[request.path] += 1
        raw = await request.read()
        self.last_completion = raw
        if self.simulation is not None:
            await self.simulation.serve()
        body = orjson.loads(raw)
        k = body.get("n_probs")
        fields = body.get("response_fields") or []
        self.n_probs[k] += 1
        if fields:
            self.fields[json.dumps(fields)] += 1
        if not isinstance(k, int):
            return self._refuse(f"n_probs {k!r} is not an integer")
        key = (k, tuple(fields))
        if self.derive:
            return self._derived(key, body.get("prompt"))
        exact = self.bodies.filtered.get(key)
        if exact is not None:  # recorded with these very fields
            return self._json(exact)
        recorded = self.bodies.completions.get(k)
        if recorded is None:
            return self._refuse(f"no recorded /completion body for n_probs {k!r}")
        if not fields:
            return self._json(recorded)
        reply = self._filtered.get(key)
        if reply is None:
            parsed = self._parsed.get(k)
            if parsed is None:
                parsed = self._parsed[k] = orjson.loads(recorded)
            reply = self._filtered[key] = orjson.dumps(filter_fields(parsed, list(fields)))
        return self._json(reply)

    def _derived(self, key: tuple[int, tuple[str, ...]], prompt: Any) -> web.Response:
        """``--derive``: the reply replayed for ``key``, marked by ``prompt``."""
        parsed = self._parsed_replies.get(key)
        if parsed is None:
            k, fields = key
            exact = self.bodies.filtered.get(key)
            recorded = self.bodies.completions.get(k)
            if exact is not None:
                parsed = orjson.loads(exact)
            elif recorded is None:
                return self._refuse(f"no recorded /completion body for n_probs {k!r}")
            else:
                parsed = orjson.loads(recorded)
                if fields:
                    parsed = filter_fields(parsed, list(fields))
            self._parsed_replies[key] = parsed
        return self._json(derived_reply(parsed, prompt))

    async def stats(self, request: web.Request) -> web.Response:
        return self._json(
            orjson.dumps(
                {
                    "requests": dict(self.requests),
                    "n_probs": {str(k): v for k, v in self.n_probs.items()},
                    "response_fields": dict(self.fields),
                    "unanswered": self.unanswered,
                    "recorded_ks": sorted(self.bodies.completions),
                    "recorded_filtered": [
                        [k, list(fields)] for k, fields in sorted(self.bodies.filtered)
                    ],
                    "sources": self.bodies.sources,
                    "simulation": None if self.simulation is None else self.simulation.stats(),
                    "derive": self.derive,
                }
            )
        )

    async def reset_counters(self, request: web.Request) -> web.Response:
        self.reset()
        return self._json(b"{}")

    async def last(self, request: web.Request) -> web.Response:
        return self._json(self.last_completion)


async def serve(
    service_time: float | None = None, slots: int | None = None, derive: bool = False
) -> None:
    """Child process: serve on a free port, print the URL, stop when stdin closes; with a
    service time and slots, as the simulation; with ``derive``, each read marked by its prompt."""
    simulation = None
    if service_time is not None or slots is not None:
        if service_time is None or slots is None:
            raise SystemExit("the simulation needs both --service-time and --slots")
        simulation = Simulation(service_time, slots)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = ReplayLlamaCppServer(RecordedBodies(), simulation, derive)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock, backlog=1024).start()
    print(json.dumps({"url": f"http://127.0.0.1:{sock.getsockname()[1]}"}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


class ReplayServerProcess:
    """The replay server in a child process; ``url`` once entered. With ``service_time`` and
    ``slots``: the simulation (module docstring), e.g.
    ``ReplayServerProcess(service_time=0.05, slots=4)``; with ``derive``, each read marked by
    its prompt (module docstring)."""

    def __init__(
        self, *, service_time: float | None = None, slots: int | None = None, derive: bool = False
    ) -> None:
        if (service_time is None) != (slots is None):
            raise ValueError("the simulation needs both service_time and slots")
        if service_time is not None and slots is not None and (service_time <= 0 or slots < 1):
            raise ValueError(f"service_time must be > 0 and slots >= 1: {service_time}, {slots}")
        self.service_time = service_time
        self.slots = slots
        self.derive = derive
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        """Start the child; `wait_started` reads its URL."""
        command = [sys.executable, "-m", "benchmarks.client_cost.replay_server", "--serve"]
        if self.service_time is not None:
            command += ["--service-time", repr(self.service_time), "--slots", str(self.slots)]
        if self.derive:
            command.append("--derive")
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
        )

    def wait_started(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit("the replay server did not start")
        self.url = json.loads(line)["url"]

    def __enter__(self) -> ReplayServerProcess:
        self.start()
        try:
            self.wait_started()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_replay/stats", timeout=30) as response:
            result: dict[str, Any] = json.loads(response.read())
        return result

    def reset(self) -> None:
        """Zero the counters (and the simulation's): between two measured runs."""
        request = urllib.request.Request(f"{self.url}/_replay/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def last_completion(self) -> bytes:
        with urllib.request.urlopen(f"{self.url}/_replay/last-completion", timeout=30) as response:
            return bytes(response.read())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_child(process, timeout=30)  # the child stops when its stdin closes
            if process.stdout is not None:
                process.stdout.close()


@contextlib.contextmanager
def replay_servers(
    count: int, *, service_time: float | None = None, slots: int | None = None
) -> Iterator[list[ReplayServerProcess]]:
    """``count`` replay servers (simulations, with ``service_time`` and ``slots``), each in its
    own child process, started at once; all stopped on leaving."""
    servers = [ReplayServerProcess(service_time=service_time, slots=slots) for _ in range(count)]
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.callback(server.__exit__, None, None, None)
            server.start()
        for server in servers:
            server.wait_started()
        yield servers


# -- what the client-cost benchmarks send it -----------------------------------------------

#: The benchmarks' one question per ticket.
QUESTIONS: dict[str, tv.Question] = {"refund": tv.Noul(instructions="Is a refund requested?")}
#: The session settings the recorded bodies fit: they were recorded for prompts with digit
#: controls (0, 1, ...), whose ids are in every recorded top-K; under the default letters a
#: recorded K=64 body may miss "B" and every read would escalate, measuring something else.
RECORDED_SETTINGS: dict[str, Any] = {"controls": "digits"}
#: The ticket `capture_sdk_body` renders; `floor_loop` swaps it for each question's own.
PRIME_TICKET = 10**9


async def capture_sdk_body(session: tv.Session) -> None:
    """One SDK judgment of the priming ticket, so the replay server holds its exact body
    (``ReplayServerProcess.last_completion``)."""
    async with session:
        await session.judge(ticket(PRIME_TICKET), QUESTIONS)


def floor_loop(
    http: aiohttp.ClientSession, url: str, template: dict[str, Any], concurrency: int
) -> Callable[[int, int], Awaitable[int]]:
    """The least any client pays for the SDK's exchange: ``concurrency`` workers on one
    aiohttp session posting the captured SDK body (``template``, its ticket swapped for each
    question's, serialised with orjson) and reading the reply's bytes, no parse.

    Returns ``run(count, start)``: posts tickets ``start .. start + count - 1`` and returns the
    bytes received."""
    prompt: str = template["prompt"]
    primed = ticket(PRIME_TICKET)
    if primed not in prompt:
        raise RuntimeError("the captured body does not hold the priming ticket")
    headers = {"Content-Type": "application/json"}
    endpoint = f"{url}/completion"

    async def one(n: int) -> int:
        body = dict(template)
        body["prompt"] = prompt.replace(primed, ticket(n))
        async with http.post(endpoint, data=orjson.dumps(body), headers=headers) as response:
            response.raise_for_status()
            return len(await response.read())

    async def run(count: int, start: int) -> int:
        numbers = iter(range(start, start + count))
        received = 0

        async def worker() -> None:
            nonlocal received
            for n in numbers:
                size = await one(n)  # (not `received += await ...`: that reads first)
                received += size

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return received

    return run


def _same_shape(real: Any, emulated: Any, path: str = "") -> bool:
    """Same keys everywhere and the same values, up to the sampled token (the read samples one
    token at random: its ``id``, ``token``, ``bytes`` and ``logprob`` differ between two reads)
    and float noise between two reads of one prompt."""
    if isinstance(real, dict) and isinstance(emulated, dict):
        if list(real) != list(emulated):
            return False
        sampled = path.endswith("completion_probabilities[]")
        return all(
            (sampled and key in ("id", "token", "bytes", "logprob"))
            or _same_shape(real[key], emulated[key], f"{path}.{key}")
            for key in real
        )
    if isinstance(real, list) and isinstance(emulated, list):
        return len(real) == len(emulated) and all(
            _same_shape(a, b, f"{path}[]") for a, b in zip(real, emulated, strict=True)
        )
    if isinstance(real, float) and isinstance(emulated, float):
        return abs(real - emulated) <= 2e-2
    return bool(real == emulated)


def check() -> None:
    """The ``response_fields`` emulation against the real filtered replies recorded beside it."""
    named = json.loads((RECORDED / "requests.json").read_text())["requests"]
    checked = 0
    for name, request in named.items():
        fields = (request.get("body") or {}).get("response_fields")
        if not fields:
            continue
        k = request["body"]["n_probs"]
        full = orjson.loads(_read(RECORDED / named[f"completion_top{k}"]["file"]))
        real = orjson.loads(_read(RECORDED / request["file"]))
        emulated = orjson.loads(orjson.dumps(filter_fields(full, fields)))
        same = _same_shape(real, emulated)
        print(f"{name}: fields {fields}: keys {list(real)}; same shape and values: {same}")
        if not same:
            raise SystemExit(f"the emulation differs from the real server for {name}")
        checked += 1
    bodies = RecordedBodies()
    print(f"{checked} filtered replies match; recorded K: {sorted(bodies.completions)}")
    for key, source in sorted(bodies.sources.items()):
        print(f"  {key}: {source}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument(
        "--service-time",
        type=float,
        metavar="SECONDS",
        help="with --serve: the simulation; each /completion holds a slot this long",
    )
    parser.add_argument(
        "--slots", type=int, metavar="N", help="with --serve: the simulation's slots"
    )
    parser.add_argument(
        "--derive",
        action="store_true",
        help="with --serve: each read's token count and logprobs derived from its prompt",
    )
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.service_time, args.slots, args.derive))
    else:
        check()


if __name__ == "__main__":
    main()
