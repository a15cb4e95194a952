"""The MCP server's tools (ask_noul, ask_choice, ask_score, ask): their schemas, results and
errors, on one session opened with the server (see `typevet_async._apps.mcp`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeAlias

import anyio
import anyio.abc
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field, JsonValue, WithJsonSchema
from typing_extensions import TypedDict  # pydantic reads a TypedDict from typing only on 3.12+

import typevet_async as tv
from typevet_async._apps.presenting import error_text, served_model
from typevet_async._core.prompts.questions import MAX_EXAMPLES
from typevet_async._core.wires.system_one import (
    ANSWER_FIELDS,
    EXAMPLES_FIELD,
    USAGE_FIELDS,
    SystemOneValidationError,
    Value,
    answer_fields,
    request_from_system_one,
    response_to_system_one,
    wire_fields,
)

__all__ = [
    "INSTRUCTIONS",
    "QUESTIONS_SCHEMA",
    "SERVER_NAME",
    "ChoiceResult",
    "NoulResult",
    "ScoreResult",
    "SystemOneResponse",
    "build_server",
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
all its options and a confidence, System One's reference formula: 1 when all probability is \
on one option, 0 when the options are equally likely (x_entropy_confidence, 1 - normalised \
entropy, is the same scale by another measure). off_menu_mass is the next-token probability \
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
            EXAMPLES_FIELD: {
                "description": "optional in-context examples, shown as earlier turns: the "
                "answer is a noul's true/false, a choice's label, a score's level (0-based)",
                "type": "array",
                "maxItems": MAX_EXAMPLES,
                "items": {
                    "type": "object",
                    "required": ["state", "answer"],
                    "properties": {
                        "state": {"type": "string"},
                        "answer": {"type": ["boolean", "string", "integer"]},
                    },
                },
            },
        },
    },
}
Questions = Annotated[dict[str, Any], WithJsonSchema(QUESTIONS_SCHEMA)]

# -- results ----------------------------------------------------------------------------------

#: Each declared field's Python type (`typevet_async._core.wires.system_one.schema`; the tag is a
#: Literal of its answer's type).
_PYTHON_TYPES: Final[Mapping[Value, Any]] = {
    Value.PROBABILITY: float,
    Value.PROBABILITY_OR_NULL: float | None,
    Value.NUMBER: float,
    Value.LABEL: str,
    Value.PROBABILITIES: dict[str, float],
    Value.LEGEND: dict[str, str],
    Value.COUNT: int,
}


def _result_type(name: str, kind: str, doc: str) -> Any:
    """The tool result of an answer type: every declared field (the wire's and MCP's extras),
    with its description (the tool's output schema)."""
    fields = {
        field.name: Literal[kind]
        if field.value is Value.TAG
        else Annotated[_PYTHON_TYPES[field.value], Field(description=field.description)]
        for field in ANSWER_FIELDS[kind]
    }
    result = TypedDict(name, fields)  # type: ignore[misc]
    result.__doc__ = doc
    return result


if TYPE_CHECKING:  # built at run time from the one declared answer schema
    NoulResult: TypeAlias = dict[str, Any]
    ChoiceResult: TypeAlias = dict[str, Any]
    ScoreResult: TypeAlias = dict[str, Any]
else:
    NoulResult = _result_type("NoulResult", "noul", "A yes/no answer.")
    ChoiceResult = _result_type("ChoiceResult", "choice", "One label of several.")
    ScoreResult = _result_type("ScoreResult", "score", "A level on a rubric.")


if TYPE_CHECKING:
    SystemOneUsage: TypeAlias = dict[str, int]
else:
    SystemOneUsage = TypedDict(
        "SystemOneUsage",
        {
            field.name: Annotated[_PYTHON_TYPES[field.value], Field(description=field.description)]
            for field in USAGE_FIELDS
        },
    )
    SystemOneUsage.__doc__ = "What the answers cost."


#: The answers' description, from the declared wire fields of each answer type.
_ANSWERS: Final = "question id -> answer, by its type: " + "; ".join(
    f"{kind} {{{', '.join(field.name for field in wire_fields(kind))}}}" for kind in ANSWER_FIELDS
)


class SystemOneResponse(TypedDict):
    """A System One response: the answers by question id, in the questions' order."""

    model: Annotated[str, Field(description="the model that answered")]
    answers: Annotated[dict[str, dict[str, Any]], Field(description=_ANSWERS)]
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
    return ToolError(error_text(error))


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
        return answer_fields(answer, off_menu_mass=off_menu)

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
        return answer_fields(answer, off_menu_mass=off_menu)

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
        return answer_fields(answer, off_menu_mass=off_menu)

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
        return served_model(self.session, await self.session.probe()) or "default"


_READ_ONLY: Final = ToolAnnotations(read_only_hint=True)


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
    model = served_model(session, probe) or "default"
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
