"""judge_many and the command line against the real llama.cpp server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

import typevet_async as tv

from .helpers import TICKET

pytestmark = [pytest.mark.live]

QUESTIONS = {"refund": tv.Noul(instructions="Is a refund requested?")}
TOO_LONG = "word " * 2500  # over the server's per-slot context: an HTTP 400 for that record


@pytest.mark.asyncio
async def test_order_errors_and_progress(gemma3_url: str) -> None:
    records = [(f"t{n}", f"Ticket {n}: {TICKET}") for n in range(12)]
    records[5] = ("t5", TOO_LONG)
    progress: list[tv.Progress] = []
    async with tv.Session.llama_cpp(gemma3_url, max_concurrency=4) as session:
        items = [
            item
            async for item in session.judge_many(
                records, QUESTIONS, on_progress=progress.append, max_retries=0
            )
        ]
    assert [item.record_id for item in items] == [f"t{n}" for n in range(12)]
    assert [item.index for item in items] == list(range(12))
    assert isinstance(items[5].error, tv.ServerError)
    assert items[5].error.status == 400
    for n, item in enumerate(items):
        if n != 5:
            assert item.judgment is not None
            assert f"Ticket {n}:" in item.judgment.diagnostics["refund"].prompt
    assert [p.done for p in progress] == list(range(1, 13))
    assert progress[-1].failed == 1
    assert progress[-1].total == 12


@pytest.mark.asyncio
async def test_fail_fast_and_cancellation(gemma3_url: str) -> None:
    records = [f"Ticket {n}: {TICKET}" for n in range(20)]
    records[3] = TOO_LONG
    tasks_before = len(asyncio.all_tasks())
    async with tv.Session.llama_cpp(gemma3_url, max_concurrency=4) as session:
        seen: list[tv.BatchItem] = []

        async def consume() -> None:
            stream = session.judge_many(records, QUESTIONS, fail_fast=True, max_retries=0)
            async with contextlib.aclosing(stream):
                async for item in stream:
                    seen.append(item)

        with pytest.raises(tv.ServerError) as caught:
            await consume()
        assert caught.value.status == 400
        assert len(seen) <= 3  # records 0-2 at most; record 3 failed and stopped the batch
        # Cancel a consumer mid-batch: the batch stops, nothing leaks, the session still works.
        # 200 records take this server tens of seconds (about 5 questions/s, README "Load"),
        # so 1 s in the batch is mid-way whatever the machine's load.
        cut: list[tv.BatchItem] = []
        with anyio.move_on_after(1.0) as scope:
            stream = session.judge_many([f"T{n}" for n in range(200)], QUESTIONS)
            async with contextlib.aclosing(stream):
                async for item in stream:
                    cut.append(item)
        assert scope.cancelled_caught
        assert len(cut) < 200
        assert len(asyncio.all_tasks()) == tasks_before
        again = await session.judge(TICKET, QUESTIONS)
    assert list(again) == ["refund"]


def cli(*args: str, url: str) -> list[str]:
    return [sys.executable, "-m", "typevet_async._cli", *args, "--base-url", url]


def test_cli_batch_resumes_after_a_kill_without_loss_or_duplicates(
    gemma3_url: str, tmp_path: Path
) -> None:
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps({"questions": {"refund": {
        "type": "noul", "instructions": "Is a refund requested?"}}}))  # fmt: skip
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
    assert "QuestionError: no questions" in bad.stderr


def test_cli_serve_local_prints_its_url_and_serves() -> None:
    import urllib.request

    server = subprocess.Popen(
        [sys.executable, "-m", "typevet_async._cli", "serve-local", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
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
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()
