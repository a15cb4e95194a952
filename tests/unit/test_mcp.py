"""``typevet-async mcp`` (`typevet_async._apps.mcp`): the tools' schemas, every bad question and bad
input as a tool error, backend failures, the session's lifecycle, the command's flags, and the
process over real stdio: its exit on a closed stdin, Ctrl-C and SIGTERM.

In-process, the MCP SDK's own client talks to the server through its in-memory transport
(``mcp.Client(server, mode="legacy")``: JSON-RPC framing, the initialize handshake, as over
stdio). The session is on `InMemoryStubBackend` only where a fault or a malformed request is
the point (and to count opens); the process tests point at a URL where nothing listens.
Answers read from a real model are compared with direct judgments in
tests/live/test_mcp_live.py.
"""

from __future__ import annotations

import contextlib
import gc
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import mcp
import pytest
from mcp.types import CallToolResult, TextContent

import typevet_async as tv
from typevet_async._apps import mcp as _mcp
from typevet_async._apps.cli import main
from typevet_async._core.wires.decoding import DecodeBudget
from typevet_async._core.wires.system_one import request_from_system_one

from .stubs import InMemoryStubBackend, ProbeRefusingStubBackend, failing_after, sleeping

TOOLS = ["ask_noul", "ask_choice", "ask_score", "ask"]
#: The typevet-async console script of this environment (the package is installed editable).
COMMAND = str(Path(sys.executable).parent / "typevet-async")
#: Nothing listens on the discard port: every read is a TransportError.
NOWHERE = "http://127.0.0.1:9"


#: No TYPEVET_* variable of the machine leaks into a test (tests/unit/conftest.py).
pytestmark = pytest.mark.usefixtures("no_typevet_variables")


@pytest.fixture
def stub() -> InMemoryStubBackend:
    return InMemoryStubBackend()


@contextlib.asynccontextmanager
async def connected(backend: InMemoryStubBackend) -> AsyncIterator[mcp.Client]:
    """The SDK's client, in-process, on a server over a session on ``backend``. (Not a
    fixture: the client's task group must be entered and left in the test's own task.)"""
    async with mcp.Client(_mcp.build_server(tv.Session(backend)), mode="legacy") as client:
        yield client


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result
    assert result.structured_content is None
    [content] = result.content
    assert isinstance(content, TextContent)
    return content.text


# -- 1. the tools, as an agent reads them -------------------------------------------------------


@pytest.mark.asyncio
async def test_every_tool_and_every_parameter_is_described(stub: InMemoryStubBackend) -> None:
    async with connected(stub) as client:
        listed = (await client.list_tools()).tools
    assert [tool.name for tool in listed] == TOOLS
    required = {
        "ask_noul": ["state", "instructions"],
        "ask_choice": ["state", "instructions", "options"],
        "ask_score": ["state", "instructions", "levels"],
        "ask": ["state", "questions"],
    }
    for tool in listed:
        assert tool.title, tool.name
        assert len(tool.description or "") > 60, tool.name
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint
        schema = tool.input_schema
        assert schema["required"] == required[tool.name]
        for name, parameter in schema["properties"].items():
            assert len(parameter.get("description", "")) > 30, (tool.name, name)
        output = tool.output_schema
        assert output is not None, tool.name
        assert output["type"] == "object", tool.name
    by_name = {tool.name: tool for tool in listed}
    for name, answer in (("ask_noul", "noul"), ("ask_choice", "choice"), ("ask_score", "score")):
        output = by_name[name].output_schema
        assert output is not None
        assert output["properties"]["type"]["const"] == answer
        assert set(output["required"]) >= {answer, "confidence", "probabilities", "off_menu_mass"}
        for field in output["properties"].values():
            assert field.get("description") or "const" in field
    output = by_name["ask"].output_schema
    assert output is not None
    assert set(output["required"]) == {"model", "answers", "usage"}
    assert "probabilities read from its next-token logprobs" in _mcp.INSTRUCTIONS


def test_the_questions_example_in_the_schema_is_read_and_fits_the_schema() -> None:
    text = _mcp.QUESTIONS_SCHEMA["description"]
    example = json.loads(text.split("Example: ", 1)[1])
    jsonschema.validate(example, _mcp.QUESTIONS_SCHEMA)
    call = request_from_system_one({"model": "m", "state": "", "questions": example})
    assert list(call.questions) == ["refund", "route", "urgency"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"q": {"type": "box", "instructions": "Where?"}}, _mcp.QUESTIONS_SCHEMA)


