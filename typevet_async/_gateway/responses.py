"""What the gateway answers: the System One error shape, an SDK error as `_presenting` says
(never an upstream's address) and the response's extension."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

import typevet_async as tv
from typevet_async._core.systemone import validation_detail
from typevet_async._gateway.state import Metrics
from typevet_async._presenting import error_text, judgment_fields, present_error

__all__ = ["error_response", "extension", "json_response", "sdk_error_response"]

log = logging.getLogger("typevet_async.gateway")


def error_response(
    status: int,
    loc: list[str | int],
    msg: str,
    kind: str,
    *,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return json_response(status, {"detail": [validation_detail(loc, msg, kind)]}, headers=headers)


def json_response(
    status: int, body: Any, *, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def sdk_error_response(metrics: Metrics | None, error: BaseException) -> web.Response:
    """An SDK error as the gateway's answer (counted by its type); a 5xx's details, which name
    the model server, go to the log only."""
    if metrics is not None:
        metrics.errors.labels(type(error).__name__).inc()
    presented = present_error(error)
    if presented is None:
        log.error("judgment failed: %s", type(error).__name__)
        return error_response(500, ["server"], "internal server error", "internal_error")
    if presented.hides_details:
        log.warning("judgment failed: %s", error_text(error))
    return error_response(presented.status, list(presented.loc), presented.message, presented.kind)


def extension(judgment: tv.Judgment) -> dict[str, Any]:
    """The ``typevet`` extension of a response: the judgment's usage and diagnostics, less
    the endpoint that answered (an upstream address behind the gateway)."""
    fields = judgment_fields(judgment)
    for diagnostics in fields.get("diagnostics", {}).values():
        diagnostics.pop("endpoint", None)
    return fields
