"""A fault-injecting HTTP proxy, written for the tests, between the SDK and a real server.

Every request is forwarded to the real llama.cpp server; a scripted fault may replace or
damage the real response (or the connection) on its way back. Faults are consumed in order,
one per request to the matching path; requests beyond the script pass through untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Coroutine, Iterator
from typing import Any, cast

from aiohttp import web

from benchmarks._local_proxy import LocalProxy, cap_refusal

Fault = Callable[[web.Request, int, bytes], Any]


def _mutate_top(body: bytes, change: Callable[[list[dict[str, Any]]], None]) -> bytes:
    payload = json.loads(body)
    change(payload["completion_probabilities"][0]["top_logprobs"])
    return json.dumps(payload).encode()


def _set_first_logprob(value: str) -> Callable[[bytes], bytes]:
    def apply(body: bytes) -> bytes:
        payload = json.loads(body)
        payload["completion_probabilities"][0]["top_logprobs"][0]["logprob"] = "__X__"
        return json.dumps(payload).replace('"__X__"', value).encode()

    return apply


#: Faults that rewrite a real /completion body.
BODY_FAULTS: dict[str, Callable[[bytes], bytes]] = {
    "invalid_json": lambda body: b"{not json" + body[:100],
    "nan_logprob": _set_first_logprob("NaN"),
    "infinite_logprob": _set_first_logprob("-Infinity"),
    "positive_logprob": _set_first_logprob("0.75"),
    "duplicated_id": lambda body: _mutate_top(body, lambda top: top.__setitem__(1, dict(top[0]))),
    "missing_entries": lambda body: _mutate_top(body, lambda top: top.__delitem__(slice(10, None))),
    "wrong_n_probs_echo": lambda body: json.dumps(
        {**json.loads(body), "generation_settings": {"n_probs": 7}}
    ).encode(),
    "not_an_object": lambda body: b"[1, 2, 3]",
}
#: Rewrites of a real body into another well-formed one: a server that claims what it is not.
#: Not faults a read must refuse (the fault tests draw theirs from `BODY_FAULTS` alone).
CLAIMS: dict[str, Callable[[bytes], bytes]] = {
    # /props of a server that declares vision (the test servers' models are text-only).
    "vision_props": lambda body: json.dumps(
        {**json.loads(body), "modalities": {"vision": True, "audio": False}}
    ).encode(),
}
#: Faults answered without asking the real server: status codes.
STATUS_FAULTS = {"http_500": 500, "http_503": 503, "http_429": 429}
#: The W3C trace context headers the proxy records per request.
TRACE_HEADERS = ("traceparent", "tracestate", "baggage")


class RandomFaults:
    """Faults drawn at random (seeded) for a share of the requests to some paths.

    Each faulted request is attributed to the record whose id the request body names (the
    first match of ``record_pattern``), so a test can say which records met which faults.
    """

    def __init__(
        self,
        rate: float,
        faults_by_path: dict[str, Collection[str]],
        *,
        record_pattern: str = r"Record (\d+):",
        seed: int = 0,
    ) -> None:
        self.rate = rate
        self.faults_by_path = {path: sorted(faults) for path, faults in faults_by_path.items()}
        self.record_pattern = re.compile(record_pattern.encode())
        self.random = random.Random(seed)
        #: Requests seen per path, and faults injected per record id.
        self.requests: Counter[str] = Counter()
        self.by_record: defaultdict[int, list[str]] = defaultdict(list)

    def draw(self, path: str, body: bytes) -> str:
        faults = self.faults_by_path.get(path)
        if not faults:
            return "pass"
        self.requests[path] += 1
        if self.random.random() >= self.rate:
            return "pass"
        fault = self.random.choice(faults)
        match = self.record_pattern.search(body)
        self.by_record[int(match.group(1)) if match else -1].append(fault)
        return fault

    @property
    def injected(self) -> Counter[str]:
        return Counter(fault for faults in self.by_record.values() for fault in faults)


class FaultInjectingProxy(LocalProxy):
    """An aiohttp.web proxy on 127.0.0.1 in the test's event loop.

    Faults come from ``script`` (in order, one per request to ``path``) or, when it is set,
    from ``random_faults``.
    """

    def __init__(self, upstream: str, path: str = "/completion") -> None:
        super().__init__(upstream)
        self.path = path
        self.script: list[str] = []
        self.random_faults: RandomFaults | None = None
        self.seen: list[str] = []
        #: Each request's W3C ``traceparent`` header (None: not sent), in arrival order.
        self.traceparents: list[str | None] = []
        #: Each request's trace context headers (``traceparent``, ``tracestate``, ``baggage``:
        #: those it carried), in the same order.
        self.trace_headers: list[dict[str, str]] = []
        #: Each request's path, in the same order.
        self.paths: list[str] = []
        #: When each request arrived (`time.monotonic`), in the same order.
        self.arrivals: list[float] = []
        #: The ``Retry-After`` header a 429 or 503 fault carries (None: a 429 says ``0``, a
        #: 503 says nothing).
        self.retry_after: str | None = None
        #: Set when the client closes the connection of a request the proxy never answered.
        self.client_hung_up = asyncio.Event()
        #: Set when a "held_503" request arrives; the test sets `release` to answer it 503.
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        #: Seconds each request to ``path`` waits before it is handled: a slow model server
        #: (the wait is the stub; the reply is still the real server's).
        self.delay = 0.0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.traceparents.append(request.headers.get("traceparent"))
        self.trace_headers.append(
            {name: request.headers[name] for name in TRACE_HEADERS if name in request.headers}
        )
        self.paths.append(request.path)
        self.arrivals.append(time.monotonic())
        if self.delay and request.path == self.path:
            await asyncio.sleep(self.delay)
        if self.random_faults is not None:
            fault = self.random_faults.draw(request.path, await request.read())
        else:
            fault = self.script.pop(0) if request.path == self.path and self.script else "pass"
            self.seen.append(fault)
        if fault in STATUS_FAULTS:
            await request.read()
            headers = {"Retry-After": "0"} if fault == "http_429" else {}
            if self.retry_after is not None and fault in ("http_429", "http_503"):
                headers = {"Retry-After": self.retry_after}
            return web.json_response({"error": fault}, status=STATUS_FAULTS[fault], headers=headers)
        if fault == "held_503":  # in flight until the test releases it, then refused
            await request.read()
            self.holding.set()
            await self.release.wait()
            return web.json_response({"error": fault}, status=503)
        if fault == "http_500_quoting":
            # An upstream whose error reply quotes the request it could not serve (its prompt
            # included), as some servers' do.
            sent = (await request.read()).decode("utf-8", errors="replace")
            message = {"error": {"message": f"cannot serve this request: {sent[:4000]}"}}
            return web.json_response(message, status=500)
        if fault == "hang":
            await request.read()
            # Never answer; notice (within 50 ms) when the client gives up on the request.
            for _ in range(600):  # bounded: 30 s at most
                transport = request.transport
                if transport is None or transport.is_closing():
                    self.client_hung_up.set()
                    break
                await asyncio.sleep(0.05)
            return web.Response(status=504)
        if fault == "oversized":
            await request.read()
            return web.Response(body=b"[" + b"0," * (40 * 1024 * 1024) + b"0]")
        status, body = await self.forward(request, await request.read())
        rewrite = BODY_FAULTS.get(fault) or CLAIMS.get(fault)
        if rewrite is not None:
            return web.Response(status=status, body=rewrite(body))
        if fault in ("reset_mid_body", "truncated_body"):
            response = web.StreamResponse(status=status)
            response.content_length = len(body)
            await response.prepare(request)
            await response.write(body[: len(body) // 2])
            assert request.transport is not None
            if fault == "reset_mid_body":
                request.transport.abort()
            else:
                request.transport.close()
            return response
        return web.Response(status=status, body=body, content_type="application/json")


def open_fds() -> int:
    """File descriptors this process holds (sockets included), for leak checks."""
    return len(os.listdir("/proc/self/fd"))


class AdvertisingProxy(LocalProxy):
    """A recording proxy in front of a System One server (our gateway, real), written for the
    tests: every request is forwarded as it came (method, path, body, ``Authorization``) and
    recorded; one thing is rewritten, and only that is a stub: ``GET /v1/models`` advertises
    the batch route with ``max_states`` (as a proxy or a server that overstates its cap
    would, issue 43.4)."""

    def __init__(self, upstream: str, max_states: int) -> None:
        super().__init__(upstream)
        self.max_states = max_states
        #: Every request, in arrival order: (path, parsed JSON body or None).
        self.requests: list[tuple[str, Any]] = []

    def states_per_batch(self) -> list[int]:
        """How many states each ``POST /v1/systemone/batch`` carried, in order."""
        return [len(body["states"]) for path, body in self.requests if path.endswith("/batch")]

    def count(self, path: str) -> int:
        return sum(1 for seen, _ in self.requests if seen == path)

    async def _handle(self, request: web.Request) -> web.Response:
        assert self._client is not None
        data = await request.read()
        self.requests.append((request.path, json.loads(data) if data else None))
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() in ("authorization", "content-type", "content-encoding")
        }
        async with self._client.request(
            request.method, f"{self.upstream}{request.rel_url}", data=data or None,
            headers=headers,
        ) as upstream:  # fmt: skip
            status, body = upstream.status, await upstream.read()
            content_type = upstream.headers.get("Content-Type", "application/json")
        if request.path == "/v1/models" and status == 200:
            listing = json.loads(body)
            listing["x_systemone_batch"] = {
                "path": "/v1/systemone/batch",
                "max_states": self.max_states,
            }
            body = json.dumps(listing).encode()
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})


@contextlib.contextmanager
def counting_tasks() -> Iterator[Counter[str]]:
    """The asyncio tasks created on the running loop while the block runs, counted (once it
    ends) by name: a task's own name where it was given one (anyio names a task by its
    function, ``"typevet_async._session.batch._Engine._work"`` for `judge_many`'s workers), else its
    coroutine's qualified name."""
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()
    created: Counter[str] = Counter()
    tasks: list[tuple[asyncio.Future[Any], str]] = []

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Future[Any]:
        if previous is not None:
            task = previous(loop, coro, **kwargs)
        else:
            task = asyncio.Task(coro, loop=loop, **kwargs)
        tasks.append((task, getattr(coro, "__qualname__", type(coro).__name__)))
        return task

    loop.set_task_factory(cast(Any, factory))  # 3.12 passes name= and context= too
    try:
        yield created
    finally:
        loop.set_task_factory(previous)
        for task, qualname in tasks:  # a name is set after the factory returns
            name = task.get_name() if isinstance(task, asyncio.Task) else ""
            created[qualname if name.startswith("Task-") or not name else name] += 1
        tasks.clear()


