"""The real ``typevet-async`` command line (a child process) against the real llama.cpp server:
batch past bad lines, resume after a kill, pipes, judge, generate with the example schema,
serve-local."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest

from .helpers import TICKET

pytestmark = [pytest.mark.live]

REPOSITORY = Path(__file__).parent.parent.parent
EXAMPLES = REPOSITORY / "examples"
TOO_LONG = "word " * 2500  # over the server's 2,048-token request limit: an HTTP 400
BIG = 2**70  # beyond 64 bits
#: The README's generate example.
GENERATE_PROMPT = (
    "Sort this support ticket. Ticket: I was charged twice for my order and want my money back."
)


def cli(*args: str, url: str) -> list[str]:
    return [sys.executable, "-m", "typevet_async._apps.cli", *args, "--base-url", url]


def no_server_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which starting the embedded server fails at once (its cache folder
    is a file), so a command that succeeds in it started none."""
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TYPEVET_")}
    return {**env, "TYPEVET_CACHE_DIR": str(blocker)}


def read_answers(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_questions(tmp_path: Path) -> Path:
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps({"questions": {"refund": {
        "type": "noul", "instructions": "Is a refund requested?"}}}))  # fmt: skip
    return questions


def test_cli_batch_resumes_after_a_kill_without_loss_or_duplicates(
    gemma3_url: str, tmp_path: Path
) -> None:
    questions = write_questions(tmp_path)
    source = tmp_path / "in.jsonl"
    lines = [json.dumps({"id": f"r{n}", "state": f"Ticket {n}: {TICKET}"}) for n in range(30)]
    lines.insert(10, json.dumps("a bare string state"))  # its id is its line number, 11
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    args = cli("batch", str(source), "--questions", str(questions), "--out", str(out),
               "--no-progress", "--max-concurrency", "2", url=gemma3_url)  # fmt: skip
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if out.exists() and out.read_text().count("\n") >= 8:
            break
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    written = out.read_text().count("\n")
    assert 8 <= written < 31, "the run was killed mid-way"

    second = subprocess.run(
        [*args, "--resume"], capture_output=True, text=True, timeout=300, check=False
    )
    assert second.returncode == 0, second.stderr
    assert f"({written} skipped as done)" in second.stdout
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    expected = [f"r{n}" for n in range(10)] + [11] + [f"r{n}" for n in range(10, 30)]
    assert ids == expected  # none lost, none duplicated, input order
    for line in out.read_text().splitlines():
        record = json.loads(line)
        assert record["answers"]["refund"]["type"] == "noul"
        assert 0.0 < record["answers"]["refund"]["noul"] < 1.0


