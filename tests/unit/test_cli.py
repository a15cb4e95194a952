"""The command line in-process: batch records and error lines, --resume, pipes, ids, every
failure as one line and exit 2, help texts, serve-local's startup errors.

Judging goes to `InMemoryStubBackend` (through ``Session.from_env``), which records every read
and counts opens, so a test can assert that a failing command sent nothing and started no
server. The real CLI against the real llama.cpp server is in tests/live/test_cli_live.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import typevet_async as tv
from typevet_async._apps.cli import batch as cli_batch
from typevet_async._apps.cli import help_texts, inputs, main, serve_local
from typevet_async._apps.cli.parser import build_parser
from typevet_async._core.wires.jsonvalues import parse_json

from .stubs import InMemoryStubBackend, failing_after, state_of

REPOSITORY = Path(__file__).parent.parent.parent
QUESTION = ["--noul", "q=Is it?"]
BIG = 2**70  # beyond 64 bits: orjson alone would make it a float


#: No TYPEVET_* variable of the machine leaks into a test (tests/unit/conftest.py).
pytestmark = pytest.mark.usefixtures("no_typevet_variables")


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> InMemoryStubBackend:
    """Every session the CLI builds (after its own flag checks) judges on this stub."""
    backend = InMemoryStubBackend()

    def from_env(
        cls: type[tv.Session], environ: Any = None, *, flags: Any = None, **settings: Any
    ) -> tv.Session:  # eval's settings (its read cache) are none here
        return tv.Session(backend, tv.SessionSettings(max_concurrency=4))

    monkeypatch.setattr(tv.Session, "from_env", classmethod(from_env))
    return backend


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_failure(code: int, err: str, *parts: str) -> None:
    assert code == 2, err
    assert err.startswith("typevet-async: "), err
    assert err.endswith("\n"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    for part in parts:
        assert part in err, (part, err)


def jsonl(path: Path, *lines: Any, raw: bool = False) -> Path:
    path.write_text("".join((line if raw else json.dumps(line)) + "\n" for line in lines))
    return path


def answers(path: Path) -> list[dict[str, Any]]:
    # The stdlib parser: it keeps integers of any size exact.
    return [json.loads(line) for line in path.read_text().splitlines()]


def judged(stub: InMemoryStubBackend) -> list[str]:
    return [state_of(request) for request in stub.read_requests]


def batch(tmp_path: Path, source: Path | str, *extra: str) -> list[str]:
    return ["batch", str(source), *QUESTION, "--out", str(tmp_path / "out.jsonl"),
            "--no-progress", *extra]  # fmt: skip


# -- 1. a bad line is an error line; no record stops a batch; exit 1 means failed records ---------


def test_a_malformed_line_becomes_an_error_line_naming_it_and_the_batch_goes_on(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = jsonl(
        tmp_path / "in.jsonl",
        '{"id": "a", "state": "A"}',
        '{"id": "b", "state": ',  # cut short
        "not json at all",
        "",
        '{"id": "c", "state": "C"}',
        '"a bare state"',
        raw=True,
    )
    code, out, err = run(capsys, *batch(tmp_path, source))
    assert code == 1, err
    lines = answers(tmp_path / "out.jsonl")
    assert [line["id"] for line in lines] == ["a", 2, 3, "c", 6]
    for line, number in ((lines[1], 2), (lines[2], 3)):
        assert line["error"]["type"] == "InvalidInputError"
        assert line["error"]["message"].startswith(f"line {number}: not valid JSON")
    assert lines[0]["answers"]["q"]["type"] == "noul"
    assert judged(stub) == ["A", "C", "a bare state"]
    assert out.startswith("5 records (0 skipped as done), 2 failed")
    # The bad lines are done too: --resume finishes, and starts nothing.
    stub.opened = 0
    code, out, _ = run(capsys, *batch(tmp_path, source, "--resume"))
    assert (code, stub.opened) == (0, 0)
    assert out.startswith("0 records (5 skipped as done), 0 failed")


def test_a_failed_record_is_an_error_line_and_exit_1_while_the_rest_is_judged(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.state_behaviours["boom"] = failing_after(0.0, tv.ServerError("boom", status=500, body=""))
    source = jsonl(tmp_path / "in.jsonl", *(["boom"] + [f"s{n}" for n in range(9)] + ["boom"]))
    code, out, _ = run(capsys, *batch(tmp_path, source))
    assert code == 1
    lines = answers(tmp_path / "out.jsonl")
    assert [line["id"] for line in lines] == list(range(1, 12))
    assert [("error" in line) for line in lines] == [True] + [False] * 9 + [True]
    assert lines[0]["error"]["type"] == "ServerError"
    assert out.startswith("11 records (0 skipped as done), 2 failed")


def test_many_error_lines_behind_a_slow_record_keep_their_order(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # More error lines than the reader holds back while a record is being judged.
    stub.state_behaviours["slow"] = failing_after(0.2, tv.ServerError("x", status=500, body=""))
    bad = ["{"] * (cli_batch._BACKLOG_LIMIT + 50)
    source = jsonl(tmp_path / "in.jsonl", '"slow"', *bad, '"last"', raw=True)
    code, _, _ = run(capsys, *batch(tmp_path, source))
    assert code == 1
    ids = [line["id"] for line in answers(tmp_path / "out.jsonl")]
    assert ids == list(range(1, len(bad) + 3))


# -- every CLI failure: one line on stderr, exit 2, nothing sent ----------------------------------


def _bad_questions(tmp_path: Path) -> list[str]:
    (tmp_path / "q.json").write_text('{"questions": {"a": ')
    return ["judge", "x", "--questions", str(tmp_path / "q.json")]


def _twice_in_questions(tmp_path: Path) -> list[str]:
    (tmp_path / "q.json").write_text(
        '{"a": {"type": "noul", "instructions": "A?"}, "a": {"type": "noul", "instructions": "B"}}'
    )
    return ["judge", "x", "--questions", str(tmp_path / "q.json")]


def _bad_schema(tmp_path: Path) -> list[str]:
    (tmp_path / "s.json").write_text("{'type': 'object'}")
    return ["generate", "p", "--schema", str(tmp_path / "s.json")]


def _corrupt_middle_of_out(tmp_path: Path) -> list[str]:
    source = jsonl(tmp_path / "in.jsonl", "s1", "s2", "s3")
    (tmp_path / "out.jsonl").write_text('{"id": 1, "answers": {}}\n{"id": 2, "ans\n{"id": 3}\n')
    return batch(tmp_path, source, "--resume")


def _input(tmp_path: Path) -> Path:
    return jsonl(tmp_path / "in.jsonl", "s1")


def _out_exists(tmp_path: Path) -> list[str]:
    (tmp_path / "out.jsonl").write_text('{"id": 1, "answers": {}}\n')
    return batch(tmp_path, _input(tmp_path))


FAILURES = {
    "unknown command": (lambda t: ["nope"], ["invalid choice: 'nope'"]),
    "missing --out": (lambda t: ["batch", "x.jsonl", *QUESTION], ["batch: ", "--out"]),
    "unknown flag": (lambda t: ["judge", "x", *QUESTION, "--tabel"], ["--tabel"]),
    "bad --max-tokens": (
        lambda t: ["generate", "p", "--schema", "s", "--max-tokens", "0"],
        ["--max-tokens", "positive integer"],
    ),
    "bad --max-concurrency": (
        lambda t: ["judge", "x", *QUESTION, "--max-concurrency", "many"],
        ["--max-concurrency"],
    ),
    "no questions": (lambda t: ["judge", "x"], ["QuestionError", "no questions"]),
    "malformed --questions": (_bad_questions, ["--questions", "q.json", "not valid JSON"]),
    "missing --questions": (
        lambda t: ["judge", "x", "--questions", str(t / "none.json")],
        ["--questions", "none.json", "No such file"],
    ),
    "a key twice in --questions": (_twice_in_questions, ["'a' appears twice"]),
    "malformed --schema": (_bad_schema, ["--schema", "s.json", "not valid JSON"]),
    "missing --schema": (
        lambda t: ["generate", "p", "--schema", str(t / "none.json")],
        ["--schema", "No such file"],
    ),
    "missing @file": (
        lambda t: ["judge", "@" + str(t / "none.txt"), *QUESTION],
        ["none.txt", "No such file", "write @@"],
    ),
    "a directory as @file": (lambda t: ["judge", f"@{t}", *QUESTION], ["directory"]),
    "missing input": (lambda t: batch(t, t / "none.jsonl"), ["none.jsonl", "No such file"]),
    "--out in a missing directory": (
        lambda t: ["batch", str(_input(t)), *QUESTION, "--out", str(t / "no" / "out.jsonl")],
        ["--out", "No such file"],
    ),
    "--out exists without --resume": (_out_exists, ["exists and is not empty", "--resume"]),
    "corrupt line in the middle of --out": (_corrupt_middle_of_out, ["line 2", "not the last"]),
    "a full disk": (
        lambda t: ["batch", str(_input(t)), *QUESTION, "--out", "/dev/full", "--no-progress"],
        ["/dev/full", "No space left on device"],
    ),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_every_command_line_failure_is_one_line_and_exit_2(
    case: str, stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if case == "a full disk" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    make_argv, parts = FAILURES[case]
    code, _, err = run(capsys, *make_argv(tmp_path))
    assert_one_line_failure(code, err, *parts)
    if case != "a full disk":  # it fails at the first line written, after the judging
        assert stub.read_requests == []
        assert stub.opened == 0


def test_a_server_reply_with_line_breaks_is_still_one_line(
    stub: InMemoryStubBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.behaviours["q"] = failing_after(0.0, tv.ServerError("bad\nreply\r\n", status=500, body=""))
    code, _, err = run(capsys, "judge", "x", *QUESTION)
    assert_one_line_failure(code, err, "ServerError: question 'q': bad\\nreply\\r\\n")


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["batch", "--help"]) == 0
    assert "--resume" in capsys.readouterr().out


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"typevet-async {tv.__version__}\n"


# -- 2. --resume keeps complete lines, drops a cut one, never writes to the input -----------------


def test_resume_keeps_a_complete_last_line_without_a_newline(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = jsonl(tmp_path / "in.jsonl", "s1", "s2", "s3")
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 1, "answers": {}}\n{"id": 2, "answers": {}}')  # no newline at the end
    code, summary, _ = run(capsys, *batch(tmp_path, source, "--resume"))
    assert code == 0
    assert judged(stub) == ["s3"]
    assert [line["id"] for line in answers(out)] == [1, 2, 3]
    assert summary.startswith("1 records (2 skipped as done)")


def test_resume_drops_a_last_line_a_kill_cut_short_and_judges_it_again(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = jsonl(tmp_path / "in.jsonl", "s1", "s2", "s3")
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": 1, "answers": {}}\n{"id": 2, "answers": {"q": {"ty')
    code, _, _ = run(capsys, *batch(tmp_path, source, "--resume"))
    assert code == 0
    assert judged(stub) == ["s2", "s3"]
    lines = answers(out)
    assert [line["id"] for line in lines] == [1, 2, 3]
    assert lines[1]["answers"]["q"]["type"] == "noul"


def test_a_corrupt_line_in_the_middle_of_out_changes_nothing(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _corrupt_middle_of_out(tmp_path)
    before = (tmp_path / "out.jsonl").read_bytes()
    code, _, err = run(capsys, *argv)
    assert_one_line_failure(code, err, "out.jsonl line 2")
    assert (tmp_path / "out.jsonl").read_bytes() == before


def _same_path(source: Path, tmp_path: Path) -> Path:
    return source


def _symlink(source: Path, tmp_path: Path) -> Path:
    link = tmp_path / "link.jsonl"
    link.symlink_to(source)
    return link


def _hard_link(source: Path, tmp_path: Path) -> Path:
    link = tmp_path / "hard.jsonl"
    link.hardlink_to(source)
    return link


def _dotted(source: Path, tmp_path: Path) -> Path:
    return tmp_path / "sub" / ".." / source.name


@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("out_for", [_same_path, _symlink, _hard_link, _dotted])
def test_out_that_is_the_input_is_refused_before_anything_is_written(
    out_for: Any,
    resume: bool,
    stub: InMemoryStubBackend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "sub").mkdir()
    source = tmp_path / "in.jsonl"
    source.write_text('"s1"\n"s2"')  # no newline at the end: once, its last record was lost
    before = source.read_bytes()
    out = out_for(source, tmp_path)
    argv = ["batch", str(source), *QUESTION, "--out", str(out), "--no-progress"]
    code, _, err = run(capsys, *argv, *(["--resume"] if resume else []))
    assert_one_line_failure(code, err, "is the input")
    assert source.read_bytes() == before
    assert stub.opened == 0


# -- 3. a pipe is read once -----------------------------------------------------------------------


def test_a_fifo_is_read_once_and_every_record_judged(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    records = b"".join(json.dumps(f"s{n}").encode() + b"\n" for n in range(5))

    def write() -> None:
        with fifo.open("wb") as writer:
            writer.write(records)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        code, out, _ = run(capsys, *batch(tmp_path, fifo))
    finally:
        writer.join(10)
    assert code == 0
    assert judged(stub) == [f"s{n}" for n in range(5)]
    assert out.startswith("5 records (0 skipped as done), 0 failed")


def test_a_failing_batch_ends_at_once_while_a_pipe_writer_is_silent(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The record fails the whole batch (a permanent error) while the reader waits for line 2.
    refused = tv.UnsupportedTemplateError("not Gemma", family="chatml", rendered="")
    stub.behaviours["q"] = failing_after(0.3, refused)
    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def write_one_line_then_hold_the_pipe_open() -> None:
        with fifo.open("wb") as writer:
            writer.write(b'"s1"\n')
            writer.flush()
            done.wait(60)

    writer = threading.Thread(target=write_one_line_then_hold_the_pipe_open)
    writer.start()
    codes: list[int] = []
    batch_thread = threading.Thread(target=lambda: codes.append(main(batch(tmp_path, fifo))))
    try:
        batch_thread.start()
        batch_thread.join(20)
        assert codes == [2], "the command waited for the pipe's writer"
    finally:
        done.set()
        writer.join(10)
        batch_thread.join(10)
    assert_one_line_failure(codes[0], capsys.readouterr().err, "UnsupportedTemplateError")


def test_dash_reads_stdin(
    stub: InMemoryStubBackend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jsonl(tmp_path / "in.jsonl", "s1", {"id": "x", "state": "s2"})

    class Stdin:
        buffer = (tmp_path / "in.jsonl").open("rb")

    monkeypatch.setattr("sys.stdin", Stdin)
    try:
        code, _, _ = run(capsys, *batch(tmp_path, "-"))
    finally:
        Stdin.buffer.close()
    assert code == 0
    assert [line["id"] for line in answers(tmp_path / "out.jsonl")] == [1, "x"]


def test_stdin_that_is_the_out_file_is_refused(
    stub: InMemoryStubBackend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = jsonl(tmp_path / "out.jsonl", "s1")

    class Stdin:
        buffer = source.open("rb")

    monkeypatch.setattr("sys.stdin", Stdin)
    try:
        code, _, err = run(capsys, *batch(tmp_path, "-", "--resume"))
    finally:
        Stdin.buffer.close()
    assert_one_line_failure(code, err, "is the input")


# -- 4. ids: duplicates refused, bare and explicit ids compared exactly, --resume counts ----------


@contextlib.contextmanager
def piped(monkeypatch: pytest.MonkeyPatch, source: Path) -> Iterator[None]:
    """``source``'s bytes on stdin through a pipe (read once, never scanned ahead)."""
    read_end, write_end = os.pipe()
    os.write(write_end, source.read_bytes())  # small: it fits in the pipe's buffer
    os.close(write_end)

    class Stdin:
        buffer = os.fdopen(read_end, "rb")

    monkeypatch.setattr("sys.stdin", Stdin)
    try:
        yield
    finally:
        Stdin.buffer.close()


