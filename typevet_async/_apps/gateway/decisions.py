"""``POST /v1/decisions``: OpenAI's Decisions API served from the session's judgments, the
same reads as ``/v1/systemone`` (`typevet_async._core.wires.decisions` owns the wire).

The route shares everything but the wire with ``/v1/systemone``: the bearer keys, the body's
byte cap and read deadline, its decode under the budget in a worker thread (bytes, items,
depth, CPU time; ``Content-Encoding`` zstd, gzip or identity), admission (429 with
``Retry-After`` and ``retry-after-ms``), the request deadline and the metrics. Each question
is judged with ``raise_off_menu`` off, so a question the off-menu guard flags is answered with
a refusal while the others are answered.

Its errors are in OpenAI's shape, which the ``openai`` client reads (``{"error": {"message",
"type", "param", "code"}}``; the client raises its own typed exception by the status):
`openai_error_shape` rewrites whatever error the gateway's shared paths answered on this route,
so each status keeps its one owner (`typevet_async._apps.gateway.responses.error_body`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import orjson
from aiohttp import web

import typevet_async as tv
from typevet_async._apps.gateway.bodies import decoded_body, json_within_budget
from typevet_async._apps.gateway.config import GatewayConfig
from typevet_async._apps.gateway.encoding import decompress
from typevet_async._apps.gateway.multipart import media_type
from typevet_async._apps.gateway.responses import error_response, json_response
from typevet_async._apps.gateway.state import SESSION, STATE, GatewayState
from typevet_async._apps.presenting import served_model
from typevet_async._core.wires.decisions import (
    DecisionsCall,
    DecisionsValidationError,
    refused_questions,
    request_from_decisions,
    response_to_decisions,
)
from typevet_async._core.wires.decoding import CpuClock

__all__ = ["PATH", "decode_decisions", "handle_decisions", "openai_error", "openai_error_shape"]

PATH: Final = "/v1/decisions"

#: The gateway's shared judging step (`typevet_async._apps.gateway.app`): a judgment, or the
#: response for its failure.
Judged = Callable[..., Awaitable["tv.Judgment | web.Response"]]
#: Admission: None to go on, or the 429 that sheds the request.
Shed = Callable[[GatewayState], "web.Response | None"]


#: A Decisions request, its input's images and each question's own (`Session.judge`'s
#: ``images`` and ``question_images``).
Decoded = tuple[DecisionsCall, list["tv.Image"], dict[str, list["tv.Image"]]]


def decode_decisions(
    raw: bytes, encoding: str, content_type: str, config: GatewayConfig
) -> Decoded | web.Response:
    """A body as the Decisions request it holds and its images (the input's, each question's
    own), within ``config``'s budget (pure and CPU-bound: the gateway runs it in a worker
    thread).

    :raises DecodeError: past the budget, or an encoding that does not decode.
    :raises DecisionsValidationError: not a Decisions request, or past a count limit.
    :raises InvalidInputError: an image past the session's cap.
    """
    budget = config.decode_budget()
    clock = CpuClock(budget.cpu_seconds)
    media = media_type(content_type)
    if media.startswith("multipart/"):
        return error_response(
            415,
            ["header", "content-type"],
            f"Content-Type {media!r} is not accepted here: send application/json",
            "unsupported_media_type",
        )
    body = decompress(raw, encoding, budget, clock)
    data = json_within_budget(body, budget, clock, DecisionsValidationError)
    call = request_from_decisions(data, max_questions=config.max_questions)
    clock.check()
    own = {
        question_id: [tv.Image.from_bytes(image, mime) for mime, image in images]
        for question_id, images in call.question_images.items()
    }
    return call, [tv.Image.from_bytes(image, mime) for mime, image in call.images], own


async def handle_decisions(request: web.Request, judged: Judged, shed: Shed) -> web.Response:
    """Decode (off the loop), admit or shed, judge (the guard's flags kept, not raised),
    answer in order."""
    state = request.app[STATE]
    session = request.app[SESSION]
    decoded = await decoded_body(request, state, decode_decisions)
    if isinstance(decoded, web.Response):
        return decoded
    call, images, own = decoded
    refusal = shed(state)
    if refusal is not None:
        return refusal
    # A question's own images go with its reads only (issue 43.7: they went with every
    # question's, before the state).
    judgment = await judged(state, session, call, images, raise_off_menu=False, question_images=own)
    if isinstance(judgment, web.Response):
        return judgment
    if state.metrics is not None:
        state.metrics.reads.inc(judgment.usage.reads)
    model = state.served_model or served_model(session) or call.model
    body = response_to_decisions(
        call,
        judgment.answers,
        model,
        refused=refused_questions(judgment),
        prompt_tokens=judgment.usage.prompt_tokens,
        cached_tokens=judgment.usage.cached_tokens,
    )
    return json_response(200, body)


#: OpenAI's error ``type`` by status (any other 4xx: ``invalid_request_error``).
_TYPES: Final = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


def _param(loc: Sequence[Any]) -> str | None:
    """A 422 entry's ``loc`` as OpenAI names a parameter: ``questions[3].choices``.

    One spelling for a question, whoever refused it: the SDK's errors name a question by its
    id, which on this route is its position as text (``"3"``), so a refusal while judging is
    ``questions[3]`` as the route's own validation writes it (it was ``questions.3``, which
    `Session.openai_decisions` did not read as a question's, issue 43.8)."""
    path = [part for part in loc if part != "body"]
    if len(path) > 1 and path[0] == "questions" and isinstance(path[1], str):
        position = path[1]
        if position.isascii() and position.isdecimal():
            path[1] = int(position)
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or None


def openai_error(status: int, detail: Any) -> dict[str, Any]:
    """The ``error`` object of OpenAI's error shape for a gateway error's ``detail``: a 422's
    problems (every one in the message; the first's place as ``param`` and kind as ``code``),
    any other's message and kind."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    if isinstance(detail, list) and detail and all(isinstance(d, dict) for d in detail):
        problems = [f"{_param(d.get('loc', [])) or 'body'}: {d.get('msg')}" for d in detail]
        first = detail[0]
        return {
            "message": "; ".join(problems),
            "type": kind,
            "param": _param(first.get("loc", [])),
            "code": first.get("type"),
        }
    if isinstance(detail, dict):
        return {
            "message": str(detail.get("message")),
            "type": kind,
            "param": None,
            "code": detail.get("error_type"),
        }
    return {"message": f"HTTP {status}", "type": kind, "param": None, "code": None}


@web.middleware
async def openai_error_shape(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """On ``/v1/decisions``, every error the gateway answers (auth, limits, decoding,
    validation, admission, the judgment's) in OpenAI's shape; other routes untouched."""
    response = await handler(request)
    if request.path != PATH or response.status < 400 or not isinstance(response, web.Response):
        return response
    body = response.body
    try:
        data = orjson.loads(body) if isinstance(body, bytes) else None
    except orjson.JSONDecodeError:
        data = None
    detail = data.get("detail") if isinstance(data, dict) else None
    response.body = orjson.dumps({"error": openai_error(response.status, detail)})
    return response
