"""A request's body as the System One call it holds: read with a deadline and a byte cap, then
decoded under the configured budget (`typevet_async._core.decoding`) by a pure function the
app runs in a worker thread."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

import typevet_async as tv
from typevet_async._core.decoding import CpuClock, check_json_budget
from typevet_async._core.systemone import SystemOneCall, request_from_system_one, validation_detail
from typevet_async._errors import (
    BadEncodingError,
    BodyTooLargeError,
    BudgetExceededError,
    DecodeError,
    SystemOneValidationError,
)
from typevet_async._gateway.config import GatewayConfig
from typevet_async._gateway.encoding import decompress
from typevet_async._gateway.multipart import media_type, request_from_system_one_multipart
from typevet_async._gateway.responses import error_response, json_response

__all__ = ["decode_error_response", "decode_request", "read_raw"]


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
            408, ["body"], f"the body did not arrive within {body_timeout:g} s", "timeout",
            headers={"Connection": "close"},
        )  # fmt: skip


def decode_request(
    raw: bytes, encoding: str, content_type: str, config: GatewayConfig
) -> tuple[SystemOneCall, list[tv.Image]] | web.Response:
    """A body as the request it holds and its images, decoded within ``config``'s budget:
    pure and CPU-bound, so the gateway runs it in a worker thread (the event loop serves
    everyone else meanwhile), and every step stops at a limit instead of running long.

    :raises DecodeError: past the budget, or an encoding that does not decode.
    :raises SystemOneValidationError: not a System One request, or past a count limit.
    :raises InvalidInputError: an image that is not one.
    """
    budget = config.decode_budget()
    clock = CpuClock(budget.cpu_seconds)
    body = decompress(raw, encoding, budget, clock)
    media = media_type(content_type)
    if media == "multipart/form-data":
        call = request_from_system_one_multipart(
            body, content_type, budget=budget, clock=clock, max_assets=config.max_assets,
            max_questions=config.max_questions,
        )  # fmt: skip
    elif media.startswith("multipart/"):
        return error_response(
            415, ["header", "content-type"],
            f"Content-Type {media!r} is not accepted: send application/json or "
            "multipart/form-data",
            "unsupported_media_type",
        )  # fmt: skip
    else:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise SystemOneValidationError(
                [validation_detail(["body"], f"not valid JSON: {error}", "json_invalid")]
            ) from None
        check_json_budget(data, budget, clock)
        call = request_from_system_one(
            data, max_assets=config.max_assets, max_questions=config.max_questions
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
