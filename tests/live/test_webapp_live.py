"""The web-app example (``examples/webapp.py``, FastAPI) run in-process through httpx's ASGI
transport over the real llama.cpp server (Gemma 3 270M): one session opened in the lifespan
and shared by 50 concurrent requests, each answered for its own ticket, then a clean shutdown."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import socket
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest.mock import ANY
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

import typevet_async as tv

from .faults import FaultInjectingProxy, open_fds
from .helpers import InFlightCounter

pytestmark = pytest.mark.live

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "webapp.py"
REQUESTS = 50
JSON = {"Content-Type": "application/json"}


def load_example() -> ModuleType:
    """``examples/`` is not a package: the module is loaded from its file."""
    spec = importlib.util.spec_from_file_location("typevet_webapp_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through it
    spec.loader.exec_module(module)
    return module


webapp = load_example()


def ticket(index: int) -> dict[str, str]:
    """Distinct tickets: each has its own answers, so a mixed-up response cannot pass."""
    topics = ("a double charge", "a late parcel", "a crashing app", "an invoice", "a password")
    return {
        "subject": f"Ticket {index}: {topics[index % len(topics)]}",
        "message": f"Order {1000 + 37 * index}: {topics[index % len(topics)]}, "
        f"{'please refund me' if index % 2 else 'please help'} within {index + 1} days.",
    }


class PeakRequests:
    """ASGI middleware for the test: how many HTTP requests were inside the app at once."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.current = self.peak = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.current += 1
        self.peak = max(self.peak, self.current)
        try:
            await self.app(scope, receive, send)
        finally:
            self.current -= 1


def sockets_to(port: int) -> int:
    """TCP sockets this process holds to ``port``: its sockets' inodes (``/proc/self/fd``)
    looked up in the kernel's connection tables (``/proc/net/tcp``, ``tcp6``)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the directory's own descriptor, gone by now
            continue
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)  # the header
            for row in rows:
                fields = row.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if remote_port == port and fields[9] in inodes:
                    count += 1
    return count


#: One attempt a request: the failure under test is not retried away.
NO_RETRIES = tv.HttpSettings(retry=tv.RetryPolicy(max_retries=0))


def session_factory(url: str, made: list[tv.Session], **options: Any) -> Callable[[], tv.Session]:
    """A factory for `create_app` that keeps what it made, for the checks after shutdown."""

    def factory() -> tv.Session:
        session = tv.Session.llama_cpp(url, reproducible=True, **options)
        made.append(session)
        return session

    return factory


def assert_same(triage: dict[str, Any], direct: tv.Judgment) -> None:
    """The app's answer equals a direct judgment of the same ticket (both reproducible)."""
    refund, team, urgency = direct["refund"], direct["team"], direct["urgency"]
    assert isinstance(refund, tv.NoulAnswer)
    assert isinstance(team, tv.ChoiceAnswer)
    assert isinstance(urgency, tv.ScoreAnswer)
    assert triage["refund"] == pytest.approx(refund.noul, abs=1e-6)
    assert triage["team"] == team.choice
    assert triage["team_probabilities"] == pytest.approx(dict(team.probabilities), abs=1e-6)
    assert triage["urgency"] == pytest.approx(urgency.score, abs=1e-6)
    expected = dict(zip(urgency.legend, urgency.probabilities.values(), strict=True))
    assert triage["urgency_probabilities"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.asyncio
# 100 judgments (50 direct, 50 through the app), each read alone and without the prompt cache:
# about 95 s on a quiet 2-core machine; 811 s were seen at a load average of 9.
@pytest.mark.timeout(1800)
async def test_fifty_concurrent_requests_get_their_own_answers_and_shut_down_clean(
    gemma3_url: str,
) -> None:
    tickets = [ticket(index) for index in range(REQUESTS)]
    async with tv.Session.llama_cpp(gemma3_url, reproducible=True) as direct_session:
        direct = [await direct_session.judge(t, webapp.QUESTIONS) for t in tickets]
    # Every ticket's answers differ from every other's: the comparison tells requests apart.
    distinct = {tuple(p for a in d.values() for p in a.probabilities.values()) for d in direct}
    assert len(distinct) == REQUESTS

    port = urlsplit(gemma3_url).port
    assert port is not None
    fds_before = open_fds()
    made: list[tv.Session] = []
    # No deadline of the app's: the 50th request waits for 49 judgments; pytest's timeout guards.
    app = webapp.create_app(session_factory(gemma3_url, made), timeout=None)
    peak = PeakRequests(app)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # ResourceWarnings included (unclosed sessions, sockets)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=peak), base_url="http://triage"
            ) as client,
        ):
            responses = await asyncio.gather(*(client.post("/triage", json=t) for t in tickets))
            assert sockets_to(port) >= 1  # the session's pool, still open: the check sees it
        gc.collect()  # an unclosed aiohttp session or connector warns when it is collected

    assert [r.status_code for r in responses] == [200] * REQUESTS, responses[0].text
    for response, reference in zip(responses, direct, strict=True):
        assert_same(response.json(), reference)
    assert peak.peak == REQUESTS  # all 50 were in the app at once, on the one session
    [session] = made
    with pytest.raises(tv.SessionStateError, match="closed"):
        await session.judge(tickets[0], webapp.QUESTIONS)
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert sockets_to(port) == 0
    assert open_fds() <= fds_before
    assert [str(w.message) for w in caught] == []