def test_cli_batch_goes_on_past_bad_lines_and_failed_records(
    gemma3_url: str, tmp_path: Path
) -> None:
    questions = write_questions(tmp_path)
    source = tmp_path / "in.jsonl"
    source.write_text(
        "\n".join([
            json.dumps({"id": "a", "state": TICKET}),
            '{"id": "b", "state": "cut sh',  # not JSON
            json.dumps({"id": BIG, "state": f"Order {BIG}: {TICKET}"}),
            json.dumps({"id": "a", "state": "a second a"}),  # a repeated id
            json.dumps({"id": "long", "state": TOO_LONG}),  # the server refuses it: HTTP 400
            json.dumps({"order": BIG, "text": TICKET}),  # a bare state, id 6
        ])
        + "\n"
    )  # fmt: skip
    out = tmp_path / "out.jsonl"
    # On a pipe (a file with a repeated id is refused up front): each bad line an error line.
    args = ["batch", "-", "--questions", str(questions), "--out", str(out)]
    run = subprocess.run(
        cli(*args, "--no-progress", url=gemma3_url), input=source.read_text(),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr  # some records failed; every line was written
    lines = read_answers(out)
    assert [line["id"] for line in lines] == ["a", 2, BIG, "a", "long", 6]
    assert [("error" in line) for line in lines] == [0, 1, 0, 1, 1, 0]
    assert lines[1]["error"]["message"].startswith("line 2: not valid JSON")
    assert lines[3]["error"]["message"].startswith('line 4: the id "a" is already taken')
    assert lines[4]["error"]["type"] == "ServerError"
    assert "6 records (0 skipped as done), 3 failed" in run.stdout
    # Every line is done: --resume judges nothing, and starts no server.
    again = subprocess.run(
        [sys.executable, "-m", "typevet_async._apps.cli", *args, "--resume"],
        input=source.read_text(), capture_output=True, text=True, timeout=60, check=False,
        env=no_server_env(tmp_path),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "0 records (6 skipped as done), 0 failed" in again.stdout
    # The same file as a file: its repeated id is refused before anything is judged.
    refused = subprocess.run(
        [sys.executable, "-m", "typevet_async._apps.cli", "batch", str(source), "--questions",
         str(questions), "--out", str(tmp_path / "file.jsonl")],
        capture_output=True, text=True, timeout=60, check=False, env=no_server_env(tmp_path),
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert '"a" on lines 1, 4' in refused.stderr


def test_cli_batch_reads_a_pipe_once(gemma3_url: str, tmp_path: Path) -> None:
    questions = write_questions(tmp_path)
    records = "".join(json.dumps(f"Ticket {n}: {TICKET}") + "\n" for n in range(4))
    out = tmp_path / "stdin.jsonl"
    piped = subprocess.run(
        cli("batch", "/dev/stdin", "--questions", str(questions), "--out", str(out),
            url=gemma3_url),
        input=records, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert [line["id"] for line in read_answers(out)] == [1, 2, 3, 4]
    (tmp_path / "in.jsonl").write_text(records)
    substituted = subprocess.run(
        ["bash", "-c", 'exec "$@" <(cat in.jsonl)', "bash",
         *cli("batch", "--questions", str(questions), "--out", "sub.jsonl", url=gemma3_url)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert substituted.returncode == 0, substituted.stderr
    assert [line["id"] for line in read_answers(tmp_path / "sub.jsonl")] == [1, 2, 3, 4]


def test_cli_batch_of_the_examples(gemma3_url: str, tmp_path: Path) -> None:
    out = tmp_path / "answers.jsonl"
    run = subprocess.run(
        cli("batch", str(EXAMPLES / "tickets.jsonl"), "--questions",
            str(EXAMPLES / "questions.json"), "--out", str(out), url=gemma3_url),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = read_answers(out)
    assert [line["id"] for line in lines] == ["t1", "t2", "t3", "t4", 5]
    for line in lines:
        assert list(line["answers"]) == ["refund", "route", "urgency"]


def test_cli_judge_and_generate(gemma3_url: str, tmp_path: Path) -> None:
    judged = subprocess.run(
        cli("judge", TICKET, "--noul", "refund=Is a refund requested?",
            "--choice", "route=Which team?:billing,shipping,technical", url=gemma3_url),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    answers = json.loads(judged.stdout)["answers"]
    assert list(answers) == ["refund", "route"]
    assert answers["route"]["choice"] in ("billing", "shipping", "technical")
    table = subprocess.run(
        cli("judge", "-", "--score", "u=How urgent?:low,high", "--table", url=gemma3_url),
        input=json.dumps({"ticket": TICKET}), capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    assert table.stdout.startswith("u ")
    literal = subprocess.run(
        cli("judge", "@support my order never arrived", "--noul", "q=Is it about an order?",
            url=gemma3_url),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert literal.returncode == 2
    assert "write @@" in literal.stderr
    literal = subprocess.run(
        cli("judge", "@@support my order never arrived", "--noul", "q=Is it about an order?",
            url=gemma3_url),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(literal.stdout)["answers"]["q"]["type"] == "noul"
    schema = tmp_path / "colour.json"
    schema.write_text(json.dumps({"enum": ["red", "green", "blue"]}))
    generated = subprocess.run(
        cli("generate", 'Reply in JSON like "red". The car is red.', "--schema", str(schema),
            "--max-tokens", "10", url=gemma3_url),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(generated.stdout) in ("red", "green", "blue")
    bad = subprocess.run(
        cli("judge", TICKET, url=gemma3_url), capture_output=True, text=True, timeout=60,
        check=False, env={**os.environ},
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr == (
        "typevet-async: QuestionError: no questions: give --questions FILE or "
        "--noul/--choice/--score\n"
    )


def test_cli_generate_the_readme_example(gemma3_url: str) -> None:
    schema_file = EXAMPLES / "ticket.schema.json"
    started = time.monotonic()
    generated = subprocess.run(
        cli("generate", GENERATE_PROMPT, "--schema", str(schema_file), "--max-tokens", "100",
            url=gemma3_url),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    value = json.loads(generated.stdout)
    jsonschema.validate(value, json.loads(schema_file.read_text()))
    assert value["team"] == "billing"
    print(f"generate example: {value} in {time.monotonic() - started:.1f} s")


def test_cli_serve_local_prints_its_url_and_serves(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "typevet_async._apps.cli", "serve-local", "--port", "0",
         "--host", "127.0.0.1", "--ctx-size", "4096", "--parallel", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = json.loads(server.stdout.readline())["url"]
        assert url.startswith("http://127.0.0.1:")
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    assert json.loads(response.read()) == {"status": "ok"}
                    break
            except OSError:
                assert time.monotonic() < deadline, "serve-local never became healthy"
                time.sleep(0.2)
        with urllib.request.urlopen(f"{url}/slots", timeout=10) as response:
            slots = json.loads(response.read())
        # --ctx-size is shared by the slots: one request may use 4096 / 2 tokens.
        assert [slot["n_ctx"] for slot in slots] == [2048, 2048]
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()


def test_cli_serve_local_on_the_port_of_a_running_server(gemma3_url: str) -> None:
    port = urlsplit(gemma3_url).port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # the real server listens there
    started = time.monotonic()
    refused = subprocess.run(
        [sys.executable, "-m", "typevet_async._apps.cli", "serve-local", "--port", str(port)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr == (
        f"typevet-async: ConfigurationError: port {port} on 127.0.0.1 is already in use "
        "(another server?): pick another with --port, or --port 0 for a free one\n"
    )
    assert time.monotonic() - started < 30  # refused before any model loads


def test_cli_logs_each_read_as_json_lines_with_structured_fields(gemma3_url: str) -> None:
    secret = "SECRET-STATE-91c2"
    judged = subprocess.run(
        cli("judge", f"{secret} {TICKET}", "--noul", "refund=Is a refund requested?",
            "--choice", "route=Which team?:billing,shipping", "-vv", "--log-format", "json",
            url=gemma3_url),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert list(json.loads(judged.stdout)["answers"]) == ["refund", "route"]  # stdout: answers
    records = [json.loads(line) for line in judged.stderr.splitlines()]
    ours = [r for r in records if r["name"].startswith("typevet_async")]
    asked = [r for r in ours if r["name"] == "typevet_async.question"]
    assert sorted(r["question_id"] for r in asked) == ["refund", "route"]
    for record in asked:
        assert record["status"] == "answered"
        assert record["duration_ms"] > 0
        assert record["attempts"] >= 1
        assert record["reads"] >= 1
    http_reads = [r for r in ours if r["name"] == "typevet_async.read" and r["level"] == "DEBUG"]
    assert len(http_reads) >= 2
    assert all(r["input_tokens"] > 0 for r in http_reads)
    [judgment] = [r for r in ours if r["name"] == "typevet_async.judgment"]
    assert judgment["questions"] == 2
    assert judgment["status"] == "ok"
    assert secret not in judged.stderr
    assert "charged twice" not in judged.stderr
    # The default: text lines, warnings only (an escalation's, say): no record per read.
    quiet = subprocess.run(
        cli("judge", TICKET, "--noul", "refund=Is a refund requested?", url=gemma3_url),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert all(" WARNING " in line for line in quiet.stderr.splitlines()), quiet.stderr
