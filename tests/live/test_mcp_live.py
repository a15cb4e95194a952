"""``typevet-async mcp`` as a real process, driven by the MCP SDK's own stdio client
(``mcp.client.stdio`` and ``ClientSession``) over the real llama.cpp server (Gemma 3 270M).

Each tool's answer equals a direct ``session.judge`` of the same question within 1e-6: both
sides read reproducibly (``reproducible=True``, and ``--reproducible`` on the server), one
after the other, never at the same time. Bad questions are tool errors (``isError``) naming
the problem, and the server answers the next call. Every test then closes the client and
checks that the process ended by itself: exit code 0, not the client's SIGTERM, and no
traceback on its stderr.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import attrs
import mcp.client.stdio as mcp_stdio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.types import CallToolResult, TextContent

import typevet_async as tv
from typevet_async._apps.presenting import model_alias
from typevet_async._core.wires.system_one import request_from_system_one, response_to_system_one

from .helpers import assert_close_json

pytestmark = pytest.mark.live

#: The typevet-async console script of this environment (the package is installed editable).
COMMAND = str(Path(sys.executable).parent / "typevet-async")
TEXT_STATE = "I was charged twice for my order, please refund me today."
STATE = {"subject": "Duplicate charge", "message": "I was charged twice, please refund me."}
TEAMS = {"billing": "money matters", "shipping": None, "technical": None}
LEVELS = ["can wait", "this week", "today"]
QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Is a refund requested?"},
    "route": {"type": "choice", "instructions": "Which team should handle it?", "criteria": TEAMS},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]},
}


class ServerProcess(Protocol):
    @property
    def returncode(self) -> int | None: ...


@attrs.define
class Spawned:
    """The server process the stdio client started, and where its stderr went."""

    stderr: Path
    process: ServerProcess | None = None


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Spawned:
    """Records the process `stdio_client` spawns: the client keeps it to itself, and its exit
    code is what tells a clean exit from the SIGTERM the client sends a server that stays."""
    record = Spawned(tmp_path / "server-stderr.log")
    spawn = mcp_stdio._create_platform_compatible_process

    async def recording_spawn(*args: Any, **kwargs: Any) -> Any:
        process = await spawn(*args, **kwargs)
        record.process = process
        return process

    monkeypatch.setattr(mcp_stdio, "_create_platform_compatible_process", recording_spawn)
    return record


@contextlib.asynccontextmanager
async def mcp_server(url: str, spawned: Spawned) -> AsyncIterator[ClientSession]:
    """``typevet-async mcp --base-url URL --reproducible``, initialized; closed on exit."""
    parameters = StdioServerParameters(
        command=COMMAND, args=["mcp", "--base-url", url, "--reproducible"]
    )
    with spawned.stderr.open("w") as errlog:
        async with (
            mcp_stdio.stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as client,
        ):
            initialized = await client.initialize()
            assert initialized.server_info.name == "typevet-async"
            yield client


def assert_ended_cleanly(spawned: Spawned) -> None:
    assert spawned.process is not None
    stderr = spawned.stderr.read_text()
    assert spawned.process.returncode == 0, stderr
    assert "SIGTERM" not in stderr, stderr  # it exited on its own when stdin closed
    assert "Traceback" not in stderr, stderr
    assert "closing the session" in stderr, stderr
    assert stderr.rstrip().endswith("stopped"), stderr


async def direct(url: str, state: Any, questions: dict[str, tv.Question]) -> tv.Judgment:
    async with tv.Session.llama_cpp(url, reproducible=True) as session:
        return await session.judge(state, questions)


def structured(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def typed(judgment: tv.Judgment) -> dict[str, Any]:
    """The one answer of a direct judgment, in the shape the typed tools promise."""
    [(question_id, answer)] = judgment.items()
    off_menu = judgment.diagnostics[question_id].off_menu_mass
    if isinstance(answer, tv.NoulAnswer):
        head: dict[str, Any] = {"type": "noul", "noul": answer.noul}
    elif isinstance(answer, tv.ChoiceAnswer):
        head = {"type": "choice", "choice": answer.choice}
    else:
        assert isinstance(answer, tv.ScoreAnswer)
        head = {"type": "score", "score": answer.score, "confidence": answer.confidence}
        legend = {str(index): level for index, level in enumerate(answer.legend)}
        probabilities = {str(level): p for level, p in answer.probabilities.items()}
        return {
            **head, "legend": legend, "probabilities": probabilities,
            "x_entropy_confidence": answer.entropy_confidence, "off_menu_mass": off_menu,
        }  # fmt: skip
    probabilities = dict(answer.probabilities)
    if isinstance(answer, tv.NoulAnswer):  # a Noul's wire has neither: they follow its noul
        return {
            **head, "confidence": answer.confidence,
            "x_entropy_confidence": answer.entropy_confidence, "probabilities": probabilities,
            "off_menu_mass": off_menu,
        }  # fmt: skip
    return {
        **head,
        "confidence": answer.confidence,
        "probabilities": probabilities,
        "x_entropy_confidence": answer.entropy_confidence,
        "off_menu_mass": off_menu,
    }


@pytest.mark.asyncio
async def test_every_tool_answers_as_a_direct_judgment(gemma3_url: str, spawned: Spawned) -> None:
    # The direct judgments first: no read of the server's runs beside them.
    noul = await direct(gemma3_url, TEXT_STATE, {"q": tv.Noul(instructions="Refund requested?")})
    route = tv.Choice(TEAMS, instructions="Which team should handle it?")
    choice = await direct(gemma3_url, STATE, {"q": route})
    score = await direct(gemma3_url, STATE, {"q": tv.Score(LEVELS, instructions="How urgent?")})
    call = request_from_system_one({"model": "any", "state": STATE, "questions": QUESTIONS})
    several = await direct(gemma3_url, STATE, call.questions)
    async with tv.Session.llama_cpp(gemma3_url) as session:
        # Named as the gateway names it: a local GGUF's path by its file name.
        model = model_alias((await session.probe()).model_ids[0])
        assert model is not None
        assert "/" not in model

    async with mcp_server(gemma3_url, spawned) as client:
        listed = (await client.list_tools()).tools
        assert [tool.name for tool in listed] == ["ask_noul", "ask_choice", "ask_score", "ask"]
        noul_result = await client.call_tool(
            "ask_noul", {"state": TEXT_STATE, "instructions": "Refund requested?"}
        )
        choice_result = await client.call_tool(
            "ask_choice",
            {"state": STATE, "instructions": "Which team should handle it?", "options": TEAMS},
        )
        score_result = await client.call_tool(
            "ask_score", {"state": STATE, "instructions": "How urgent?", "levels": LEVELS}
        )
        ask_result = await client.call_tool("ask", {"state": STATE, "questions": QUESTIONS})
    assert_ended_cleanly(spawned)

    assert_close_json(structured(noul_result), typed(noul), "ask_noul")
    assert_close_json(structured(choice_result), typed(choice), "ask_choice")
    assert_close_json(structured(score_result), typed(score), "ask_score")
    expected = response_to_system_one(several, model, score_criteria=call.score_criteria)
    assert_close_json(structured(ask_result), expected, "ask")
    # The text content an agent reads is the same answer, as JSON.
    [content] = noul_result.content
    assert isinstance(content, TextContent)
    assert '"noul":' in content.text.replace(" ", "")


@pytest.mark.asyncio
async def test_bad_questions_are_tool_errors_and_the_server_goes_on(
    gemma3_url: str, spawned: Spawned
) -> None:
    many_labels = [f"team {n}" for n in range(521)]
    bad_calls: list[tuple[str, dict[str, Any], str]] = [
        (
            "ask_score",
            {"state": STATE, "instructions": "How urgent?", "levels": ["only one"]},
            "QuestionError: a Score needs at least two levels, got 1",
        ),
        (
            "ask_choice",
            {"state": STATE, "instructions": "Which team?", "options": many_labels},
            # past the 520 two-token codes: refused before any request
            "TooManyOptionsError: 521 options, and a question takes at most 520",
        ),
        (
            "ask",
            {"state": STATE, "questions": {"where": {"type": "box", "instructions": "Where?"}}},
            "SystemOneValidationError: questions.where: question 'where': box questions are "
            "not supported",
        ),
    ]
    async with mcp_server(gemma3_url, spawned) as client:
        for tool, arguments, message in bad_calls:
            result = await client.call_tool(tool, arguments)
            assert result.is_error, (tool, result)
            [content] = result.content
            assert isinstance(content, TextContent)
            assert content.text.startswith(f"Error executing tool {tool}: {message}"), content.text
        answered = await client.call_tool(
            "ask_noul", {"state": TEXT_STATE, "instructions": "Refund requested?"}
        )
    assert_ended_cleanly(spawned)
    assert 0.0 <= structured(answered)["noul"] <= 1.0
