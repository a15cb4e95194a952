"""A request's body as the System One call it holds: read with a deadline and a byte cap, then
decoded under the configured budget (`typevet_async._core.wires.decoding`) by a pure function the
app runs in a worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread
import orjson
from aiohttp import web

import typevet_async as tv
from typevet_async._apps.gateway.config import GatewayConfig
from typevet_async._apps.gateway.encoding import decompress
from typevet_async._apps.gateway.multipart import media_type, request_from_system_one_multipart
from typevet_async._apps.gateway.responses import error_response, json_response, sdk_error_response
from typevet_async._apps.gateway.state import GatewayState
from typevet_async._apps.presenting import served_model
from typevet_async._core.wires.decoding import CpuClock, DecodeBudget, check_json_budget
from typevet_async._core.wires.system_one import (
    SystemOneCall,
    request_from_system_one,
    validation_detail,
)
from typevet_async._errors import (
    BadEncodingError,
    BodyTooLargeError,
    BudgetExceededError,
    DecisionsValidationError,
    DecodeError,
    SystemOneValidationError,
)

__all__ = [
    "decode_error_response",
    "decode_request",
    "decoded_body",
    "json_within_budget",
    "read_raw",
    "served_name",
]

Decoded = TypeVar("Decoded")
#: A route's pure decoder: the raw body, its Content-Encoding and Content-Type, the config.
Decoder = Callable[[bytes, str, str, GatewayConfig], Decoded]


def served_name(state: GatewayState, session: tv.Session) -> str:
    """The name of the one model the gateway serves (whatever name a request gives, its
    session reads one model): the probe's, else the session's pin, else ``"default"``, the
    name ``GET /v1/models`` gives it before the probe."""
    return state.served_model or served_model(session) or "default"


async def read_raw(request: web.Request, cap: int, body_timeout: float) -> bytes | web.Response:
    """The body as it came (compressed or not), at most ``cap`` bytes."""
    too_large = error_response(413, ["body"], f"the body exceeds the {cap}-byte limit", "too_large")
    if request.content_length is not None and request.content_length > cap:
        return too_large
    try:
        async with asyncio.timeout(body_timeout):
            return await request.read()  # client_max_size is ``cap``: aiohttp raises 413 past it
    except web.HTTPRequestEntityTooLarge:
        return too_large
    except TimeoutError:
        return error_response(
            408,
            ["body"],
            f"the body did not arrive within {body_timeout:g} s",
            "timeout",
            headers={"Connection": "close"},
        )


def decode_request(
    raw: bytes,
    encoding: str,
    content_type: str,
    config: GatewayConfig,
    *,
    served_model: str | None = None,
) -> tuple[SystemOneCall, list[tv.Image]] | web.Response:
    """A body as the request it holds and its images, decoded within ``config``'s budget:
    pure and CPU-bound, so the gateway runs it in a worker thread (the event loop serves
    everyone else meanwhile), and every step stops at a limit instead of running long.
    A request without ``model`` is answered by ``served_model``, the one the gateway serves.

    :raises DecodeError: past the budget, or an encoding that does not decode.
    :raises SystemOneValidationError: not a System One request, or past a count limit.
    :raises InvalidInputError: an image that is not one.
    """
    budget = config.decode_budget()
    clock = CpuClock(budget.cpu_seconds)
    served = () if served_model is None else (served_model,)
    body = decompress(raw, encoding, budget, clock)
    media = media_type(content_type)
    if media == "multipart/form-data":
        call = request_from_system_one_multipart(
            body,
            content_type,
            budget=budget,
            clock=clock,
            max_assets=config.max_assets,
            max_questions=config.max_questions,
            served_models=served,
        )
    elif media.startswith("multipart/"):
        return error_response(
            415,
            ["header", "content-type"],
            f"Content-Type {media!r} is not accepted: send application/json or multipart/form-data",
            "unsupported_media_type",
        )
    else:
        data = json_within_budget(body, budget, clock)
        call = request_from_system_one(
            data,
            max_assets=config.max_assets,
            max_questions=config.max_questions,
            served_models=served,
        )
    clock.check()
    return call, [tv.Image.from_bytes(image, mime) for mime, image in call.images]


def decode_error_response(error: DecodeError) -> web.Response:
    if isinstance(error, BodyTooLargeError):
        return error_response(413, ["body"], str(error), "too_large")
    if isinstance(error, BadEncodingError):
        return error_response(
            415, ["header", "content-encoding"], str(error), "unsupported_encoding"
        )
    limit = error.limit if isinstance(error, BudgetExceededError) else "body"
    return json_response(
        422,
        {
            "detail": [
                validation_detail(["body"], str(error), "budget_exceeded", None, {"limit": limit})
            ]
        },
    )


async def decoded_body(
    request: web.Request, state: GatewayState, decode: Decoder[Decoded]
) -> Decoded | web.Response:
    """The body read (`read_raw`) and decoded by the route's ``decode`` in a worker thread
    under the budget, never on the event loop; or the answer that refuses it: the read's
    413/408, a decode error's status, a validation failure's 422 detail, an SDK input error.
    Every route of the gateway decodes through here."""
    config = state.config
    raw = await read_raw(request, config.max_body_bytes, config.body_timeout)
    if isinstance(raw, web.Response):
        return raw
    try:
        return await anyio.to_thread.run_sync(
            decode,
            raw,
            request.headers.get("Content-Encoding", ""),
            request.headers.get("Content-Type", ""),
            config,
            limiter=state.decoders,
        )
    except DecodeError as error:
        if state.metrics is not None:
            state.metrics.errors.labels(type(error).__name__).inc()
        return decode_error_response(error)
    except (SystemOneValidationError, DecisionsValidationError) as error:
        if state.metrics is not None:
            state.metrics.errors.labels(type(error).__name__).inc()
        return json_response(422, {"detail": error.detail})
    except tv.InvalidInputError as error:
        return sdk_error_response(state.metrics, error)


def json_within_budget(
    body: bytes,
    budget: DecodeBudget,
    clock: CpuClock,
    invalid: type[SystemOneValidationError | DecisionsValidationError] = SystemOneValidationError,
) -> Any:
    """A decompressed body's JSON value, walked within ``budget`` (`check_json_budget`): every
    route's JSON step. Not JSON: the route's 422 (``invalid``), naming the body.

    :raises BudgetExceededError: the value is past the budget's items, depth or CPU time.
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise invalid(
            [validation_detail(["body"], f"not valid JSON: {error}", "json_invalid")]
        ) from None
    check_json_budget(data, budget, clock)
    return data
