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
  `typevet_async._core.systemone`); the result is System One's response,
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
own (`_StdinLines`), so a signal never waits for a line that does not come.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any, Final, Literal, cast

import anyio
import anyio.abc
import orjson
from mcp import types as mcp_types
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import ToolAnnotations
from pydantic import Field, JsonValue, ValidationError, WithJsonSchema
from typing_extensions import TypedDict  # pydantic reads a TypedDict from typing only on 3.12+

import typevet_async as tv
from typevet_async._core.decoding import CpuClock, DecodeBudget, check_json_budget
from typevet_async._core.systemone import (
    SystemOneValidationError,
    request_from_system_one,
    response_to_system_one,
)
from typevet_async._errors import BudgetExceededError

__all__ = [
    "INSTRUCTIONS",
    "QUESTIONS_SCHEMA",
    "SERVER_NAME",
    "ChoiceResult",
    "NoulResult",
    "ScoreResult",
    "SystemOneResponse",
    "build_server",
    "serve_stdio",
]

log = logging.getLogger("typevet_async.mcp")

SERVER_NAME: Final = "typevet-async"
#: The id the single-question tools judge their question under (no prompt shows it).
_QUESTION_ID: Final = "question"

INSTRUCTIONS: Final = """\
Typed questions about a state (a text or any JSON value), answered by a language model with \
probabilities read from its next-token logprobs in one forward pass: no text is generated. \
ask_noul answers yes/no with P(true); ask_choice picks one label of two or more; ask_score \
rates on a rubric of two or more levels (lowest first) and gives the expected level; ask \
asks several questions at once in the System One shape. Every answer has probabilities over \
all its options and a confidence: 1 - normalised entropy, 1 when all probability is on one \
option, 0 when the options are equally likely. off_menu_mass is the next-token probability \
the model put on none of the options: near 1, the model did not take up the question."""

# -- arguments --------------------------------------------------------------------------------

State = Annotated[
    JsonValue,
    Field(
        description="What the question is about: a text, or any JSON value (an object or "
        "array is shown to the model as compact JSON, keys in the order given). A string that "
        "holds a JSON object or array is read as that value."
    ),
]
Instructions = Annotated[
    str,
    Field(description="The question itself, e.g. 'Is a refund requested?'. Not empty."),
]
Options = Annotated[
    list[str] | dict[str, str | None],
    Field(
        description="The labels to choose from, two or more, distinct: a list of labels, or "
        "an object of label to a description of what it means (or null). The answer's "
        "probabilities keep this order; ties go to the first."
    ),
]
Levels = Annotated[
    list[str],
    Field(
        description="The rubric's levels, two or more, distinct, lowest first, e.g. "
        "['can wait', 'this week', 'today']. Level i is described by levels[i]."
    ),
]

_TEXT: Final[dict[str, Any]] = {
    "description": "a string; an object or array is rendered as compact JSON",
}
#: The published schema of ``ask``'s ``questions``. The argument itself is read loosely (any
#: object) so that `request_from_system_one` finds every problem and names it.
QUESTIONS_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "minProperties": 1,
    "description": "System One questions: question id -> question, answered in this order. "
    'A question is {"type": "noul", "instructions": ..., "criteria"?: {"true"?: ..., '
    '"false"?: ...}}, {"type": "choice", "instructions": ..., "criteria": {label: '
    'description or null, ...} or [label, ...]} or {"type": "score", "instructions": ..., '
    '"criteria": [level, ...] (lowest first)}. Example: {"refund": {"type": "noul", '
    '"instructions": "Is a refund requested?"}, "route": {"type": "choice", "instructions": '
    '"Which team?", "criteria": {"billing": "money matters", "shipping": null}}, "urgency": '
    '{"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]}}',
    "additionalProperties": {
        "type": "object",
        "required": ["type", "instructions"],
        "properties": {
            "type": {"enum": ["noul", "choice", "score"]},
            "instructions": _TEXT,
            "criteria": {
                "description": "noul: an object with 'true' and/or 'false' (what each means); "
                "choice: an object of label to description (or null), or a list of labels; "
                "score: the list of levels, lowest first",
                "type": ["object", "array"],
            },
        },
    },
}
Questions = Annotated[dict[str, Any], WithJsonSchema(QUESTIONS_SCHEMA)]