DUPLICATED: list[Any] = [
    {"id": "r1", "state": "first"},
    "bare on line 2",
    {"id": "r1", "state": "again"},
    {"id": 2, "state": "explicit 2"},  # line 2's bare state has the id 2
    {"id": "2", "state": "a string id"},
    {"id": 2.0, "state": "a float id"},
    {"id": True, "state": "a boolean id"},
    {"id": 1, "state": "explicit 1"},
]


def test_repeated_ids_in_a_file_are_refused_up_front_naming_their_lines(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Refused in place before: 3 reads for 5 records, and a --resume never judged the second
    # record of an id. A file can be read twice: nothing is judged, nothing written.
    source = jsonl(tmp_path / "in.jsonl", *DUPLICATED)
    code, _, err = run(capsys, *batch(tmp_path, source))
    assert_one_line_failure(
        code, err, 'repeats record ids: "r1" on lines 1, 3; 2 on lines 2, 4;', "nothing was judged"
    )
    assert judged(stub) == []
    assert not (tmp_path / "out.jsonl").exists() or answers(tmp_path / "out.jsonl") == []


def test_a_repeated_id_on_a_pipe_gets_an_error_line_naming_both_lines(
    stub: InMemoryStubBackend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = jsonl(tmp_path / "in.jsonl", *DUPLICATED)
    with piped(monkeypatch, source):
        code, out, _ = run(capsys, *batch(tmp_path, "-"))
    assert code == 1
    lines = answers(tmp_path / "out.jsonl")
    assert [line["id"] for line in lines] == ["r1", 2, "r1", 2, "2", 2.0, True, 1]
    assert [("error" in line) for line in lines] == [0, 0, 1, 1, 0, 0, 0, 0]
    assert lines[2]["error"] == {
        "type": "InvalidInputError",
        "message": 'line 3: the id "r1" is already taken, by line 1; each record needs its own id',
    }
    assert lines[3]["error"]["message"].startswith("line 4: the id 2 is already taken, by line 2")
    assert judged(stub) == [
        "first", "bare on line 2", "a string id", "a float id", "a boolean id", "explicit 1",
    ]  # fmt: skip
    assert out.startswith("8 records (0 skipped as done), 2 failed")


def test_resume_after_a_kill_still_refuses_a_later_duplicate_and_counts_skips(
    stub: InMemoryStubBackend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = jsonl(
        tmp_path / "in.jsonl",
        {"id": "r1", "state": "first"},
        {"id": "r2", "state": "second"},
        {"id": "r1", "state": "again"},
        {"id": "r3", "state": "third"},
    )
    out = tmp_path / "out.jsonl"
    # A run killed after two lines.
    out.write_text('{"id": "r1", "answers": {}}\n{"id": "r2", "answers": {}}\n')
    with piped(monkeypatch, source):
        code, summary, _ = run(capsys, *batch(tmp_path, "-", "--resume"))
    assert code == 1
    lines = answers(out)
    assert [line["id"] for line in lines] == ["r1", "r2", "r1", "r3"]
    assert "already taken, by line 1" in lines[2]["error"]["message"]
    assert judged(stub) == ["third"]
    assert summary.startswith("2 records (2 skipped as done), 1 failed")
    # Everything is in --out now, the duplicate's error line included: nothing more to do.
    with piped(monkeypatch, source):
        code, summary, _ = run(capsys, *batch(tmp_path, "-", "--resume"))
    assert code == 0
    assert summary.startswith("0 records (4 skipped as done)")
    assert len(answers(out)) == 4


# -- 5. a question id given twice -----------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--noul", "refund=Refund?", "--noul", "refund=Money back?"],
        ["--noul", "refund=Refund?", "--choice", "refund=Which?:a,b"],
        ["--score", "refund=How?:low,high", "--questions", "QUESTIONS"],
    ],
)
def test_a_question_id_given_twice_is_an_error_naming_it(
    flags: list[str], stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    questions = tmp_path / "q.json"
    questions.write_text('{"questions": {"refund": {"type": "noul", "instructions": "R?"}}}')
    flags = [str(questions) if flag == "QUESTIONS" else flag for flag in flags]
    code, _, err = run(capsys, "judge", "x", *flags)
    assert_one_line_failure(code, err, "QuestionError", "'refund'", "given twice")
    assert stub.opened == 0


def test_answers_come_in_the_order_the_flags_were_given(
    stub: InMemoryStubBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "judge", "x", "--choice", "route=Which?:a,b", "--noul", "refund=Refund?"
    )
    assert code == 0
    assert list(json.loads(out)["answers"]) == ["route", "refund"]


# -- 6. integers beyond 64 bits -------------------------------------------------------------------


def test_ids_beyond_64_bits_round_trip_exactly(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = 123456789012345678901234567890
    source = jsonl(
        tmp_path / "in.jsonl",
        {"id": BIG, "state": "a"},
        {"id": huge, "state": "b"},
        {"id": float(BIG), "state": "a float, another id"},
    )
    code, _, _ = run(capsys, *batch(tmp_path, source))
    assert code == 0
    ids = [line["id"] for line in answers(tmp_path / "out.jsonl")]
    assert ids == [BIG, huge, float(BIG)]
    assert [type(i) for i in ids] == [int, int, float]
    # --resume reads them back exactly: nothing is judged twice.
    code, summary, _ = run(capsys, *batch(tmp_path, source, "--resume"))
    assert summary.startswith("0 records (3 skipped as done)")


def test_states_beyond_64_bits_are_judged_exactly(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Needs render_state to render integers beyond 64 bits (issue 13, another change).
    source = jsonl(tmp_path / "in.jsonl", {"id": "t", "state": {"order": BIG}}, [BIG, -BIG])
    code, _, err = run(capsys, *batch(tmp_path, source))
    assert code == 0, (err, answers(tmp_path / "out.jsonl"))
    assert judged(stub) == [f'{{"order":{BIG}}}', f"[{BIG},{-BIG}]"]
    stub.read_requests.clear()
    (tmp_path / "state.json").write_text(json.dumps({"order": BIG}))
    code, _, _ = run(capsys, "judge", f"@{tmp_path / 'state.json'}", *QUESTION)
    assert judged(stub) == [f'{{"order":{BIG}}}']


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (b"18446744073709551615", 2**64 - 1),
        (b"18446744073709551616", 2**64),
        (b'{"a": [-9223372036854775809]}', {"a": [-(2**63) - 1]}),
        (b'"12345678901234567890"', "12345678901234567890"),
        (b"1234567890123456789.5", 1234567890123456789.5),
    ],
)
def test_parse_json_keeps_big_integers(text: bytes, value: Any) -> None:
    parsed = parse_json(text)
    assert parsed == value
    assert type(parsed) is type(value)


@pytest.mark.parametrize(
    "text",
    [b"NaN", b"[1e400]", b'["\\ud800", 12345678901234567890]', b"[12345678901234567890, NaN]",
     b"[1, 12345678901234567890e400]", b"[" * 5000 + b"12345678901234567890" + b"]" * 5000],
)  # fmt: skip
def test_parse_json_refuses_what_json_does_not_have(text: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (orjson's and the stdlib's errors differ)
        parse_json(text)


# -- 7. a literal state starting with @ -----------------------------------------------------------


def test_double_at_is_a_literal_at_and_dash_is_stdin(
    stub: InMemoryStubBackend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, _ = run(capsys, "judge", "@@support my order never arrived", *QUESTION)
    assert code == 0
    (tmp_path / "t.txt").write_text("from a file")
    assert run(capsys, "judge", f"@{tmp_path / 't.txt'}", *QUESTION)[0] == 0
    monkeypatch.setattr("sys.stdin", _Text("from stdin"))
    assert run(capsys, "judge", "-", *QUESTION)[0] == 0
    assert judged(stub) == ["@support my order never arrived", "from a file", "from stdin"]


class _Text:
    def __init__(self, text: str) -> None:
        self.text = text

    def read(self) -> str:
        return self.text


# -- 8. help text for every option ----------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def test_every_option_has_help() -> None:
    parsers = {"": build_parser(), **_subparsers(build_parser())}
    parsers["serve-local --help"] = serve_local.build_parser("typevet-async serve-local")
    for name, parser in parsers.items():
        for action in parser._actions:
            if action.help != argparse.SUPPRESS:
                assert action.help, (name, action.dest)


def test_questions_help_gives_the_file_shape(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("judge", "batch"):
        assert main([command, "--help"]) == 0
        shown = capsys.readouterr().out
        assert '{"type": "noul", "instructions":' in shown
        assert '"criteria": {' in shown
        assert '"criteria": ["can wait"' in shown  # a Score's levels, System One's way
        assert "exit codes: 0" in shown
    # The shape shown is the one questions_from_json reads.
    example = help_texts.QUESTIONS_SHAPE.split("e.g. ", 1)[1].split(".\n", 1)[0]
    assert list(tv.questions_from_json(json.loads(example))) == ["refund"]


# -- 9. vLLM without --model names the flag -------------------------------------------------------


def test_vllm_without_model_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "judge", "x", *QUESTION, "--backend", "vllm", "--base-url", "http://h:1"
    )
    assert_one_line_failure(code, err, "--backend vllm needs --model MODEL (or TYPEVET_MODEL)")
    code, _, err = run(capsys, "judge", "x", *QUESTION, "--backend", "vllm", "--model", "m")
    assert_one_line_failure(code, err, "--base-url URL (or TYPEVET_BASE_URL)")


def test_system_one_without_a_url_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "judge", "x", *QUESTION, "--backend", "system_one")
    assert_one_line_failure(
        code, err, "--backend system_one needs --base-url URL (or TYPEVET_BASE_URL)"
    )


def test_system_one_is_a_backend_of_the_command_line() -> None:
    args = build_parser().parse_args(
        ["judge", "x", *QUESTION, "--backend", "system_one", "--base-url", "http://gw:8000"]
    )
    session = inputs.session_from_args(args, {})
    assert isinstance(session.backend, tv.AsyncSystemOne)
    assert session.backend.config.base_url == "http://gw:8000"


def test_vllm_from_the_variable_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TYPEVET_BACKEND", "vllm")
    code, _, err = run(capsys, "judge", "x", *QUESTION, "--base-url", "http://h:1")
    assert_one_line_failure(code, err, "TYPEVET_BACKEND=vllm needs --model MODEL")


# -- 10. --resume with nothing left starts no server ----------------------------------------------


def test_resume_with_nothing_left_starts_no_embedded_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: tv.EmbeddedServer) -> str:
        raise AssertionError("the embedded server was started")

    monkeypatch.setattr(tv.EmbeddedServer, "start", refuse)
    source = jsonl(tmp_path / "in.jsonl", "s1", {"id": "x", "state": "s2"})
    (tmp_path / "out.jsonl").write_text('{"id": 1, "answers": {}}\n{"id": "x", "answers": {}}\n')
    code, out, err = run(capsys, *batch(tmp_path, source, "--resume"))
    assert code == 0, err
    assert out.startswith("0 records (2 skipped as done), 0 failed")


# -- 11. serve-local: a port in use, a missing model, one line each -------------------------------


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_serve_local_on_a_port_in_use_names_the_port(
    taken_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "serve-local", "--port", str(taken_port))
    assert_one_line_failure(code, err, f"port {taken_port} on 127.0.0.1 is already in use")


@pytest.mark.parametrize(
    ("flags", "parts"),
    [
        (["--model", "/nonexistent/model.gguf"], ["--model", "does not exist"]),
        (["--port", "70000"], ["--port", "0 to 65535"]),
        (["--ctx-size", "0"], ["--ctx-size", "positive"]),
        (["--host", "no-such-host.invalid", "--port", "0"], ["--host", "not an address"]),
        (["--bogus"], ["--bogus", "serve-local --help"]),
    ],
)
def test_serve_local_startup_errors_are_one_line(
    flags: list[str], parts: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "serve-local", *flags)
    assert_one_line_failure(code, err, *parts)


def test_serve_local_help_gives_the_request_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve-local", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    for part in (
        "--host",
        "--model NAME|GGUF",
        "qwen2.5-coder-1.5b",
        "--ctx-size TOKENS",
        "2,048 by default",
        "exceeds the available context size",
        "Session.local(server=tv.ServerOptions(",
    ):
        assert part in shown, part  # fmt: skip


def test_a_sessions_embedded_server_on_a_port_in_use_says_so(
    taken_port: int, tmp_path: Path
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"never loaded: the port is checked first")
    server = tv.EmbeddedServer(tv.ServerOptions(port=taken_port, model_path=model))
    with pytest.raises(tv.ConfigurationError, match=f"port {taken_port} on 127.0.0.1 is already"):
        server.start()
    assert server.process is None


# -- 12. the scripts ------------------------------------------------------------------------------


def test_scripts_refer_to_nothing_outside_the_repository() -> None:
    for script in (REPOSITORY / "scripts").glob("*.sh"):
        assert "../" not in script.read_text().replace('"$(dirname "$0")/.."', ""), script


def test_the_test_script_says_what_it_is_doing() -> None:
    text = (REPOSITORY / "scripts" / "test.sh").read_text()
    steps = [line for line in text.splitlines() if line.startswith("step ")]
    assert len(steps) >= 5
    [pytest_line] = [line for line in text.splitlines() if "-m pytest" in line]
    assert " -v " in pytest_line


# -- 13. the generate example's schema ------------------------------------------------------------


def test_the_example_schema_is_closed_and_small() -> None:
    schema = json.loads((REPOSITORY / "examples" / "ticket.schema.json").read_text())
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == set(schema["properties"])
    for field in schema["properties"].values():
        assert "enum" in field or field.get("maxLength", 1000) <= 60


def test_the_local_model_is_a_flag_and_a_variable(capsys: pytest.CaptureFixture[str]) -> None:
    def served(argv: list[str], environ: dict[str, str]) -> str:
        session = inputs.session_from_args(build_parser().parse_args(argv), environ)
        assert isinstance(session.backend, tv.AsyncLlamaCpp)
        assert session.backend.config.server is not None
        return session.backend.config.server.model

    judge = ["judge", "x", *QUESTION]
    assert served(judge, {}) == "gemma3-270m"
    assert served([*judge, "--local-model", "qwen2.5-coder-1.5b"], {}) == "qwen2.5-coder-1.5b"
    environ = {"TYPEVET_LOCAL_MODEL": "qwen2.5-coder-1.5b"}
    assert served(judge, environ) == "qwen2.5-coder-1.5b"
    assert served([*judge, "--local-model", "gemma3-270m"], environ) == "gemma3-270m"
    code, _, err = run(capsys, *judge, "--local-model", "llama")
    assert code == 2
    assert "invalid choice: 'llama'" in err


# -- serve: auth is off only when asked for (issue 31) ---------------------------------------


@pytest.mark.parametrize(
    ("flags", "environ", "parts"),
    [
        ([], {}, ["no bearer keys", "--no-auth"]),
        (["--keys-file", "{blank}"], {}, ["holds no key", "--no-auth"]),
        (["--keys-env", "SERVE_KEYS_UNSET"], {}, ["SERVE_KEYS_UNSET: the variable is not set"]),
        (["--keys-env", "SERVE_KEYS_BLANK"], {"SERVE_KEYS_BLANK": " "}, ["holds no key"]),
        (["--keys-file", "{blank}", "--no-auth"], {}, ["holds no key"]),
        (["--keys-env", "SERVE_KEYS_SET", "--no-auth"], {"SERVE_KEYS_SET": "k"}, ["choose one"]),
    ],
)
def test_serve_refuses_to_start_with_auth_off_unless_asked(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    flags: list[str],
    environ: dict[str, str],
    parts: list[str],
) -> None:
    # A keys file of one blank line (what the README's openssl recipe writes without openssl)
    # or a named variable that is unset started the gateway with auth off.
    blank = tmp_path / "keys.txt"
    blank.write_text("\n")
    monkeypatch.delenv("TYPEVET_SERVE_KEYS", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)

    async def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the gateway was started")

    monkeypatch.setattr("typevet_async._apps.gateway.serve", never)
    argv = [flag.format(blank=blank) for flag in flags]
    code, _, err = run(capsys, "serve", "--base-url", "http://127.0.0.1:9", *argv)
    assert_one_line_failure(code, err, *parts)


@pytest.mark.parametrize("last", ["[1, 2]", '"text"', "42", '{"answers": {}}'])
def test_resume_refuses_an_out_line_that_is_json_but_not_an_answer_line(
    stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str], last: str
) -> None:
    # Valid JSON is never a line a kill cut short: it was exit 0, and the line was dropped.
    source = jsonl(tmp_path / "in.jsonl", {"id": "r1", "state": "first"})
    out = tmp_path / "out.jsonl"
    out.write_text(last + "\n")
    code, _, err = run(capsys, *batch(tmp_path, source, "--resume"))
    assert_one_line_failure(code, err, "line 1 is JSON but not an answer line")
    assert out.read_text() == last + "\n"
    assert judged(stub) == []