def test_the_schema_declares_examples_and_the_call_reads_them() -> None:
    question = {
        "type": "noul",
        "instructions": "Refund?",
        "x_examples": [{"state": "money back", "answer": True}],
    }
    jsonschema.validate({"q": question}, _mcp.QUESTIONS_SCHEMA)
    call = request_from_system_one({"model": "m", "state": "s", "questions": {"q": question}})
    assert call.questions["q"].examples == (("money back", "true"),)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"q": {**question, "x_examples": [{"state": "s"}]}}, _mcp.QUESTIONS_SCHEMA
        )


# -- 2. a bad question or bad input is a tool error naming it; nothing is sent --------------------

BAD_CALLS = [
    pytest.param(
        "ask_noul", {"state": "x", "instructions": "  "},
        "QuestionError: instructions must be a non-empty string", id="empty instructions",
    ),
    pytest.param(
        "ask_choice", {"state": "x", "instructions": "Team?", "options": ["billing"]},
        "QuestionError: a Choice needs at least two labels, got 1", id="one label",
    ),
    pytest.param(
        "ask_choice", {"state": "x", "instructions": "Team?", "options": ["a\nb", "a b"]},
        "QuestionError: Choice labels 'a\\nb' and 'a b' render identically", id="same labels",
    ),
    pytest.param(
        "ask_choice", {"state": "x", "instructions": "?", "options": [str(n) for n in range(11)]},
        "TooManyOptionsError: 11 options, but the served tokenizer has only 10", id="too many",
    ),
    pytest.param(
        "ask_score", {"state": "x", "instructions": "How urgent?", "levels": ["only"]},
        "QuestionError: a Score needs at least two levels, got 1", id="one level",
    ),
    pytest.param(
        "ask_score", {"state": "x", "instructions": "How urgent?", "levels": "low, high"},
        "validation error for ask_scoreArguments\nlevels\n  Input should be a valid list",
        id="levels not a list",
    ),
    pytest.param(
        "ask_noul", {"state": "x"},
        "validation error for ask_noulArguments\ninstructions\n  Field required",
        id="no instructions",
    ),
    pytest.param(
        "ask_noul", {"state": "charged twice \ud800", "instructions": "Refund?"},
        "InvalidInputError: state has a lone surrogate '\\ud800' at index 14", id="bad state",
    ),
    pytest.param(
        "ask", {"state": "x", "questions": {}},
        "SystemOneValidationError: questions: a non-empty object of name to question",
        id="no questions",
    ),
    pytest.param(
        "ask", {"state": "x", "questions": ["not", "an", "object"]},
        "validation error for askArguments\nquestions\n  Input should be a valid dictionary",
        id="questions not an object",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("tool", "arguments", "message"), BAD_CALLS)
@pytest.mark.asyncio
async def test_a_bad_call_is_a_tool_error_naming_the_problem(
    stub: InMemoryStubBackend, tool: str, arguments: dict[str, Any], message: str
) -> None:
    async with connected(stub) as client:
        text = error_text(await client.call_tool(tool, arguments))
    assert text.startswith(f"Error executing tool {tool}: "), text
    assert message in text, text
    assert "question 'question'" not in text  # the single-question tools' own id is internal
    assert stub.read_requests == []


@pytest.mark.asyncio
async def test_ask_names_every_bad_question_at_once(stub: InMemoryStubBackend) -> None:
    questions = {
        "fine": {"type": "noul", "instructions": "Refund?"},
        "where": {"type": "box", "instructions": "Where is the logo?"},
        "team": {"type": "choice", "instructions": "Team?", "criteria": ["billing"]},
        "mood": {"type": "sentiment", "instructions": "Mood?"},
    }
    async with connected(stub) as client:
        text = error_text(await client.call_tool("ask", {"state": "x", "questions": questions}))
    assert text == (
        "Error executing tool ask: SystemOneValidationError: "
        "questions.where: question 'where': box questions are not supported: no model here "
        "locates boxes; "
        "questions.team: question 'team': a Choice needs at least two labels, got 1; "
        "questions.mood: question 'mood': type must be 'noul', 'choice' or 'score', got "
        "'sentiment'"
    )
    assert stub.read_requests == []


# -- 3. a failing backend is a tool error too, and the server goes on ---------------------------


@pytest.mark.asyncio
async def test_a_server_error_is_a_tool_error_and_the_next_call_is_answered(
    stub: InMemoryStubBackend,
) -> None:
    busy = tv.ServerError("HTTP 503: the server is busy", status=503, body="")
    stub.behaviours["question"] = failing_after(0.0, busy)
    arguments = {"state": "x", "instructions": "Refund?"}
    async with connected(stub) as client:
        text = error_text(await client.call_tool("ask_noul", arguments))
        assert text == "Error executing tool ask_noul: ServerError: HTTP 503: the server is busy"
        del stub.behaviours["question"]
        answered = await client.call_tool("ask_noul", arguments)
    assert not answered.is_error
    assert answered.structured_content is not None
    assert answered.structured_content["type"] == "noul"


@pytest.mark.asyncio
async def test_ask_names_the_question_whose_read_failed(stub: InMemoryStubBackend) -> None:
    stub.behaviours["route"] = failing_after(0.0, tv.TransportError("connection reset"))
    questions = {
        "refund": {"type": "noul", "instructions": "Refund?"},
        "route": {"type": "choice", "instructions": "Team?", "criteria": ["billing", "other"]},
    }
    async with connected(stub) as client:
        text = error_text(await client.call_tool("ask", {"state": "x", "questions": questions}))
    assert text == "Error executing tool ask: TransportError: question 'route': connection reset"


@pytest.mark.asyncio
async def test_a_probe_that_fails_is_logged_at_startup_and_a_tool_error_on_every_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = ProbeRefusingStubBackend(tv.TransportError("GET /v1/models: connection refused"))
    async with connected(backend) as client:
        for _ in range(2):
            result = await client.call_tool("ask_noul", {"state": "x", "instructions": "Q?"})
            assert error_text(result).endswith("TransportError: GET /v1/models: connection refused")
    # The startup probe, then one per call: a failed probe is not remembered.
    assert backend.probes == 3
    [startup] = [r for r in caplog.records if "did not answer the probe" in r.getMessage()]
    assert startup.levelname == "WARNING"
    assert startup.getMessage() == (
        "the model server did not answer the probe (TransportError: GET /v1/models: connection "
        "refused); each tool call will try again"
    )


@pytest.mark.asyncio
async def test_a_bug_is_a_generic_tool_error_and_the_server_goes_on(
    stub: InMemoryStubBackend, caplog: pytest.LogCaptureFixture
) -> None:
    stub.behaviours["question"] = failing_after(0.0, RuntimeError("internal detail"))
    arguments = {"state": "x", "instructions": "Q?"}
    async with connected(stub) as client:
        result = await client.call_tool("ask_noul", arguments)
        # Not an SDK error: the MCP SDK keeps its text (and traceback) in the server's log.
        assert error_text(result) == "Error executing tool ask_noul"
        assert "internal detail" in caplog.text
        del stub.behaviours["question"]
        assert not (await client.call_tool("ask_noul", arguments)).is_error


# -- 4. one session: opened when the server starts, closed when it stops -------------------------


@pytest.mark.asyncio
async def test_the_session_opens_once_for_every_call_and_closes_with_the_connection() -> None:
    stub = InMemoryStubBackend()
    for question_id in ("question", "a", "b"):
        stub.behaviours[question_id] = sleeping(0.05)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("ask_noul", {"state": "x", "instructions": "Q?"}),
        ("ask_choice", {"state": {"a": 1}, "instructions": "Q?", "options": {"a": "A", "b": None}}),
        ("ask_score", {"state": [1, 2], "instructions": "Q?", "levels": ["low", "high"]}),
        ("ask", {"state": "y", "questions": {
            "a": {"type": "noul", "instructions": "A?"},
            "b": {"type": "score", "instructions": "B?", "criteria": ["low", "high"]},
        }}),
    ]  # fmt: skip
    async with connected(stub) as client:
        assert (stub.opened, stub.closed) == (1, 0)  # before any call
        await anyio.sleep(0.05)
        assert stub.probes == 1  # at startup, in the background
        results: list[CallToolResult] = []

        async def call(tool: str, arguments: dict[str, Any]) -> None:
            results.append(await client.call_tool(tool, arguments))

        async with anyio.create_task_group() as calling:
            for tool, arguments in calls:
                calling.start_soon(call, tool, arguments)
        assert (stub.opened, stub.closed) == (1, 0)
    assert (stub.opened, stub.closed) == (1, 1)
    assert [result.is_error for result in results] == [False] * 4
    assert stub.probes == 1
    assert stub.peak > 1  # the calls shared the session's slots at once


