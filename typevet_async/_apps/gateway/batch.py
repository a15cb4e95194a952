"""``POST /v1/systemone/batch``: several states, the same questions, one result per state in
input order (the wire: `typevet_async._core.wires.system_one.batch`).

How a batch is served, and why:

- **Decoded like a single request**: read under ``max_body_bytes`` and ``body_timeout``, then
  decompressed, parsed and walked under the same budget (items, depth, CPU time) in a worker
  thread; its states are counted (``max_batch_states``) before any is read. JSON only: a
  batch carries no images.
- **Admission counts states, not bodies.** ``max_active_requests`` bounds the judgments the
  model server sees at once, and a batch of N states is N judgments: it is shed (429) when its
  last state would not be judged in time behind those admitted, or N more would pass the slots
  plus the queue, exactly as N single requests would be, and its
  states take the gateway's slots one at a time (a single feeder waits for each), so a
  request that arrives meanwhile is queued between two of the batch's states, not behind
  all of them. Counting a batch as one request would let a client multiply its share of the
  model server by the cap.
- **One deadline for the body** (``request_deadline``, its wait for slots included): the
  states not judged by then are answered with a 504-kind item error; those judged keep their
  answers. A shutdown past its timeout likewise answers the rest with 503-kind items.
- **An item's error never fails the batch**: a state that is not one, a prompt past the
  context, an upstream failure: each is the error ``/v1/systemone`` would have answered that
  state with, in its place.
- **Batch calibration**, when the gateway's session has it on (``--batch-calibration on``):
  once every state is judged, each question's batch prior over the request's answered states
  is divided out of their answers (no extra read; the floor of fewer than 16 answers, or 2 per
  option if more, or a batch that does not vary them, leaves them as read). Each result's
  ``x_typevet`` diagnostics keep the probabilities as read, the prior, its count and why it
  was skipped; ``GET /v1/models`` says whether the route divides, and its floor
  (`CALIBRATION_ADVERTISEMENT`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import anyio
import anyio.to_thread
from aiohttp import web

import typevet_async as tv
from typevet_async._apps.gateway.bodies import decoded_body, json_within_budget, served_name
from typevet_async._apps.gateway.config import GatewayConfig
from typevet_async._apps.gateway.encoding import decompress
from typevet_async._apps.gateway.multipart import media_type
from typevet_async._apps.gateway.responses import (
    error_response,
    extension,
    json_response,
    log_failure,
    shed_response,
)
from typevet_async._apps.gateway.state import SESSION, STATE, GatewayState
from typevet_async._apps.presenting import present_error, served_model
from typevet_async._core.statistics.batch_judgments import divide_batch
from typevet_async._core.wires.decoding import CpuClock
from typevet_async._core.wires.system_one import (
    SystemOneBatch,
    batch_from_system_one,
    batch_item_error,
    batch_response,
    response_to_system_one,
)

__all__ = ["decode_batch", "system_one_batch"]

log = logging.getLogger("typevet_async.gateway")


async def system_one_batch(request: web.Request) -> web.StreamResponse:
    """Decode (off the loop), admit or shed by its states, judge each, answer in order."""
    state = request.app[STATE]
    session = request.app[SESSION]
    decode = functools.partial(decode_batch, served_model=served_name(state, session))
    decoded = await decoded_body(request, state, decode)
    if isinstance(decoded, web.Response):
        return decoded
    batch = decoded
    indices = [index for index in range(len(batch.states)) if index not in batch.refused]
    shed = shed_response(state, len(indices))
    if shed is not None:
        return shed
    model = state.served_model or served_model(session) or batch.model
    judged, missing = await _judged(state, session, batch, indices)
    results = _bodies(session, batch, judged, model)
    for index, entry in batch.refused.items():
        loc = entry["loc"]
        results[index] = batch_item_error(422, entry["type"], f"state: {entry['msg']}", loc)
    unjudged = [index for index in indices if index not in results]
    for index in unjudged:
        results[index] = missing
    # cut off by the shutdown: the connection is not kept for another request
    cut_off = bool(unjudged) and missing["error"]["status"] == 503
    headers = {"Connection": "close"} if cut_off else None
    if state.metrics is not None:
        state.metrics.batch_states.inc(len(batch.states))
    ordered = [results[index] for index in range(len(batch.states))]
    return json_response(200, batch_response(model, ordered), headers=headers)


def decode_batch(
    raw: bytes,
    encoding: str,
    content_type: str,
    config: GatewayConfig,
    *,
    served_model: str | None = None,
) -> SystemOneBatch | web.Response:
    """A batch body decoded within ``config``'s budget (pure and CPU-bound: the gateway runs
    it in a worker thread); a batch without ``model`` is answered by ``served_model``.

    :raises DecodeError: past the budget, or an encoding that does not decode.
    :raises SystemOneValidationError: not a batch, or more states than ``max_batch_states``.
    """
    budget = config.decode_budget()
    clock = CpuClock(budget.cpu_seconds)
    body = decompress(raw, encoding, budget, clock)
    if media_type(content_type).startswith("multipart/"):
        return error_response(
            415,
            ["header", "content-type"],
            "a batch is JSON (application/json): it carries no images",
            "unsupported_media_type",
        )
    data = json_within_budget(body, budget, clock)
    batch = batch_from_system_one(
        data,
        max_states=config.batch_cap(),
        max_questions=config.max_questions,
        served_models=() if served_model is None else (served_model,),
    )
    clock.check()
    return batch


def _bodies(
    session: tv.Session,
    batch: SystemOneBatch,
    judged: dict[int, tv.Judgment | dict[str, Any]],
    model: str,
) -> dict[int, dict[str, Any]]:
    """Each judged state's result: its judgment as ``/v1/systemone`` answers it (divided by
    the batch's prior under the session's batch calibration), or its item error."""
    answered = {index: one for index, one in judged.items() if isinstance(one, tv.Judgment)}
    indices = sorted(answered)
    judgments = [answered[index] for index in indices]
    if session.settings.batch_calibration == "on":
        judgments = divide_batch(tuple(batch.questions.items()), judgments)
    results = {index: one for index, one in judged.items() if not isinstance(one, tv.Judgment)}
    for index, judgment in zip(indices, judgments, strict=True):
        results[index] = response_to_system_one(
            judgment, model, score_criteria=batch.score_criteria, extension=extension(judgment)
        )
    return results


async def _judged(
    state: GatewayState, session: tv.Session, batch: SystemOneBatch, indices: list[int]
) -> tuple[dict[int, tv.Judgment | dict[str, Any]], dict[str, Any]]:
    """Each admitted state's judgment or item error (those judged before the deadline or the
    shutdown's cut-off), and the item error every other state gets."""
    config = state.config
    results: dict[int, tv.Judgment | dict[str, Any]] = {}
    started: set[int] = set()
    # states given a slot, and when; one that never started gives it back here
    handed: dict[int, float] = {}
    missing = batch_item_error(
        504,
        "timeout",
        f"the batch outlived the gateway's {config.request_deadline}s deadline before this "
        "state was judged",
    )
    # the slot times of the states judging when a cancellation came: the deadline's cut counts
    # them as work (they held their slots all along), a shutdown or a client gone does not
    cut: list[float] = []
    state.admitted += len(indices)
    task = asyncio.current_task()
    if task is not None:
        state.judging.add(task)

    async def judge_one(index: int, held: float) -> None:
        started.add(index)  # before any await: from here on this task releases its slot
        try:
            results[index], worked = await _result(state, session, batch, index)
            if worked:
                state.held_since(held)
        except asyncio.CancelledError:
            cut.append(held)
            raise
        finally:
            state.slots.release()
            state.left_slot(held)
            state.admitted -= 1

    try:
        async with asyncio.timeout(config.request_deadline):
            async with anyio.create_task_group() as group:
                for index in indices:  # one slot at a time: others queue between our states
                    await state.slots.acquire()
                    handed[index] = held = state.took_slot()
                    group.start_soon(judge_one, index, held)
    except TimeoutError:
        for held in cut:
            state.held_since(held)
        if state.metrics is not None:
            state.metrics.errors.labels("Timeout").inc()
    except asyncio.CancelledError:
        if not state.cut_off or task is None:
            raise
        task.uncancel()
        missing = batch_item_error(
            503,
            "unavailable",
            "the gateway shut down before this state was judged: retry elsewhere or later",
        )
    finally:
        for index, held in handed.items():
            if index not in started:
                state.slots.release()
                state.left_slot(held)
        state.admitted -= len(indices) - len(started)
        if task is not None:
            state.judging.discard(task)
    return results, missing