# -- results ----------------------------------------------------------------------------------

_CONFIDENCE = "1 - the normalised entropy of probabilities: 1 all on one option, 0 even"
_OFF_MENU = (
    "the next-token probability on none of the options (1 - their summed probability); "
    "null when the server cannot tell"
)


class NoulResult(TypedDict):
    """A yes/no answer."""

    type: Literal["noul"]
    noul: Annotated[float, Field(description="P(true): the probability that the answer is yes")]
    confidence: Annotated[float, Field(description=_CONFIDENCE)]
    probabilities: Annotated[
        dict[str, float], Field(description='{"false": p, "true": p}, summing to 1')
    ]
    off_menu_mass: Annotated[float | None, Field(description=_OFF_MENU)]


class ChoiceResult(TypedDict):
    """One label of several."""

    type: Literal["choice"]
    choice: Annotated[str, Field(description="the most probable label (ties: the first)")]
    confidence: Annotated[float, Field(description=_CONFIDENCE)]
    probabilities: Annotated[
        dict[str, float],
        Field(description="every label's probability, in the options' order, summing to 1"),
    ]
    off_menu_mass: Annotated[float | None, Field(description=_OFF_MENU)]


class ScoreResult(TypedDict):
    """A level on a rubric."""

    type: Literal["score"]
    score: Annotated[
        float,
        Field(description="the expected level, sum of i * p(i): 0 is the first level"),
    ]
    confidence: Annotated[float, Field(description=_CONFIDENCE)]
    legend: Annotated[dict[str, str], Field(description='level index ("0", "1", ...) -> level')]
    probabilities: Annotated[
        dict[str, float],
        Field(description='each level\'s probability by index ("0", "1", ...), summing to 1'),
    ]
    off_menu_mass: Annotated[float | None, Field(description=_OFF_MENU)]


class SystemOneUsage(TypedDict):
    """What the answers cost."""

    input_tokens: Annotated[int, Field(description="prompt tokens evaluated for every read")]
    output_tokens: Annotated[int, Field(description="always 0: no token is generated")]


class SystemOneResponse(TypedDict):
    """A System One response: the answers by question id, in the questions' order."""

    model: Annotated[str, Field(description="the model that answered")]
    answers: Annotated[
        dict[str, dict[str, Any]],
        Field(
            description='question id -> answer: {"type": "noul", "noul": P(true)}, {"type": '
            '"choice", "choice", "confidence", "probabilities": {label: p}} or {"type": '
            '"score", "score", "confidence", "legend": {"0": level}, "probabilities": '
            '{"0": p}}'
        ),
    ]
    usage: SystemOneUsage


# -- the tools --------------------------------------------------------------------------------


def _tool_error(error: tv.TypevetError) -> ToolError:
    """The SDK's typed error as the tool's error result: its type and its own message."""
    if isinstance(error, SystemOneValidationError):
        # Every problem at once; locations as the tool's arguments name them.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in entry['loc'] if part != 'body')}: {entry['msg']}"
            for entry in error.detail
        )
        return ToolError(f"{type(error).__name__}: {problems}")
    return ToolError(f"{type(error).__name__}: {error}")


