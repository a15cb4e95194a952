"""`Session.system_one(...).judge_many` through ``POST /v1/systemone/batch``: chunking by the
server's cap, per-item errors typed as alone, the transient ones re-sent alone, and the fall
back to one request per state where the route is not offered.

The server is our gateway in-process over the in-memory stub backend (real HTTP on
localhost), counted by its own metrics; an older server (no batch route) is a small aiohttp app
that proxies ``/v1/systemone`` to it and answers 404 on the batch route: a stub, as no real
older server exists here. The real model path is tests/live/test_system_one_batch_live.py.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from aiohttp import web

import typevet_async as tv
from typevet_async._apps.gateway import GatewayConfig, running
from typevet_async._backends.system_one import AsyncSystemOne
from typevet_async._backends.system_one_wire import ItemError, Listing, decode_batch, decode_models
from typevet_async._core.prompts.framing import with_turns

from ..live.faults import AdvertisingProxy, counting_tasks
from .stubs import InMemoryStubBackend, sleeping

KEY = "batching-key-0123456789"
QUESTIONS: dict[str, tv.Question] = {
    "refund": tv.Noul("Is a refund requested?"),
    "route": tv.Choice({"billing": "money", "shipping": None}, instructions="Team?"),
}
STATES = [f"ticket number {n}" for n in range(7)]


async def route_counts(url: str) -> dict[str, float]:
    """Requests the gateway answered, by route (its Prometheus counter)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    counts: dict[str, float] = {}
    for route, value in re.findall(
        r'typevet_gateway_requests_total\{route="([^"]+)",status="200"\} (\S+)', text
    ):
        counts[route] = counts.get(route, 0.0) + float(value)
    return counts


@pytest_asyncio.fixture
async def stub() -> InMemoryStubBackend:
    return InMemoryStubBackend()


def gateway(stub: InMemoryStubBackend, **config: Any) -> Any:
    return running(tv.Session(stub), GatewayConfig(keys=(KEY,), **config))


async def judged(url: str, states: list[Any], **options: Any) -> list[tv.BatchItem]:
    async with tv.Session.system_one(url, http=tv.HttpSettings(api_key=KEY)) as session:
        return [item async for item in session.judge_many(states, QUESTIONS, **options)]


async def alone(url: str, state: Any) -> tv.Judgment:
    async with tv.Session.system_one(url, http=tv.HttpSettings(api_key=KEY)) as session:
        return await session.judge(state, QUESTIONS)


@pytest.mark.asyncio
async def test_records_go_in_chunks_of_the_servers_cap_in_order(stub: InMemoryStubBackend) -> None:
    async with gateway(stub, max_batch_states=3) as url:
        items = await judged(url, STATES)
        counts = await route_counts(url)
        assert counts.get("/v1/systemone/batch") == 3  # 3 + 3 + 1 states
        assert "/v1/systemone" not in counts
        assert [item.index for item in items] == list(range(len(STATES)))
        for item, state in zip(items, STATES, strict=True):
            assert item.judgment is not None, item.error
            single = await alone(url, state)
            assert item.judgment.answers == single.answers
            assert item.judgment.usage == single.usage
            assert item.judgment.diagnostics["refund"].prompt.count(state) == 1


@pytest.mark.asyncio
async def test_max_in_flight_bounds_a_chunk(stub: InMemoryStubBackend) -> None:
    async with gateway(stub) as url:  # the cap is 64
        items = await judged(url, STATES, max_in_flight=2)
        assert all(item.judgment is not None for item in items)
        assert (await route_counts(url))["/v1/systemone/batch"] == 4  # 2 + 2 + 2 + 1


@pytest.mark.asyncio
async def test_an_item_error_is_typed_as_alone_and_the_rest_are_answered(
    stub: InMemoryStubBackend,
) -> None:
    async with gateway(stub) as url:
        items = await judged(url, ["fine", "word " * 10, "also fine"])
        assert all(item.judgment is not None for item in items)
        # a state the server refuses (422 from the model server, as a long prompt would be)
        stub.state_behaviours["refused state"] = raising(
            tv.ServerError("too long", status=400, body='{"error": {"message": "context"}}')
        )
        items = await judged(url, ["fine", "refused state", "also fine"])
        assert [item.judgment is not None for item in items] == [True, False, True]
        error = items[1].error
        assert isinstance(error, tv.InvalidInputError)
        assert not isinstance(error, tv.QuestionError)
        assert "refused this record (HTTP 422)" in str(error)
        assert "context" in str(error)


