"""The demo's printed output, on judgments the real pipeline builds (the in-memory stub backend
in place of the embedded server): what a newcomer reads first."""

from __future__ import annotations

import json
from typing import Any

import pytest

import typevet_async as tv
from typevet_async._apps import demo as _demo

from .stubs import InMemoryStubBackend


def test_the_demo_prints_whole_json_plain_tickets_and_says_what_confidence_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It printed its fifth ticket as a Python dict, cut its JSON after 400 characters (mid-
    # number) and showed confidence=0.000 with no word of what it is.
    def local(cls: type[tv.Session], model: str, **settings: Any) -> tv.Session:
        return tv.Session(InMemoryStubBackend(), tv.SessionSettings(**settings))

    monkeypatch.setattr(tv.Session, "local", classmethod(local))
    _demo.main(["--model", "gemma3-270m"])
    out = capsys.readouterr().out
    assert "{'" not in out  # no Python repr anywhere
    tickets = [
        line.removeprefix("ticket: ") for line in out.splitlines() if line.startswith("ticket: ")
    ]
    assert len(tickets) == len(_demo.TICKETS)
    assert json.loads(tickets[4]) == _demo.TICKETS[4]
    assert "confidence (0: as unsure as an even spread over the options" in out
    assert "off-menu mass" in out
    # The JSON block is whole: it parses, and holds every answer of the last judgment.
    block = out.split("numbers rounded here):\n", 1)[1].split("\n\n", 1)[0]
    shown = json.loads(block)
    assert list(shown["answers"]) == list(_demo.QUESTIONS)
    assert shown["answers"]["route"]["type"] == "choice"
    assert shown["usage"]["reads"] == 3


@pytest.mark.asyncio
async def test_a_judgments_lines_show_each_answer_and_what_was_read() -> None:
    async with tv.Session(InMemoryStubBackend()) as session:
        judgment = await session.judge(_demo.TICKETS[4], _demo.QUESTIONS)
    lines = _demo.judgment_lines(_demo.TICKETS[4], judgment)
    assert (
        lines[0] == 'ticket: {"subject": "Invoice", "body": "Please send a VAT invoice '
        'for order 1182.", "plan": "pro"}'
    )
    for line, question_id in zip(lines[1:4], _demo.QUESTIONS, strict=True):
        assert line.split()[0] == question_id
        assert "confidence=" in line
        assert "off-menu=" in line
    assert lines[4].strip().startswith("3 reads, ")
    written = json.loads(tv.judgment_to_json(judgment))
    shown = json.loads(_demo.answers_json(judgment))
    assert shown["answers"]["route"]["choice"] == written["answers"]["route"]["choice"]
    assert shown["answers"]["mood"]["score"] == pytest.approx(
        written["answers"]["mood"]["score"], abs=1e-4
    )
    assert "diagnostics" not in shown