# -- 5. the command: flags, --reproducible, the extra --------------------------------------------


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tv.Session]]:
    """The sessions `typevet-async mcp` would serve (nothing is opened or served)."""
    sessions: list[tv.Session] = []

    async def serve_stdio(session: tv.Session) -> None:
        sessions.append(session)

    monkeypatch.setattr(_mcp, "serve_stdio", serve_stdio)
    yield sessions
    gc.unfreeze()  # run_mcp freezes the collector for the process's exit; this one goes on


def llama_cpp_config(session: tv.Session) -> tv.LlamaCppConfig:
    assert isinstance(session.backend, tv.AsyncLlamaCpp)
    return session.backend.config


def test_the_connection_flags_and_variables_build_the_session(
    served: list[tv.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["mcp", "--base-url", "http://gpu:8080", "--model", "gemma", "--max-concurrency", "3"]
    assert main(argv) == 0
    assert main(["mcp"]) == 0
    monkeypatch.setenv("TYPEVET_BASE_URL", "http://from-env:8080")
    assert main(["mcp", "--reproducible"]) == 0
    flags, embedded, reproducible = served
    config = llama_cpp_config(flags)
    assert (config.base_url, config.model, config.reproducible) == (
        "http://gpu:8080",
        "gemma",
        False,
    )
    assert flags.settings.max_concurrency == 3
    assert llama_cpp_config(embedded).server == tv.ServerOptions()  # no URL: the embedded server
    config = llama_cpp_config(reproducible)
    assert (config.base_url, config.reproducible) == ("http://from-env:8080", True)
    assert reproducible.backend.capabilities.max_concurrency == 1  # one read at a time


def test_reproducible_is_refused_off_llama_cpp(
    served: list[tv.Session], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["mcp", "--reproducible", "--backend", "vllm", "--base-url", "http://h:1"]
    argv += ["--model", "m"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "typevet-async: ConfigurationError: --reproducible applies to llama_cpp, not vllm\n"
    )
    assert served == []


def test_without_the_mcp_extra_it_says_which_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # What an environment without the mcp package imports; and _mcp not imported yet.
    for name in [name for name in sys.modules if name.split(".")[0] == "mcp"]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in [name for name in sys.modules if name.startswith("typevet_async._apps.mcp")]:
        monkeypatch.delitem(sys.modules, name)
    import typevet_async._apps as apps

    monkeypatch.delattr(apps, "mcp")
    assert main(["mcp", "--base-url", NOWHERE]) == 2
    assert capsys.readouterr().err == (
        "typevet-async: typevet-async mcp needs the mcp extra: pip install 'typevet_async[mcp]'\n"
    )


def test_help_shows_a_client_entry_the_tools_and_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["mcp", "--help"]) == 0
    shown = capsys.readouterr().out
    entry = shown.split("take the same command):\n", 1)[1].split("\nWithout", 1)[0]
    assert json.loads(entry) == {
        "mcpServers": {
            "typevet": {
                "command": "typevet-async",
                "args": ["mcp", "--base-url", "http://127.0.0.1:8080"],
            }
        }
    }
    for tool in TOOLS:
        assert f"{tool}(state, " in shown
    assert "--reproducible" in shown
    assert "exit codes: 0 the client closed stdin, or SIGTERM" in shown


# -- 6. the process, over real stdio -------------------------------------------------------------


@pytest.mark.asyncio
async def test_over_stdio_a_failing_server_is_a_tool_error_and_the_process_ends_cleanly(
    tmp_path: Path,
) -> None:
    parameters = mcp.StdioServerParameters(command=COMMAND, args=["mcp", "--base-url", NOWHERE])
    log = tmp_path / "stderr.log"
    with log.open("w") as errlog:
        async with (
            mcp.stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            mcp.ClientSession(read_stream, write_stream) as client,
        ):
            await client.initialize()
            for _ in range(2):  # the server goes on after a failure
                result = await client.call_tool("ask_noul", {"state": "x", "instructions": "Q?"})
                assert error_text(result).startswith(
                    f"Error executing tool ask_noul: TransportError: GET {NOWHERE}/v1/models: "
                )
            assert [tool.name for tool in (await client.list_tools()).tools] == TOOLS
    stderr = log.read_text()
    assert "Traceback" not in stderr, stderr
    assert "closing the session" in stderr, stderr
    assert stderr.rstrip().endswith("stopped"), stderr


INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "test", "version": "0"}},
}  # fmt: skip