class _Tools:
    """The tools, over one session. Each method's docstring is its tool's description."""

    def __init__(self, session: tv.Session) -> None:
        self.session = session

    async def _judge_one(self, state: Any, question: tv.Question) -> tuple[tv.Answer, float | None]:
        """The answer, and its off-menu mass (None where it is not known: a logits read, or a
        System One server that sends no diagnostics)."""
        try:
            judgment = await self.session.judge(state, {_QUESTION_ID: question})
        except tv.TypevetError as error:
            error.question_id = None  # the caller never named the tool's one question
            raise
        diagnostics = judgment.diagnostics.get(_QUESTION_ID)
        return judgment[_QUESTION_ID], None if diagnostics is None else diagnostics.off_menu_mass

    async def ask_noul(self, state: State, instructions: Instructions) -> NoulResult:
        """Ask a yes/no question about the state.

        Returns noul = P(true), the probability that the answer is yes, with both options'
        probabilities, a confidence and the off-menu mass.
        """
        try:
            answer, off_menu = await self._judge_one(state, tv.Noul(instructions=instructions))
        except tv.TypevetError as error:
            raise _tool_error(error) from None
        assert isinstance(answer, tv.NoulAnswer)
        return {
            "type": "noul",
            "noul": answer.noul,
            "confidence": answer.confidence,
            "probabilities": dict(answer.probabilities),
            "off_menu_mass": off_menu,
        }

    async def ask_choice(
        self, state: State, instructions: Instructions, options: Options
    ) -> ChoiceResult:
        """Ask which one of two or more labels fits the state.

        Returns the most probable label, every label's probability, a confidence and the
        off-menu mass.
        """
        try:
            question = tv.Choice(options, instructions=instructions)
            answer, off_menu = await self._judge_one(state, question)
        except tv.TypevetError as error:
            raise _tool_error(error) from None
        assert isinstance(answer, tv.ChoiceAnswer)
        return {
            "type": "choice",
            "choice": answer.choice,
            "confidence": answer.confidence,
            "probabilities": dict(answer.probabilities),
            "off_menu_mass": off_menu,
        }

    async def ask_score(
        self, state: State, instructions: Instructions, levels: Levels
    ) -> ScoreResult:
        """Rate the state on a rubric of two or more levels, lowest first.

        Returns the expected level (0-based: 0 is levels[0]), every level's probability, the
        legend, a confidence and the off-menu mass.
        """
        try:
            answer, off_menu = await self._judge_one(
                state, tv.Score(levels, instructions=instructions)
            )
        except tv.TypevetError as error:
            raise _tool_error(error) from None
        assert isinstance(answer, tv.ScoreAnswer)
        return {
            "type": "score",
            "score": answer.score,
            "confidence": answer.confidence,
            "legend": {str(index): level for index, level in enumerate(answer.legend)},
            "probabilities": {str(level): p for level, p in answer.probabilities.items()},
            "off_menu_mass": off_menu,
        }

    async def ask(self, state: State, questions: Questions) -> SystemOneResponse:
        """Ask several typed questions about the state at once, in the System One shape.

        questions maps each id to a noul, choice or score question, as POST /v1/systemone
        takes them. Returns the System One response: model, answers by id (in the questions'
        order) and usage.
        """
        try:
            # Only the questions are read as System One: the state is this tool's own
            # argument, any JSON value, and it carries no image placeholders.
            call = request_from_system_one(
                {"model": SERVER_NAME, "state": "", "questions": questions}
            )
            judgment = await self.session.judge(state, call.questions)
            model = await self._served_model()
        except tv.TypevetError as error:
            raise _tool_error(error) from None
        body = response_to_system_one(judgment, model, score_criteria=call.score_criteria)
        return {"model": body["model"], "answers": body["answers"], "usage": body["usage"]}

    async def _served_model(self) -> str:
        return _model_name(self.session, await self.session.probe())


_READ_ONLY: Final = ToolAnnotations(read_only_hint=True)


def _model_name(session: tv.Session, probe: tv.Probe) -> str:
    """The session's pinned model, else the first the server lists (as the gateway names it)."""
    return session.backend.model or next(iter(probe.model_ids), "default")