@pytest.mark.asyncio
async def test_a_transient_item_error_is_sent_again_alone(stub: InMemoryStubBackend) -> None:
    failures = [tv.ServerError("boom", status=503, body="")]
    stub.state_behaviours["flaky"] = raising_once(failures)
    async with gateway(stub) as url:
        items = await judged(url, ["fine", "flaky", "also fine"])
        assert all(item.judgment is not None for item in items)
        assert not failures  # it failed once, in the batch
        counts = await route_counts(url)
        assert (counts["/v1/systemone/batch"], counts["/v1/systemone"]) == (1, 1)


@pytest.mark.asyncio
async def test_questions_the_server_refuses_end_the_batch_once(stub: InMemoryStubBackend) -> None:
    many = tv.Choice([f"label {n}" for n in range(63)], instructions="Which one?")
    async with (
        gateway(stub) as url,
        tv.Session.system_one(url, http=tv.HttpSettings(api_key=KEY)) as session,
    ):
        with pytest.raises(tv.QuestionError, match="refused the questions") as raised:
            async for _ in session.judge_many(STATES, {"many": many}):
                pass
        assert raised.value.question_id == "many"


@pytest.mark.asyncio
async def test_a_server_without_the_route_is_asked_one_state_at_a_time(
    stub: InMemoryStubBackend,
) -> None:
    async with gateway(stub) as url, older_server(url, advertise=False) as old:
        items = await judged(old.url, STATES)
        assert all(item.judgment is not None for item in items)
        assert old.paths.count("/v1/systemone") == len(STATES)
        assert "/v1/systemone/batch" not in old.paths


@pytest.mark.asyncio
async def test_a_404_on_the_route_means_not_offered_and_nothing_is_lost(
    stub: InMemoryStubBackend,
) -> None:
    async with gateway(stub) as url, older_server(url, advertise=True) as old:
        async with tv.Session.system_one(old.url, http=tv.HttpSettings(api_key=KEY)) as session:
            items = [item async for item in session.judge_many(STATES, QUESTIONS)]
            backend = session.backend
            assert isinstance(backend, AsyncSystemOne)
            assert backend.batch_limit is None  # learned from the 404
        assert [item.index for item in items] == list(range(len(STATES)))
        assert all(item.judgment is not None for item in items)
        assert old.paths.count("/v1/systemone/batch") == 1  # asked once
        assert old.paths.count("/v1/systemone") == len(STATES)


def test_a_reply_with_the_wrong_number_of_results_is_a_protocol_error() -> None:
    with pytest.raises(tv.ProtocolError, match="1 results for 2 states"):
        decode_batch(b'{"results": [{"error": {}}]}', list(QUESTIONS.items()), 2)
    [item] = decode_batch(
        b'{"results": [{"error": {"error_type": "timeout", "message": "m", "status": 504}}]}',
        list(QUESTIONS.items()),
        1,
    )
    assert item == ItemError(504, "timeout", "m")


def test_the_advertisement_is_read_only_for_our_path() -> None:
    listing = {"models": [{"name": "m", "description": "d", "release_date": "2026-12-01"}]}
    assert decode_models(_json(listing)) == Listing(("m",))
    ours = {**listing, "x_systemone_batch": {"path": "/v1/systemone/batch", "max_states": 9}}
    assert decode_models(_json(ours)) == Listing(("m",), max_states=9)
    other = {**listing, "x_systemone_batch": {"path": "/v2/batch", "max_states": 9}}
    assert decode_models(_json(other)) == Listing(("m",))
    with pytest.raises(tv.ProtocolError):
        decode_models(_json({**listing, "x_systemone_batch": {"path": "/x", "max_states": 0}}))
    examples = {**listing, "x_question_examples": {"field": "x_examples", "max_examples": 8}}
    assert decode_models(_json(examples)) == Listing(("m",), max_examples=8)
    with pytest.raises(tv.ProtocolError):
        decode_models(_json({**listing, "x_question_examples": {"field": "x_examples"}}))


