"""How the applications (the command line, the gateway, MCP, eval, Ray) present the SDK's
results to their users: an answer as a JSON-ready dict, an error as a status, a kind and a
message, and the served model's name. Each rule is written here once; every application
takes it from here rather than from the SDK's internals.

No I/O and no web framework: the gateway turns a `Presented` error into its HTTP response,
MCP into a tool error, the command line into its one stderr line.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

import attrs
import orjson

import typevet_async as tv
from typevet_async._core.reading.answers_json import converter

__all__ = [
    "Presented",
    "error_text",
    "judgment_fields",
    "model_alias",
    "present_error",
    "served_model",
]


def judgment_fields(judgment: tv.Judgment) -> dict[str, Any]:
    """A judgment as JSON-ready fields: ``answers`` (System One's answer shape, by question
    id), ``usage`` and ``diagnostics``."""
    fields: dict[str, Any] = converter.unstructure(judgment)
    return fields


def error_text(error: BaseException) -> str:
    """An error in one phrase for a user: its type's name and its own message."""
    return f"{type(error).__name__}: {error}"


@attrs.frozen
class Presented:
    """An SDK error as an application tells its client: an HTTP-like status, a kind (System
    One's ``detail[].type`` in a 422, its ``detail.error_type`` otherwise: the gateway's
    `error_body` writes the shape), where the problem lies and the message."""

    status: int
    kind: str
    #: Where: ``["body"]`` (the request's own problem), ``["body", "questions", id]`` (one
    #: question's) or ``["upstream"]`` (the model server's).
    loc: tuple[str, ...]
    message: str
    #: The message is the SDK's own: a 5xx's would name the model server's address, so it is
    #: replaced by what failed and what it means; the full text belongs in a log only.
    hides_details: bool = False


#: SDK errors -> (status, kind, what a client is told of a 5xx: never the upstream's address
#: or text, which a log keeps; a 422 shows the SDK's own message); the first match wins
#: (subclasses before bases).
_ERROR_STATUS: Final[tuple[tuple[type[BaseException], int, str, str], ...]] = (
    (
        tv.UnsupportedTemplateError,
        501,
        "unsupported_template",
        "the model server's chat template cannot be judged",
    ),
    (tv.DeadlineExceededError, 504, "timeout", "the judgment outlived its deadline"),
    (tv.RequestTimeoutError, 504, "upstream_timeout", "the model server did not answer in time"),
    (tv.InvalidInputError, 422, "value_error", ""),
    (tv.ServerError, 502, "upstream_error", "the model server answered with an error"),
    (tv.TransportError, 502, "upstream_unreachable", "the model server could not be reached"),
    (
        tv.ProtocolError,
        502,
        "upstream_protocol_error",
        "the model server's reply was not what its protocol says",
    ),
    (tv.OffMenuError, 502, "off_menu", "the model's answer fell off the question's options"),
    (tv.RefusalError, 502, "refusal", "the upstream Decisions server declined a question"),
    (tv.SessionStateError, 503, "unavailable", "the session is not open"),
)

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


def present_error(error: BaseException) -> Presented | None:
    """How a client is told of an SDK error; None for anything else (a bug: a 500)."""
    if isinstance(error, tv.ServerError) and error.status in _UPSTREAM_REFUSALS:
        return Presented(
            422,
            "upstream_refused",
            ("body",),
            f"the model server refused the request (HTTP {error.status}): "
            f"{_upstream_message(error.body)}",
        )
    for kind, status, detail_type, told in _ERROR_STATUS:
        if not isinstance(error, kind):
            continue
        if status < 500:
            question_id = getattr(error, "question_id", None)
            loc = ("body",) if question_id is None else ("body", "questions", str(question_id))
            return Presented(status, detail_type, loc, error_text(error))
        code = getattr(error, "status", None)
        said = f" (HTTP {code})" if isinstance(code, int) else ""
        message = f"{type(error).__name__}: {told}{said}; retry later (details are in the log)"
        return Presented(status, detail_type, ("upstream",), message, hides_details=True)
    return None


def model_alias(name: str | None) -> str | None:
    """The name clients see for a served model: a model id that is a local file's path (the
    embedded llama.cpp server lists its GGUF's) is shown by its file name, without ``.gguf``."""
    if name is None or ("/" not in name and "\\" not in name and not name.endswith(".gguf")):
        return name
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return base.removesuffix(".gguf") or None


def served_model(session: tv.Session, probe: tv.Probe | None = None) -> str | None:
    """The served model's name: the session's pinned model, else the first the server lists
    (``probe``), as `model_alias` shows it; None when neither names one."""
    listed = probe.model_ids[0] if probe is not None and probe.model_ids else None
    return model_alias(session.backend.model or listed)