# -- 11. eval's reads file of the wrong shape: calibrate and eval --resume say where, exit 2 ------

EVAL_QUESTIONS = ["--noul", "refund=Refund?", "--choice", "route=Team?:billing,shipping,technical"]


def _eval_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, list[str]]:
    """A folder as eval leaves it on the stub (6 labelled records), and eval's own argv."""
    routes = ("billing", "shipping", "technical")
    records = [
        {
            "id": f"r{n}",
            "state": f"ticket {n}",
            "labels": {"refund": n % 2 == 0, "route": routes[n % 3]},
        }
        for n in range(6)
    ]
    source = jsonl(tmp_path / "labelled.jsonl", *records)
    argv = [
        "eval",
        str(source),
        *EVAL_QUESTIONS,
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
        "--resamples",
        "0",
    ]
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    return tmp_path / "run", argv


def _edit_answer(question: str, field: str, value: Any) -> Any:
    def edit(line: dict[str, Any]) -> None:
        line["answers"][question][field] = value

    return edit


#: A reads line made hostile or corrupt, and what the one-line failure must name.
BAD_READS: dict[str, tuple[Any, list[str]]] = {
    "probabilities as a string": (
        _edit_answer("refund", "probabilities", "0.7,0.3"),
        ["'refund'", "list of 2 numbers", "'0.7,0.3'"],
    ),
    "three probabilities for a yes/no question": (
        _edit_answer("refund", "probabilities", [0.5, 0.3, 0.2]),
        ["'refund'", "2 numbers", "got 3"],
    ),
    "a number as text": (_edit_answer("route", "probabilities", ["1", 0, 0]), ["must be a number"]),
    "a boolean": (_edit_answer("refund", "probabilities", [True, False]), ["must be a number"]),
    "negative": (_edit_answer("refund", "probabilities", [-0.5, 1.5]), ["[0, 1]", "-0.5"]),
    "a huge number": (_edit_answer("refund", "probabilities", [10**30, 0]), ["[0, 1]"]),
    "beyond any float": (_edit_answer("refund", "probabilities", [10**400, 0]), ["infinity"]),
    "not summing to 1": (_edit_answer("refund", "probabilities", [0.5, 0.6]), ["sum to 1.1"]),
    "raw of another length": (_edit_answer("refund", "raw", [1.0]), ["raw", "got 1"]),
    "rotations the run did not read": (
        _edit_answer("route", "rotations", [[1, 0, 0]]),
        ["rotations must be empty", "one order"],
    ),
    "an answer to a question not asked": (
        lambda line: line["answers"].update(other=line["answers"]["refund"]),
        ["'other'", "does not ask"],
    ),
    "a label for a question not asked": (
        lambda line: line["labels"].update(other=True),
        ["['other']", "not asked"],
    ),
    "a labelled question with no answer": (
        lambda line: line["answers"].pop("route"),
        ["no answer", "'route'"],
    ),
    "an error that is not one": (
        lambda line: line.update(error="boom") or line.pop("answers"),
        ['"type": TEXT'],
    ),
    "a record id twice": (lambda line: line.update(id="r0"), ['"r0"', "line 1 already"]),
    "a huge line": (
        _edit_answer("route", "probabilities", [0.0] * 1_000_000),
        ["3 numbers", "got 1000000"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_READS))
def test_calibrate_and_eval_resume_name_the_file_line_and_problem_of_a_bad_reads_line(
    case: str, stub: InMemoryStubBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A string of probabilities or three for a Noul ended in a traceback and exit 1 (for eval
    # --resume after judging the rest); the others were taken in silence, a fit made on them.
    edit, parts = BAD_READS[case]
    folder, argv = _eval_run(tmp_path, capsys)
    reads = folder / "reads.jsonl"
    lines = [json.loads(line) for line in reads.read_text().splitlines()]
    edit(lines[3])
    reads.write_text("".join(json.dumps(line) + "\n" for line in lines[:5]))  # 1 left to judge
    before, sent = reads.read_bytes(), len(stub.read_requests)
    code, _, err = run(capsys, "calibrate", str(folder), "--out", str(tmp_path / "map.json"))
    assert_one_line_failure(code, err, f"{reads} line 4", *parts)
    assert len(err) < 1000  # a huge line is described, not repeated
    assert not (tmp_path / "map.json").exists()
    code, _, err = run(capsys, *argv, "--resume")
    assert_one_line_failure(code, err, f"{reads} line 4", *parts)
    assert reads.read_bytes() == before  # nothing written is lost, nothing appended
    assert len(stub.read_requests) == sent


def _rotations_as_text(readings: dict[str, Any]) -> None:
    readings["refund"]["rotations"] = "3"


@pytest.mark.parametrize(
    ("edit", "parts"),
    [
        (_rotations_as_text, ["rotations", "'3'"]),
        (lambda readings: readings.pop("route"), ["readings are not those of its questions"]),
    ],
)
def test_calibrate_refuses_a_run_whose_facts_read_otherwise(
    edit: Any,
    parts: list[str],
    stub: InMemoryStubBackend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Rotations "3" went into the map as they were; a question with no reading was a KeyError
    # traceback.
    folder, _ = _eval_run(tmp_path, capsys)
    facts_path = folder / "reads.jsonl.run.json"
    facts = json.loads(facts_path.read_text())
    edit(facts["readings"])
    facts_path.write_text(json.dumps(facts))
    code, _, err = run(capsys, "calibrate", str(folder), "--out", str(tmp_path / "map.json"))
    assert_one_line_failure(code, err, "not an eval run's facts", *parts)
    assert not (tmp_path / "map.json").exists()


def test_calibrate_leaves_out_a_last_line_a_kill_cut_short_and_says_so(
    stub: InMemoryStubBackend,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    folder, argv = _eval_run(tmp_path, capsys)
    reads = folder / "reads.jsonl"
    reads.write_bytes(reads.read_bytes()[:-30])
    code, out, err = run(capsys, "calibrate", str(folder), "--out", str(tmp_path / "map.json"))
    assert code == 0, err
    assert "its last line was cut short" in caplog.text
    assert "map: " in out
    # eval --resume judges that record again and keeps the five before it.
    sent = len(stub.read_requests)
    code, _, err = run(capsys, *argv, "--resume")
    assert code == 0, err
    assert [line["id"] for line in answers(reads)] == [f"r{n}" for n in range(6)]
    assert len(stub.read_requests) > sent


# -- 12. a newcomer's first mistakes: each failure says what was expected and what to do --------


@pytest.mark.parametrize(
    ("flag", "spec", "parts"),
    [
        (
            "--choice",
            "team=billing,shipping",
            [
                '--choice wants ID="INSTRUCTIONS:LABEL,LABEL,..."',
                "'team=billing,shipping'",
                "no ':' between the instructions and the labels",
            ],
        ),
        (
            "--score",
            "mood=low,high",
            ['--score wants ID="INSTRUCTIONS:LEVEL,LEVEL,..."', "no ':' between the instructions"],
        ),
        (
            "--choice",
            "team=Which team?:billing",
            ['ID="INSTRUCTIONS:LABEL,LABEL,..."', "at least two labels, got 1"],
        ),
        ("--choice", "team", ['ID="INSTRUCTIONS:LABEL,LABEL,..."', "no '=' after the id"]),
    ],
)
def test_a_choice_or_score_flag_without_its_instructions_says_the_form_it_wants(
    flag: str,
    spec: str,
    parts: list[str],
    stub: InMemoryStubBackend,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # "--choice team=billing,shipping" said "a Choice needs at least two labels, got 0".
    code, _, err = run(capsys, "judge", "x", flag, spec)
    assert_one_line_failure(code, err, *parts)
    assert stub.opened == 0


@pytest.mark.parametrize(
    ("argv", "listed"),
    [
        (["judge", "x", *QUESTION], "--label-prior"),
        (["batch", "in.jsonl", *QUESTION, "--out", "o.jsonl"], "--resume"),
        (["eval", "in.jsonl", *QUESTION, "--out", "o"], "--resamples"),
        (["calibrate", "run", "--out", "map.json"], "--holdout"),
        (["generate", "p", "--schema", "s.json"], "--max-tokens"),
        (["serve", "--base-url", "http://127.0.0.1:9"], "--port"),
    ],
)
def test_an_unknown_flag_points_to_its_commands_help_which_lists_the_flags(
    argv: list[str], listed: str, stub: InMemoryStubBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    # It pointed to 'typevet-async --help', which lists the commands and none of their flags.
    code, _, err = run(capsys, *argv, "--tabel")
    assert_one_line_failure(code, err, "--tabel", f"(see 'typevet-async {argv[0]} --help')")
    assert main([argv[0], "--help"]) == 0
    assert listed in capsys.readouterr().out
    assert stub.opened == 0


def test_a_server_that_is_not_running_is_one_line_saying_what_to_do() -> None:
    # Each retry was a timestamped WARNING, then only "Cannot connect to host ...".
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "typevet_async._apps.cli",
        "judge",
        "x",
        *QUESTION,
        "--base-url",
        f"http://127.0.0.1:{port}",
    ]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TYPEVET_")}
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, cwd=REPOSITORY, env=environ
    )
    assert done.returncode == 2, done.stderr
    assert_one_line_failure(
        done.returncode,
        done.stderr,
        "TransportError",
        f"127.0.0.1:{port}",
        "is a model server running at that URL?",
        "--local-model",
        "(see 'typevet-async judge --help')",
    )
    # The retries are still made (a server may be starting): -v shows them, at INFO.
    verbose = subprocess.run(
        [*argv, "-v"], capture_output=True, text=True, timeout=120, cwd=REPOSITORY, env=environ
    )
    retries = [line for line in verbose.stderr.splitlines() if "typevet_async.retry" in line]
    assert retries, verbose.stderr
    assert all(" INFO attempt " in line for line in retries), retries