@pytest.mark.asyncio
async def test_examples_go_through_the_batch_route_to_our_gateway(
    stub: InMemoryStubBackend,
) -> None:
    refund = tv.Noul("Is a refund requested?", examples=[("Money back, now.", True)])
    # Gemma's earlier turns, as the probe learns them from the served template.
    turns = ("<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>\n<start_of_turn>user\n")
    stub.frame = with_turns(None, stub.family, turns)
    async with gateway(stub, max_batch_states=3) as url:
        async with tv.Session.system_one(url, http=tv.HttpSettings(api_key=KEY)) as session:
            items = [item async for item in session.judge_many(STATES[:3], {"refund": refund})]
        assert (await route_counts(url))["/v1/systemone/batch"] == 1
    for item in items:
        assert item.judgment is not None, item.error
        prompt = item.judgment.diagnostics["refund"].prompt
        assert prompt.index("Money back, now.") < prompt.index(STATES[item.index])


def _json(value: Any) -> bytes:
    return orjson.dumps(value)


def raising(error: Exception) -> Callable[[], Any]:
    async def behaviour() -> None:
        raise error

    return behaviour


def raising_once(errors: list[Exception]) -> Callable[[], Any]:
    async def behaviour() -> None:
        if errors:
            raise errors.pop()

    return behaviour


class _Older:
    def __init__(self, url: str, paths: list[str]) -> None:
        self.url = url
        self.paths = paths


def older_server(upstream: str, *, advertise: bool, hang: bool = False) -> Any:
    """A System One server without the batch route, in front of ``upstream`` (our gateway):
    it lists the models (advertising the route when ``advertise``, as a proxy that strips it
    might) and proxies ``/v1/systemone``; the batch route is a 404, as aiohttp answers it
    (after 3 s with ``hang``)."""
    paths: list[str] = []

    async def proxy(request: web.Request) -> web.Response:
        paths.append(request.path)
        headers = {"Authorization": request.headers.get("Authorization", "")}
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                request.method, f"{upstream}{request.path}", data=await request.read(),
                headers={**headers, "Content-Type": "application/json"},
            ) as reply,
        ):  # fmt: skip
            body = await reply.json()
        if request.path == "/v1/models" and not advertise:
            body.pop("x_systemone_batch")
        return web.json_response(body, status=reply.status)

    async def missing(request: web.Request) -> web.Response:
        paths.append(request.path)
        if hang:
            await asyncio.sleep(3)
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_get("/v1/models", proxy)
    app.router.add_post("/v1/systemone", proxy)
    app.router.add_post("/v1/systemone/batch", missing)
    return _serving(app, paths)


class _serving:
    def __init__(self, app: web.Application, paths: list[str]) -> None:
        self.app, self.paths = app, paths
        self.runner = web.AppRunner(app)

    async def __aenter__(self) -> _Older:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        return _Older(f"http://{host}:{port}", self.paths)

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


@pytest.mark.asyncio
async def test_a_record_timeout_covers_its_request_and_cancels_it_once_none_waits(
    stub: InMemoryStubBackend,
) -> None:
    stub.state_behaviours["slow"] = sleeping(30.0)
    async with gateway(stub) as url:
        started = time.perf_counter()
        items = await judged(url, ["slow", "quick"], record_timeout=0.5)
        elapsed = time.perf_counter() - started
        # one request carried both: the slow state held its answer back, so both timed out
        assert [type(item.error) for item in items] == [tv.DeadlineExceededError] * 2
        assert elapsed < 5.0
        for _ in range(100):  # the request was cancelled: the gateway stops judging it
            if "refund" in stub.cancelled:
                break
            await asyncio.sleep(0.05)
        assert "refund" in stub.cancelled
        assert stub.in_flight == 0
        items = await judged(url, ["quick", "quick again"], record_timeout=5.0)
        assert all(item.judgment is not None for item in items)