class VisionRecordingProxy(LocalProxy):
    """A recording proxy in front of the real llama.cpp or vLLM server, written for the tests,
    for the one thing no server here can do: read images (the test models are text-only). Its
    stubs, named: llama.cpp's ``GET /props`` declares vision, and a read with images is
    recorded as sent, then forwarded without them so the real server answers with real
    logprobs: a multimodal ``/completion`` body (``{"prompt_string", "multimodal_data"}``) as
    a text read of its prompt with the media markers taken out, a chat read's content parts
    as their text joined. Everything else is forwarded as it came."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        #: Every ``/completion`` body the SDK sent, parsed, in arrival order.
        self.completions: list[dict[str, Any]] = []
        #: Every ``/v1/chat/completions`` body the SDK sent, parsed, in arrival order.
        self.chats: list[dict[str, Any]] = []
        #: The server's media marker, from ``/props``.
        self.media_marker = ""

    async def _handle(self, request: web.Request) -> web.Response:
        assert self._client is not None
        data = await request.read()
        if request.path == "/completion":
            body = json.loads(data)
            self.completions.append(body)
            prompt = body["prompt"]
            if isinstance(prompt, dict):  # the stub: the read forwarded as text
                text = prompt["prompt_string"].replace(f"{self.media_marker}\n", "")
                data = json.dumps({**body, "prompt": text}).encode()
        elif request.path == "/v1/chat/completions":
            body = json.loads(data)
            self.chats.append(body)
            messages = [_text_only(message) for message in body["messages"]]
            data = json.dumps({**body, "messages": messages}).encode()  # the stub, as above
        headers = {"Content-Type": "application/json"} if data else None
        async with self._client.request(
            request.method, f"{self.upstream}{request.rel_url}", data=data or None,
            headers=headers,
        ) as upstream:  # fmt: skip
            status, reply = upstream.status, await upstream.read()
        if request.path == "/props" and status == 200:
            props = json.loads(reply)
            self.media_marker = props["media_marker"]
            reply = json.dumps({**props, "modalities": {"vision": True, "audio": False}}).encode()
        return web.Response(status=status, body=reply, content_type="application/json")


def _text_only(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message with its image parts taken out, its text parts joined."""
    content = message["content"]
    if isinstance(content, str):
        return message
    return {**message, "content": "".join(p["text"] for p in content if p["type"] == "text")}