@pytest.mark.asyncio
async def test_a_bad_ticket_is_a_422_and_nothing_is_read(gemma3_url: str) -> None:
    reads = InFlightCounter("/completion")
    made: list[tv.Session] = []
    app = webapp.create_app(
        session_factory(gemma3_url, made, http=tv.HttpSettings(trace_configs=[reads.config]))
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        empty = await client.post("/triage", json={"subject": "Charged twice", "message": ""})
        not_json = await client.post("/triage", content=b"{not json", headers=JSON)
        # Valid JSON, but no Unicode text: FastAPI's own 422 handler would fail to encode its
        # echo of the input (UnicodeEncodeError); the example's leaves the input out.
        surrogate = await client.post(
            "/triage", content=b'{"subject": "Charged", "message": "x\\ud800y"}', headers=JSON
        )
        openapi = (await client.get("/openapi.json")).json()

    for response, loc, words in (
        (empty, ["body", "message"], "at least 1 character"),
        (not_json, ["body", 1], "JSON decode error"),
        (surrogate, ["body", "message"], "unicode string"),
    ):
        assert response.status_code == 422
        assert response.json() == {"detail": [{"type": ANY, "loc": loc, "msg": ANY}]}
        assert words in response.json()["detail"][0]["msg"]
    assert reads.started == 0  # refused before any scoring read

    operation = openapi["paths"]["/triage"]["post"]
    assert set(operation["responses"]) == {"200", "422", "502", "503", "504"}
    triage = openapi["components"]["schemas"]["Triage"]
    assert triage["properties"]["team"]["enum"] == ["billing", "shipping", "technical"]


@pytest.mark.asyncio
async def test_an_unreachable_model_server_stops_the_start() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    made: list[tv.Session] = []
    app = webapp.create_app(session_factory(f"http://127.0.0.1:{port}", made, http=NO_RETRIES))
    with pytest.raises(tv.TransportError):
        async with app.router.lifespan_context(app):
            pytest.fail("the app started without its model server")
    [session] = made
    with pytest.raises(tv.SessionStateError):
        await session.probe()


@pytest.mark.asyncio
async def test_model_server_failures_are_502_504_and_a_refused_ticket_422(gemma3_url: str) -> None:
    # The fault proxy between the app and the real server: a hung read never reaches the
    # server, so the cancelled request leaves nothing running there.
    async with FaultInjectingProxy(gemma3_url) as proxy:
        made: list[tv.Session] = []
        app = webapp.create_app(session_factory(proxy.url, made, http=NO_RETRIES), timeout=2.0)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t"
            ) as client,
        ):
            proxy.script = ["http_503"]
            failed = await client.post("/triage", json=ticket(0))
            proxy.script = ["hang"]
            hung = await client.post("/triage", json=ticket(0))
            # 4,000 characters the form accepts, but over 4,000 tokens: the server's HTTP 400.
            too_long = await client.post(
                "/triage", json={"subject": "", "message": "0123456789" * 400}
            )
    assert [fault for fault in proxy.seen if fault != "pass"] == ["http_503", "hang"]

    assert failed.status_code == 502
    assert failed.json()["detail"].startswith("ServerError: ")
    assert "HTTP 503" in failed.json()["detail"]

    assert hung.status_code == 504
    assert hung.json()["detail"].startswith("DeadlineExceededError: ")
    assert "within 2.0 s" in hung.json()["detail"]

    assert too_long.status_code == 422
    [problem] = too_long.json()["detail"]
    assert problem["loc"] == ["body"]
    assert "exceeds the available context size" in problem["msg"]
