"""What the gateway answers: the System One error shape, an SDK error's status and message
(never an upstream's address), the response's extension and the served model's name."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Final

import orjson
from aiohttp import web

import typevet_async as tv
from typevet_async._convert import converter
from typevet_async._core.systemone import validation_detail
from typevet_async._gateway.state import Metrics

__all__ = [
    "error_response",
    "extension",
    "json_response",
    "model_alias",
    "sdk_error_response",
    "served_model",
]

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


#: SDK errors -> (status, detail type); the first match wins (subclasses before bases).
#: SDK errors -> (status, detail type, what a client is told of a 5xx: never the upstream's
#: address or text, which the log keeps; a 422 shows the SDK's own message); the first match
#: wins (subclasses before bases).
_ERROR_STATUS: Final[tuple[tuple[type[BaseException], int, str, str], ...]] = (
    (tv.UnsupportedTemplateError, 501, "unsupported_template",
     "the model server's chat template cannot be judged"),
    (tv.DeadlineExceededError, 504, "timeout", "the judgment outlived its deadline"),
    (tv.RequestTimeoutError, 504, "upstream_timeout", "the model server did not answer in time"),
    (tv.InvalidInputError, 422, "value_error", ""),
    (tv.ServerError, 502, "upstream_error", "the model server answered with an error"),
    (tv.TransportError, 502, "upstream_unreachable", "the model server could not be reached"),
    (tv.ProtocolError, 502, "upstream_protocol_error",
     "the model server's reply was not what its protocol says"),
    (tv.OffMenuError, 502, "off_menu", "the model's answer fell off the question's options"),
    (tv.SessionStateError, 503, "unavailable", "the gateway's session is not open"),
)  # fmt: skip


#: Upstream statuses that refuse the request as it was built from the client's input (vLLM:
#: "not a multimodal model" for images; llama.cpp: a prompt past the context): 422, the
#: request's own problem, not a 5xx that System One clients retry (they retry every 5xx).
_UPSTREAM_REFUSALS: Final = frozenset({400, 413, 422})


def _upstream_message(body: str) -> str:
    """What a model server's error body says: its ``error.message`` (OpenAI's shape, both
    servers'), else the body's start."""
    with contextlib.suppress(orjson.JSONDecodeError):
        data = orjson.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message
    return body[:500]


def sdk_error_response(metrics: Metrics | None, error: BaseException) -> web.Response:
    """An SDK error as the gateway's answer (counted by its type)."""
    if metrics is not None:
        metrics.errors.labels(type(error).__name__).inc()
    if isinstance(error, tv.ServerError) and error.status in _UPSTREAM_REFUSALS:
        return error_response(
            422, ["body"],
            f"the model server refused the request (HTTP {error.status}): "
            f"{_upstream_message(error.body)}",
            "upstream_refused",
        )  # fmt: skip
    for kind, status, detail_type, told in _ERROR_STATUS:
        if isinstance(error, kind):
            loc: list[str | int] = ["body"] if status == 422 else ["upstream"]
            question_id = getattr(error, "question_id", None)
            if status == 422 and question_id is not None:
                loc = ["body", "questions", str(question_id)]
            message = f"{type(error).__name__}: {error}"
            if status >= 500:
                # The details name the model server's address: the log has them, the client
                # gets what failed and what it means for it.
                log.warning("judgment failed: %s", message)
                code = getattr(error, "status", None)
                said = f" (HTTP {code})" if isinstance(code, int) else ""
                retry = "retry later (details are in the gateway's log)"
                message = f"{type(error).__name__}: {told}{said}; {retry}"
            return error_response(status, loc, message, detail_type)
    log.error("judgment failed: %s", type(error).__name__)
    return error_response(500, ["server"], "internal server error", "internal_error")


def extension(judgment: tv.Judgment) -> dict[str, Any]:
    """The ``typevet`` extension of a response: the judgment's usage and diagnostics, less
    the endpoint that answered (an upstream address behind the gateway)."""
    extension: dict[str, Any] = converter.unstructure(judgment)
    for diagnostics in extension.get("diagnostics", {}).values():
        diagnostics.pop("endpoint", None)
    return extension


def model_alias(name: str | None) -> str | None:
    """The name clients see for a served model: a model id that is a local file's path (the
    embedded llama.cpp server lists its GGUF's) is shown by its file name, without ``.gguf``."""
    if name is None or ("/" not in name and "\\" not in name and not name.endswith(".gguf")):
        return name
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return base.removesuffix(".gguf") or None


def served_model(session: tv.Session) -> str | None:
    return model_alias(session.backend.model)