@contextlib.contextmanager
def raw_process() -> Iterator[subprocess.Popen[bytes]]:
    """The server as a plain child process, initialized, its stdin still open."""
    process = subprocess.Popen(
        [COMMAND, "mcp", "--base-url", NOWHERE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        process.stdin.flush()
        answer = json.loads(process.stdout.readline())
        assert answer["result"]["serverInfo"]["name"] == "typevet-async", answer
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def wait_for_exit(process: subprocess.Popen[bytes], seconds: float = 20.0) -> tuple[int, str]:
    started = time.monotonic()
    code = process.wait(timeout=seconds)
    assert time.monotonic() - started < 5.0  # it stopped at once, it did not hang
    assert process.stdout is not None
    assert process.stderr is not None
    assert process.stdout.read() == b""  # nothing after the initialize answer
    return code, process.stderr.read().decode()


def test_ctrl_c_with_stdin_open_closes_the_session_and_exits_130() -> None:
    with raw_process() as process:
        time.sleep(0.2)  # serving: the reader waits for the next line
        process.send_signal(signal.SIGINT)
        code, stderr = wait_for_exit(process)
    assert code == 130, stderr
    assert "closing the session" in stderr
    assert stderr.endswith("typevet-async: interrupted\n"), stderr
    assert "Traceback" not in stderr


def test_sigterm_with_stdin_open_closes_the_session_and_exits_0() -> None:
    with raw_process() as process:
        time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        code, stderr = wait_for_exit(process)
    assert code == 0, stderr
    assert "SIGTERM: stopping" in stderr, stderr
    assert "closing the session" in stderr, stderr
    assert "Traceback" not in stderr


def test_closing_stdin_ends_the_process_with_0() -> None:
    with raw_process() as process:
        assert process.stdin is not None
        process.stdin.close()
        code, stderr = wait_for_exit(process)
    assert code == 0, stderr
    assert "closing the session" in stderr, stderr
    assert "SIGTERM" not in stderr, stderr
    assert "Traceback" not in stderr


def test_every_request_gets_a_reply_even_one_the_sdk_cannot_read() -> None:
    # A line that is not JSON, or a tool call nested 300 levels deep, was dropped by the MCP
    # SDK's stdio reader without a reply: the agent's call hung.
    deep = "[" * 300 + "1" + "]" * 300
    call = (
        '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "ask_noul", '
        '"arguments": {"state": ' + deep + ', "instructions": "Q?"}}}'
    )
    lines = [
        b"this is not json",
        b"",  # blank: no message, no reply
        call.encode(),
        b'{"jsonrpc": "2.0", "id": 8, "method": 5}',  # JSON, not a JSON-RPC request
        b'{"jsonrpc": "2.0", "id": 9, "method": "tools/list"}',
    ]
    with raw_process() as process:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(b"\n".join(lines) + b"\n")
        process.stdin.flush()
        replies = [json.loads(process.stdout.readline()) for _ in range(4)]
    assert replies[0]["id"] is None
    assert replies[0]["error"]["code"] == -32700
    assert replies[1]["id"] == 7
    assert replies[1]["error"]["code"] == -32600
    assert "nests deeper than 128 levels" in replies[1]["error"]["message"]
    assert replies[2]["id"] == 8
    assert replies[2]["error"]["code"] == -32600
    assert replies[3]["id"] == 9  # and the server goes on
    assert [tool["name"] for tool in replies[3]["result"]["tools"]] == TOOLS


def test_a_message_within_the_budget_passes_untouched() -> None:
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert _mcp.message_refusal(line) is None
    refusal = _mcp.message_refusal(json.dumps([1] * 10), DecodeBudget(max_items=5))
    assert refusal is not None
    assert "more than 5 JSON values" in refusal.error.message
