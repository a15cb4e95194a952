"""``typevet-async mcp``: the typed questions as Model Context Protocol tools, over stdio.

An I/O shell over one `tv.Session`, built on the MCP SDK's own server
(`mcp.server.mcpserver.MCPServer`, mcp 2.x). The session is opened when the server starts
(its lifespan) and closed when it stops, which on stdio is when the client closes the
server's stdin. The model server is probed once at startup in the background, for the log
only: one that is down makes each tool call an error result, not a server that never
starts.

Tools (arguments and results are JSON; every field is described in the tool's schemas):

- ``ask_noul(state, instructions)``: ``{"type": "noul", "noul", "confidence",
  "probabilities": {"false", "true"}, "off_menu_mass"}``; ``noul`` is P(true).
- ``ask_choice(state, instructions, options)``: ``{"type": "choice", "choice", "confidence",
  "probabilities": {label: p}, "off_menu_mass"}``.
- ``ask_score(state, instructions, levels)``: ``{"type": "score", "score", "confidence",
  "legend": {"0": level, ...}, "probabilities": {"0": p, ...}, "off_menu_mass"}``;
  ``score`` is the expected level, 0-based.
- ``ask(state, questions)``: several questions at once. ``questions`` is System One's
  ``questions`` object (what ``POST /v1/systemone`` takes, read by
  `typevet_async._core.wires.system_one`); the result is System One's response,
  ``{"model", "answers", "usage"}`` (`response_to_system_one`).

``state`` is any JSON value, as `Session.judge` takes it. The MCP SDK reads a string that
holds a JSON object or array as that value (some clients send objects as JSON text).

**Errors.** A bad question, bad input or a failure of the model server is a tool result with
``isError`` whose text is ``Error executing tool NAME: ErrorType: message``, the SDK's typed
error and its own message; for ``ask`` the message lists every problem of the questions at
once. Arguments of the wrong JSON type are refused by the MCP SDK the same way, with
pydantic's message. Nothing a caller sends stops the server. Logs go to stderr: on stdio,
stdout carries only the protocol (the MCP SDK also points file descriptor 1 at stderr
while it serves, so a stray write cannot corrupt the wire).

**Stopping.** The client closing stdin, SIGTERM or Ctrl-C: each closes the session (and an
embedded server with it) before the process ends. stdin is read by a daemon thread of our
own (`typevet_async._apps.jsonl.PipeLines`), so a signal never waits for a line that does not come.
"""

from __future__ import annotations

from typevet_async._apps.mcp.stdio import MESSAGE_BUDGET, message_refusal, serve_stdio
from typevet_async._apps.mcp.tools import (
    INSTRUCTIONS,
    QUESTIONS_SCHEMA,
    SERVER_NAME,
    ChoiceResult,
    NoulResult,
    ScoreResult,
    SystemOneResponse,
    build_server,
)

__all__ = [
    "INSTRUCTIONS",
    "MESSAGE_BUDGET",
    "QUESTIONS_SCHEMA",
    "SERVER_NAME",
    "ChoiceResult",
    "NoulResult",
    "ScoreResult",
    "SystemOneResponse",
    "build_server",
    "message_refusal",
    "serve_stdio",
]