class OpenAIShapedProxy(LocalProxy):
    """A proxy in front of llama.cpp's real ``/v1/chat/completions`` that behaves as other
    OpenAI-compatible servers do, the replies still the real server's: it refuses a
    ``top_logprobs`` above ``cap`` with a 400 (OpenAI's message naming the limit, or with
    ``name_limit=False`` a bare "invalid request"), refuses ``chat_template_kwargs``
    (``refuse_kwargs``), strips ``logprobs`` from every reply (``strip_logprobs``), answers
    404 at ``/tokenize`` (``no_tokenize``), and records every chat request's body and every
    request's ``Authorization`` and ``traceparent`` headers. With ``api_key`` it answers any
    request without ``Authorization: Bearer <api_key>`` 401 in OpenAI's shape, its message
    quoting the header's key whole (a stub: OpenAI masks most of it; a server that echoes
    it is what redaction must survive). With ``mangle_texts`` (the one stub: no real server
    here returns such texts) each entry's ``token`` gets a zero-width space appended and
    loses its ``bytes`` and ``id``, as a server whose token texts are not the tokens' text."""

    def __init__(
        self,
        upstream: str,
        *,
        cap: int | None = None,
        name_limit: bool = True,
        refuse_kwargs: bool = False,
        strip_logprobs: bool = False,
        no_tokenize: bool = False,
        mangle_texts: bool = False,
        api_key: str | None = None,
    ) -> None:
        super().__init__(upstream)
        self.api_key = api_key
        self.cap, self.name_limit = cap, name_limit
        self.refuse_kwargs, self.strip_logprobs = refuse_kwargs, strip_logprobs
        self.no_tokenize, self.mangle_texts = no_tokenize, mangle_texts
        #: Every chat request's body, and the status it was answered with, in order.
        self.chats: list[tuple[dict[str, Any], int]] = []
        #: The last chat reply passed through (its bytes as the real server sent them).
        self.last_reply: bytes = b""
        #: Every request's path and headers of note (``authorization``, ``traceparent``: those
        #: it carried), in order.
        self.requests: list[tuple[str, dict[str, str]]] = []

    def _refusal(self, body: dict[str, Any]) -> web.Response | None:
        if self.cap is not None:
            refusal = cap_refusal(body.get("top_logprobs"), self.cap, name_limit=self.name_limit)
            if refusal is not None:
                return refusal
        if self.refuse_kwargs and "chat_template_kwargs" in body:
            error = {
                "message": "Unrecognized request argument supplied: chat_template_kwargs",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
            return web.json_response({"error": error}, status=400)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        data = await request.read()
        noted = {
            name: request.headers[name]
            for name in ("authorization", "traceparent")
            if name in request.headers
        }
        self.requests.append((request.path, noted))
        sent = noted.get("authorization", "")
        if self.api_key is not None and sent != f"Bearer {self.api_key}":
            error = {
                "message": f"Incorrect API key provided: {sent.removeprefix('Bearer ')}.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
            return web.json_response({"error": error}, status=401)
        if request.path == "/tokenize" and self.no_tokenize:
            return web.json_response({"error": "not found"}, status=404)
        chat = request.path == "/v1/chat/completions"
        if chat:
            body = json.loads(data)
            refusal = self._refusal(body)
            self.chats.append((body, 400 if refusal is not None else 200))
            if refusal is not None:
                return refusal
        status, reply = await self.forward(request, data)
        if chat and status == 200:
            self.last_reply = reply
            if self.strip_logprobs or self.mangle_texts:
                reply = self._rewritten(reply)
        return web.Response(status=status, body=reply, content_type="application/json")

    def _rewritten(self, reply: bytes) -> bytes:
        parsed = json.loads(reply)
        for choice in parsed["choices"]:
            if self.strip_logprobs:
                choice.pop("logprobs", None)
                continue
            for position in choice["logprobs"]["content"]:
                for entry in [position, *position["top_logprobs"]]:
                    entry["token"] += "\u200b"
                    entry.pop("bytes", None)
                    entry.pop("id", None)
        return json.dumps(parsed).encode()

    def asked(self) -> list[int | None]:
        """Each chat request's ``top_logprobs``, in order."""
        return [body.get("top_logprobs") for body, _ in self.chats]
