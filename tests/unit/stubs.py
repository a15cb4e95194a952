"""Test doubles shared by the unit tests, named as stubs.

`InMemoryStubBackend` stands in for a model server where a real one cannot do the job: fail a
question on cue, in a chosen time order, or hang until cancelled. `FaultInjectingStubServer`
is a raw HTTP/1.1 server whose replies a test scripts per connection and request: a real
llama.cpp server cannot be made to drop a connection mid-request, redirect, or answer late on
cue. Everything a real server can show is tested live in tests/live.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager

import anyio
import anyio.lowlevel

import typevet_async as tv
from typevet_async._core.prompts.controls import DIGITS, NOUL_WORDS
from typevet_async._core.prompts.framing import PromptFrame

__all__ = [
    "IDS",
    "SLACK",
    "Behaviour",
    "FaultInjectingStubServer",
    "Handler",
    "InMemoryStubBackend",
    "ProbeRefusingStubBackend",
    "Stopwatch",
    "assert_takes_about",
    "failing_after",
    "noul",
    "reply",
    "sleeping",
    "state_of",
    "stopwatch",
]

#: The stub's control token ids: the ten digits, as the default layout binds them, and the
#: Noul's words (a probe in context finds them on every tokenizer the suite serves).
IDS = {
    **{digit: 1000 + int(digit) for digit in DIGITS},
    **{word: 1100 + n for n, word in enumerate(NOUL_WORDS)},
}

#: Seconds of scheduling delay a wall-clock bound allows on top of twice the expected time:
#: these tests run on a 2-core machine that may be busy with live servers at the same time.
SLACK = 0.5

#: What a stubbed read or generation does before it answers (sleep, fail, hang).
Behaviour = Callable[[], Awaitable[None]]


def sleeping(seconds: float) -> Behaviour:
    async def behaviour() -> None:
        await anyio.sleep(seconds)

    return behaviour


def failing_after(seconds: float, error: Exception, *, shielded: bool = False) -> Behaviour:
    """Sleep (shielded from cancellation if asked), then raise ``error``."""

    async def behaviour() -> None:
        with anyio.CancelScope(shield=shielded):
            await anyio.sleep(seconds)
        raise error

    return behaviour


def noul(n: int = 0) -> tv.Noul:
    return tv.Noul(instructions=f"Question {n}?")


def state_of(request: tv.ScoringRequest) -> str:
    """The judged state of a default-layout request: its user content before the field block
    (which holds no blank line: its caller text is folded to single lines)."""
    return request.user_text.rsplit("\n\n", 1)[0]


class Stopwatch:
    elapsed: float = 0.0


@contextmanager
def stopwatch() -> Iterator[Stopwatch]:
    """Measures the block's wall-clock time (the event loop's clock, `time.monotonic`)."""
    watch = Stopwatch()
    started = time.monotonic()
    try:
        yield watch
    finally:
        watch.elapsed = time.monotonic() - started


def assert_takes_about(elapsed: float, expected: float) -> None:
    """trio's ``check_takes_about``: at least ``expected`` (less a 1e-4 clock tolerance) and
    less than twice it, plus `SLACK` for a loaded machine."""
    assert expected * (1 - 1e-4) <= elapsed < 2 * expected + SLACK, (elapsed, expected)


class InMemoryStubBackend:
    """An in-memory stub backend (not a server): scripted delays and failures per question.

    It implements `tv.Backend`. A real server cannot fail questions on cue, in a chosen time
    order, or hang until cancelled; this stub can. Behaviours are looked up by question id
    (reads), by judged state (reads, `state_behaviours`) and by prompt (generations). It
    records every call, so a test can assert that none was made.
    """

    def __init__(
        self,
        family: tv.TemplateFamily = tv.TemplateFamily.GEMMA3,
        *,
        capabilities: tv.Capabilities | None = None,
        model: str | None = "stub-model",
        vision: bool = False,
        special_tokens: frozenset[str] | None = None,
    ) -> None:
        self.family = family
        #: The marker runs its "tokenizer" reads as special (None: it cannot tell).
        self.special_tokens = special_tokens
        #: Every `special_runs` call's runs.
        self.special_queries: list[list[str]] = []
        self._capabilities = capabilities or tv.Capabilities(
            framing="sdk", prefix_reuse=True, generation_images=False
        )
        self._model = model
        self.vision = vision
        #: The frame its probe reports (None: its family's own, with no earlier turns learnt;
        #: a test sets one with `turns` to frame examples).
        self.frame: PromptFrame | None = None
        self.outputs: dict[str, tv.ChatOutput] = {}
        self.behaviours: dict[str, Behaviour] = {}
        self.state_behaviours: dict[str, Behaviour] = {}
        self.opened = 0
        self.closed = 0
        self.probes = 0
        self.read_requests: list[tv.ScoringRequest] = []
        self.generation_requests: list[tv.GenerationRequest] = []
        #: The ``max_retries`` each call was given, in call order.
        self.retries_seen: list[int | tv.Unset] = []
        self.in_flight = 0
        self.peak = 0
        #: Question ids (reads) and prompts (generations) that were cancelled.
        self.cancelled: list[str] = []
        #: Errors the next probes raise, in order (then they succeed).
        self.probe_failures: list[Exception] = []

    def __repr__(self) -> str:
        return "InMemoryStubBackend()"

    @property
    def capabilities(self) -> tv.Capabilities:
        return self._capabilities

    @property
    def model(self) -> str | None:
        return self._model

    @property
    def reads(self) -> list[str]:
        """The question id of every read, in call order."""
        return [request.question_id for request in self.read_requests]

    @property
    def generated(self) -> list[str]:
        """The prompt of every generation, in call order."""
        return [request.prompt for request in self.generation_requests]

    async def open(self) -> None:
        self.opened += 1

    async def aclose(self) -> None:
        self.closed += 1

    async def probe(self) -> tv.Probe:
        self.probes += 1
        await anyio.sleep(0.01)
        if self.probe_failures:
            raise self.probe_failures.pop(0)
        model_ids = (self._model,) if self._model else ()
        return tv.Probe(
            self.family, "rendered", IDS, 262_144, model_ids, vision=self.vision, frame=self.frame
        )

    async def _run(self, key: str, behaviours: list[Behaviour | None]) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            ran = False
            for behaviour in behaviours:
                if behaviour is not None:
                    await behaviour()
                    ran = True
            if not ran:
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(key)
            raise
        finally:
            self.in_flight -= 1

    async def read(
        self, request: tv.ScoringRequest, probe: tv.Probe, *, max_retries: int | tv.Unset
    ) -> tv.CandidateRead:
        self.read_requests.append(request)
        self.retries_seen.append(max_retries)
        await self._run(
            request.question_id,
            [
                self.state_behaviours.get(state_of(request)),
                self.behaviours.get(request.question_id),
            ],
        )
        logprobs = tuple(-1.0 - index for index in range(len(request.token_ids)))
        return tv.CandidateRead(request.token_ids, logprobs, 4096, 1, 10, 0)

    async def special_runs(self, runs: Sequence[str]) -> frozenset[str] | None:
        self.special_queries.append(list(runs))
        if self.special_tokens is None:
            return None
        return frozenset(run for run in runs if run in self.special_tokens)

    async def generate(
        self, request: tv.GenerationRequest, *, max_retries: int | tv.Unset
    ) -> tv.ChatOutput:
        self.generation_requests.append(request)
        self.retries_seen.append(max_retries)
        await self._run(request.prompt, [self.behaviours.get(request.prompt) or sleeping(0.01)])
        return self.outputs.get(request.prompt, tv.ChatOutput('{"n": 1}', "stop", 5, 3))


#: (connection number, request number on it) -> the reply's bytes, or None to drop it.
Handler = Callable[[int, int], bytes | None]


def reply(status: int, body: bytes, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}"
        "Connection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


class FaultInjectingStubServer:
    """A raw asyncio HTTP/1.1 stub server whose replies a test scripts per connection and
    request (``handler``), each sent ``delay`` seconds after the request arrived.

    It records every request's ``(connection, number)`` in `requests` and its head (request
    line and headers) in `seen_heads`.
    """

    def __init__(self, handler: Handler, *, delay: float = 0.0) -> None:
        self.handler = handler
        self.delay = delay
        self.requests: list[tuple[int, int]] = []
        self.seen_heads: list[bytes] = []
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._serving: set[asyncio.Task[None]] = set()
        self.url = ""

    @property
    def server(self) -> asyncio.Server:
        if self._server is None:
            raise RuntimeError("the stub server is not started")
        return self._server

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        """Stop listening and end every connection still being served (Python 3.11's
        ``wait_closed`` does not wait for them)."""
        self.server.close()
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        self.connections += 1
        connection = self.connections
        number = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                number += 1
                self.requests.append((connection, number))
                self.seen_heads.append(head)
                if self.delay:
                    await asyncio.sleep(self.delay)
                data = self.handler(connection, number)
                if data is None:  # drop the connection without answering
                    break
                writer.write(data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._serving.discard(task)


class ProbeRefusingStubBackend(InMemoryStubBackend):
    """An in-memory stub backend whose probe always fails with ``error`` (what a wrong model
    pin or an unreachable server does); `probes` counts the attempts. It implements
    `tv.Backend`."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.probe_error = error

    async def probe(self) -> tv.Probe:
        self.probes += 1
        await anyio.lowlevel.checkpoint()
        raise self.probe_error