async def _result(
    state: GatewayState, session: tv.Session, batch: SystemOneBatch, index: int
) -> tuple[tv.Judgment | dict[str, Any], bool]:
    """One state's judgment, or its error as an item; and whether it did the work
    (answered, or cut by the SDK's timeout), for admission."""
    metrics = state.metrics
    if metrics is not None:
        metrics.in_flight.inc()
    try:
        judgment = await session.judge(batch.states[index], batch.questions)
    except Exception as error:  # an item's error never fails the batch; cancellation does
        return _item_error(state, error), isinstance(error, TimeoutError)
    finally:
        if metrics is not None:
            metrics.in_flight.dec()
    if metrics is not None:
        metrics.reads.inc(judgment.usage.reads)
    return judgment, True


def _item_error(state: GatewayState, error: Exception) -> dict[str, Any]:
    """An error as the item `sdk_error_response` would have made the whole answer."""
    if state.metrics is not None:
        state.metrics.errors.labels(type(error).__name__).inc()
    presented = present_error(error)
    if presented is None:
        log_failure(log, logging.ERROR, "batch item failed", error, stack=True)
        return batch_item_error(500, "internal_error", "internal server error")
    if presented.hides_details:
        log_failure(log, logging.WARNING, "batch item failed", error)
    loc = list(presented.loc) if presented.status == 422 else None
    return batch_item_error(presented.status, presented.kind, presented.message, loc)