@pytest.mark.asyncio
async def test_a_batch_past_the_request_timeout_is_not_sent_again_whole(
    stub: InMemoryStubBackend,
) -> None:
    # The batch route hangs past the client's request_timeout: each state goes alone (and is
    # answered) instead of the whole batch being sent again to run as long again.
    async with gateway(stub) as url, older_server(url, advertise=True, hang=True) as old:
        async with tv.Session.system_one(
            old.url,
            http=tv.HttpSettings(api_key=KEY, request_timeout=0.5),
        ) as session:
            items = [item async for item in session.judge_many(STATES[:3], QUESTIONS)]
        assert all(item.judgment is not None for item in items)
        assert old.paths.count("/v1/systemone/batch") == 1
        assert old.paths.count("/v1/systemone") == 3


# -- issue 43.4: an advertised batch size is capped, and workers are sized to the records ----

ADVERTISED = 300_000
WORKER = "typevet_async._session.batch._Engine._work"


@pytest.mark.asyncio
async def test_an_advertised_300000_is_capped_and_3_records_start_3_workers(
    stub: InMemoryStubBackend,
) -> None:
    # Our gateway (real, in-process) behind a proxy that only rewrites its advertisement.
    async with gateway(stub) as url, AdvertisingProxy(url, ADVERTISED) as proxy:
        async with tv.Session.system_one(proxy.url, http=tv.HttpSettings(api_key=KEY)) as session:
            with counting_tasks() as created:
                items = [item async for item in session.judge_many(STATES[:3], QUESTIONS)]
            backend = session.backend
            assert isinstance(backend, AsyncSystemOne)
            assert backend.batch_limit == 64  # the default cap, not the advertisement
        assert [item.judgment is not None for item in items] == [True] * 3
        assert created[WORKER] == 3  # was 300,000 (16-18 s and 1 GB in the issue)
        # every task the client, the proxy and the gateway made: a bounded few, not per state
        # the server may take
        assert sum(created.values()) < 60, created
        assert proxy.states_per_batch() == [3]
        assert proxy.count("/v1/systemone") == 0


@pytest.mark.asyncio
async def test_an_input_of_unknown_length_starts_one_worker_more_and_still_one_batch(
    stub: InMemoryStubBackend,
) -> None:
    def records() -> Iterator[str]:
        yield from STATES[:3]

    async with gateway(stub) as url, AdvertisingProxy(url, ADVERTISED) as proxy:
        async with tv.Session.system_one(proxy.url, http=tv.HttpSettings(api_key=KEY)) as session:
            with counting_tasks() as created:
                items = [item async for item in session.judge_many(records(), QUESTIONS)]
        assert [item.judgment is not None for item in items] == [True] * 3
        # one worker per record pulled, and the one that met the input's end
        assert created[WORKER] == 4
        # the workers start one a loop pass; the batch waits for a pass that adds no record
        assert proxy.states_per_batch() == [3]


@pytest.mark.asyncio
async def test_the_cap_taken_from_an_advertisement_chunks_the_batch(
    stub: InMemoryStubBackend,
) -> None:
    states = [f"ticket {n}" for n in range(100)]
    # the gateway itself takes 100 states a batch (its admission queue raised to allow it)
    async with (
        gateway(stub, max_batch_states=200, max_queue=200) as url,
        AdvertisingProxy(url, ADVERTISED) as proxy,
    ):
        async with tv.Session.system_one(proxy.url, http=tv.HttpSettings(api_key=KEY)) as session:
            with counting_tasks() as created:
                items = [item async for item in session.judge_many(states, QUESTIONS)]
        assert all(item.judgment is not None for item in items)
        assert [item.index for item in items] == list(range(100))
        assert proxy.states_per_batch() == [64, 36]  # was [100]: the advertisement as taken
        assert created[WORKER] == 64
        proxy.requests.clear()
        async with tv.Session.system_one(
            proxy.url, http=tv.HttpSettings(api_key=KEY), max_batch_states=30
        ) as session:
            items = [item async for item in session.judge_many(states, QUESTIONS)]
        assert all(item.judgment is not None for item in items)
        assert proxy.states_per_batch() == [30, 30, 30, 10]
    assert proxy.count("/v1/systemone") == 0


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "64"])
def test_a_bad_max_batch_states_is_refused_at_the_factory(bad: Any) -> None:
    with pytest.raises(tv.ConfigurationError, match="max_batch_states"):
        tv.Session.system_one("http://127.0.0.1:9", max_batch_states=bad)