async def _probe_once(session: tv.Session) -> None:
    """Probe the model server once at startup, for the log only: the operator learns at once
    whether it is reachable, and a failure is not fatal (each call probes until one works)."""
    try:
        probe = await session.probe()
    except tv.TypevetError as error:
        log.warning(
            "the model server did not answer the probe (%s: %s); each tool call will try again",
            type(error).__name__,
            error,
        )
        return
    model = _model_name(session, probe)
    log.info("probed the model server: model %r, %s template", model, probe.family.value)


def build_server(session: tv.Session) -> MCPServer[tv.Session]:
    """The MCP server over ``session`` (unopened: the server's lifespan opens and closes it,
    so one server serves one connection)."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[tv.Session]) -> AsyncIterator[tv.Session]:
        async with session, anyio.create_task_group() as background:
            log.info("session open: %r", session.backend)
            background.start_soon(_probe_once, session)
            try:
                yield session
            finally:
                background.cancel_scope.cancel()
                log.info("closing the session")

    server: MCPServer[tv.Session] = MCPServer(
        SERVER_NAME,
        title="typevet-async: typed questions with probabilities",
        instructions=INSTRUCTIONS,
        version=tv.__version__,
        lifespan=lifespan,
    )
    tools = _Tools(session)
    titles: Mapping[str, str] = {
        "ask_noul": "Ask a yes/no question",
        "ask_choice": "Ask for one label of several",
        "ask_score": "Rate on a rubric",
        "ask": "Ask several typed questions (System One)",
    }
    for name, title in titles.items():
        server.add_tool(getattr(tools, name), name=name, title=title, annotations=_READ_ONLY)
    return server


#: Lines of stdin the reader thread may read ahead of the server.
_READ_AHEAD: Final = 64


class _StdinLines:
    """This process's stdin, line by line, read by a daemon thread (asyncio only).

    The MCP SDK's own stdio reader blocks in an anyio worker thread, which a cancellation
    must wait for: on Ctrl-C or SIGTERM the server would hang until the client closed stdin.
    A daemon thread is never waited for, and awaiting its next line is cancellable. Raw
    ``os.read`` calls: a thread blocked inside a file object's ``readline`` would hold the
    file's lock, and closing the file at exit would wait for it.
    """

    def __init__(self, fd: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._room = threading.Semaphore(_READ_AHEAD)
        reader = threading.Thread(
            target=self._read, args=(fd,), name="typevet-async mcp stdin", daemon=True
        )
        reader.start()

    def _hand_over(self, line: str | None) -> bool:
        self._room.acquire()
        try:
            self._loop.call_soon_threadsafe(self._lines.put_nowait, line)
        except RuntimeError:  # the event loop has closed: nobody reads any more
            return False
        return True

    def _read(self, fd: int) -> None:
        pending = bytearray()  # the start of a line whose newline has not come yet
        try:
            while chunk := os.read(fd, 1 << 16):
                *lines, rest = chunk.split(b"\n")  # only the new bytes are searched
                if lines:
                    lines[0] = bytes(pending) + lines[0]
                    pending.clear()
                for line in lines:  # the SDK's own reader decodes the same way
                    if not self._hand_over(line.decode("utf-8", errors="replace") + "\n"):
                        return
                pending += rest
        except OSError as error:
            log.warning("stdin could not be read: %s", error)
        if pending:  # a last line without a newline
            self._hand_over(pending.decode("utf-8", errors="replace"))
        self._hand_over(None)

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        line = await self._lines.get()
        self._room.release()
        if line is None:
            raise StopAsyncIteration
        return line


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

    def __init__(self, lines: _StdinLines) -> None:
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
            line = await self._lines.__anext__()
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
    lines = _CheckedLines(_StdinLines(0))
    stdin = cast("anyio.AsyncFile[str]", lines)  # the SDK only iterates it
    async with anyio.create_task_group() as serving:
        serving.start_soon(_stop_on_sigterm, serving.cancel_scope)
        async with stdio_server(stdin=stdin) as (read_stream, write_stream):
            lines.reply_on(write_stream)
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
        serving.cancel_scope.cancel()
    log.info("stopped")
