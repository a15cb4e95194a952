"""The MCP server over this process's stdin and stdout: stdin read by a daemon thread (a
cancellation never waits for it), every line held to a budget and answered with a JSON-RPC
error when the MCP SDK could not read it (so every request gets a reply), SIGTERM handled."""

from __future__ import annotations

import logging
import signal
from typing import Final, cast

import anyio
import anyio.abc
import orjson
from mcp import types as mcp_types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

import typevet_async as tv
from typevet_async._apps.jsonl import PipeLines
from typevet_async._apps.mcp.tools import build_server
from typevet_async._core.wires.decoding import CpuClock, DecodeBudget, check_json_budget
from typevet_async._errors import BudgetExceededError

__all__ = ["MESSAGE_BUDGET", "message_refusal", "serve_stdio"]

log = logging.getLogger("typevet_async.mcp")


#: Lines of stdin the reader thread may read ahead of the server.
_READ_AHEAD: Final = 64


#: What one JSON-RPC message (one line of stdin) may use: past it, the request is answered
#: with a JSON-RPC error instead of reaching the MCP SDK (whose reader drops a line it cannot
#: parse, or one past pydantic's recursion limit, without a reply: the agent's call hung).
MESSAGE_BUDGET: Final = DecodeBudget(max_bytes=8 * 1024 * 1024, max_items=200_000, max_depth=128)
_PARSE_ERROR: Final = -32700
_INVALID_REQUEST: Final = -32600


def message_refusal(
    line: str, budget: DecodeBudget = MESSAGE_BUDGET
) -> mcp_types.JSONRPCError | None:
    """The JSON-RPC error that answers a line of stdin, or None for a message the MCP SDK can
    take: not JSON (-32700, id null), past the budget or not a JSON-RPC message (-32600, with
    the request's id where it has one)."""
    if len(line) > budget.max_bytes:
        return _rpc_error(None, _INVALID_REQUEST, f"a message over {budget.max_bytes} bytes")
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        return _rpc_error(None, _PARSE_ERROR, f"Parse error: {error}")
    request_id = data.get("id") if isinstance(data, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        request_id = None
    try:
        check_json_budget(data, budget, CpuClock(budget.cpu_seconds), "the message")
        mcp_types.jsonrpc_message_adapter.validate_python(data, by_name=False)
    except BudgetExceededError as error:
        return _rpc_error(request_id, _INVALID_REQUEST, f"Invalid Request: {error}")
    except ValidationError as error:
        problems = error.errors()
        problem = problems[0]["msg"] if problems else str(error)
        return _rpc_error(request_id, _INVALID_REQUEST, f"Invalid Request: {problem}")
    return None


def _rpc_error(request_id: int | str | None, code: int, message: str) -> mcp_types.JSONRPCError:
    return mcp_types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=mcp_types.ErrorData(code=code, message=message)
    )


class _CheckedLines:
    """Stdin's lines as the MCP SDK reads them, each first held to `message_refusal`: a line
    refused is answered on the server's own write stream (so every request gets a reply) and
    not passed on; a blank line is skipped."""

    def __init__(self, lines: PipeLines) -> None:
        self._lines = lines
        self._replies: anyio.abc.ObjectSendStream[SessionMessage] | None = None
        self._ready = anyio.Event()

    def reply_on(self, stream: anyio.abc.ObjectSendStream[SessionMessage]) -> None:
        self._replies = stream
        self._ready.set()

    def __aiter__(self) -> _CheckedLines:
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                raw = await self._lines.__anext__()
            except OSError as error:
                log.warning("stdin could not be read: %s", error)
                raise StopAsyncIteration from None
            line = raw.decode("utf-8", errors="replace")  # as the SDK's own reader decodes
            if not line.strip():
                continue
            refusal = message_refusal(line)
            if refusal is None:
                return line
            log.warning("message refused: %s", refusal.error.message[:200])
            await self._ready.wait()
            assert self._replies is not None
            await self._replies.send(SessionMessage(refusal))


async def _stop_on_sigterm(serving: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            log.info("SIGTERM: stopping")
            serving.cancel()
            return


async def serve_stdio(session: tv.Session) -> None:
    """Serve MCP over this process's stdin and stdout until the client closes stdin (or
    SIGTERM); the session is opened first and closed last, either way."""
    # mcp 2.3 runs an MCPServer over streams of one's own only through its low-level server
    # (the SDK's in-memory transport reaches it the same way); this is run_stdio_async with
    # a stdin that a cancellation does not wait for.
    lowlevel = build_server(session)._lowlevel_server
    # The MCP SDK's own stdio reader blocks in an anyio worker thread, which a cancellation
    # must wait for: on Ctrl-C or SIGTERM the server would hang until the client closed stdin.
    lines = _CheckedLines(PipeLines(0, read_ahead=_READ_AHEAD, name="typevet-async mcp stdin"))
    stdin = cast("anyio.AsyncFile[str]", lines)  # the SDK only iterates it
    async with anyio.create_task_group() as serving:
        serving.start_soon(_stop_on_sigterm, serving.cancel_scope)
        async with stdio_server(stdin=stdin) as (read_stream, write_stream):
            lines.reply_on(write_stream)
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
        serving.cancel_scope.cancel()
    log.info("stopped")
