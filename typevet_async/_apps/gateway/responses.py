"""What the gateway answers: the System One error shapes, an SDK error as `presenting` says
(never an upstream's address), the request id every response carries and the response's
extension.

The error shape is decided here, once, by the status (`error_body`): a 422 (a validation
failure) is ``{"detail": [{"loc", "msg", "type", "input"}]}``, as the official client's
``HTTPValidationError`` declares it; every other error is ``{"detail": {"error_type",
"message"}}``, the hosted API's and jevcompat's ``errors.shape`` (a 401 says
``"authentication_error"``). The official client's typed errors follow the status, and its
message reader takes ``detail.message`` and ``detail[].msg`` alike.
"""

from __future__ import annotations

import logging
import math
import secrets
import traceback
from collections.abc import Mapping
from typing import Any, Final

import orjson
from aiohttp import web

import typevet_async as tv
import typevet_async._telemetry as telemetry
from typevet_async._apps.gateway.state import GatewayState, Metrics
from typevet_async._apps.presenting import error_text, judgment_fields, present_error
from typevet_async._core.wires.system_one import validation_detail

__all__ = [
    "REQUEST_ID_HEADER",
    "error_body",
    "error_response",
    "extension",
    "json_response",
    "log_failure",
    "new_request_id",
    "sdk_error_response",
    "shed_response",
]

#: The response header naming the request (the official client shows it in its errors).
REQUEST_ID_HEADER: Final = "x-typesafe-request-id"

log = logging.getLogger("typevet_async.gateway")


def new_request_id() -> str:
    """A fresh request id: ``req_`` and 24 random hex digits (a client's own is not echoed)."""
    return f"req_{secrets.token_hex(12)}"


def error_body(status: int, loc: list[str | int], msg: str, kind: str) -> dict[str, Any]:
    """An error's body by its status: a 422's the validation list (``loc`` says where), any
    other's ``{"detail": {"error_type": kind, "message": msg}}``."""
    if status == 422:
        return {"detail": [validation_detail(loc, msg, kind)]}
    return {"detail": {"error_type": kind, "message": msg}}


def error_response(
    status: int,
    loc: list[str | int],
    msg: str,
    kind: str,
    *,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An error in its status's shape (`error_body`)."""
    return json_response(status, error_body(status, loc, msg, kind), headers=headers)


def json_response(
    status: int, body: Any, *, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def log_failure(
    logger: logging.Logger, level: int, what: str, error: BaseException, *, stack: bool = False
) -> None:
    """Log that ``what`` failed with ``error``: its type and HTTP status (``extra``:
    ``error_type``, ``status``), never its text, since an upstream's reply quoted in it may
    quote the caller's prompt; the text (and a bug's whole traceback) only under the content
    switch, ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``. ``stack``: a bug,
    whose frames (the code's lines, no values) are logged without its message."""
    status = getattr(error, "status", None)
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    said = f" (HTTP {status})" if status is not None else ""
    extra = {"error_type": type(error).__name__, "status": status}
    if telemetry.CAPTURE_CONTENT:
        exc_info = error if stack else None
        logger.log(level, "%s: %s%s", what, error_text(error), said, exc_info=exc_info, extra=extra)
        return
    frames = "".join(traceback.format_tb(error.__traceback__)) if stack else ""
    tail = f"\nTraceback (its message and causes withheld):\n{frames.rstrip()}" if frames else ""
    logger.log(level, "%s: %s%s%s", what, type(error).__name__, said, tail, extra=extra)


def sdk_error_response(metrics: Metrics | None, error: BaseException) -> web.Response:
    """An SDK error as the gateway's answer (counted by its type); a 5xx's details, which name
    the model server, go to the log only, and only by type and status (`log_failure`)."""
    if metrics is not None:
        metrics.errors.labels(type(error).__name__).inc()
    presented = present_error(error)
    if presented is None:
        log_failure(log, logging.ERROR, "judgment failed", error, stack=True)
        return error_response(500, ["server"], "internal server error", "internal_error")
    if presented.hides_details:
        log_failure(log, logging.WARNING, "judgment failed", error)
    return error_response(presented.status, list(presented.loc), presented.message, presented.kind)


def shed_response(state: GatewayState, judgments: int) -> web.Response | None:
    """The 429 for a request of ``judgments`` judgments (a batch's states each count) when
    admitting it would pass the places open now (`GatewayState.places`: the most admitted,
    and those judged within the deadline at the measured service times); None: admit it. Its
    ``Retry-After`` is whole seconds (rounded up, at least 1: the header's unit) and its
    ``retry-after-ms`` the estimate itself (`GatewayState.retry_after`)."""
    if judgments <= state.places():
        return None
    wait = state.retry_after(judgments)
    retry = {"Retry-After": str(max(1, math.ceil(wait))), "retry-after-ms": str(round(wait * 1000))}
    return error_response(
        429,
        ["server"],
        f"too many requests in flight: retry in {wait:.2f} s",
        "rate_limited",
        headers=retry,
    )


def extension(judgment: tv.Judgment) -> dict[str, Any]:
    """The ``x_typevet`` extension of a response: the judgment's usage and diagnostics, less
    the endpoint that answered (an upstream address behind the gateway)."""
    fields = judgment_fields(judgment)
    for diagnostics in fields.get("diagnostics", {}).values():
        diagnostics.pop("endpoint", None)
    return fields
