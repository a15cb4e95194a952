"""A judgment as a Decisions response: answers as a list in question order, each a predicate,
choice, score or refusal answer (the ``openai`` package's ``types.decision``), and the usage.

A question whose answer the SDK's off-menu guard flagged (its off-menu mass above the
session's ``off_menu_threshold``) is answered with a refusal: the model put too much of its
next-token mass on no option for the probabilities to mean an answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from typevet_async._core.reading.answers import ChoiceAnswer, Judgment, NoulAnswer, ScoreAnswer
from typevet_async._core.wires.decisions.requests import DecisionsCall

__all__ = ["refused_questions", "response_to_decisions"]


def refused_questions(judgment: Judgment) -> frozenset[str]:
    """The questions the off-menu guard flagged (their answers are refusals)."""
    return frozenset(qid for qid, d in judgment.diagnostics.items() if d.off_menu_flagged)


def _answer(call: DecisionsCall, qid: str, answer: Any, name: str | None) -> dict[str, Any]:
    if isinstance(answer, NoulAnswer):
        return {"type": "predicate", "name": name, "probability": answer.noul}
    probabilities = list(answer.probabilities.values())  # option order
    if isinstance(answer, ChoiceAnswer):
        values = call.values[qid]
        best = list(answer.probabilities).index(answer.choice)
        return {
            "type": "choice",
            "name": name,
            "choice": values[best],
            "confidence": answer.confidence,
            "probabilities": [
                {"value": value, "probability": p}
                for value, p in zip(values, probabilities, strict=True)
            ],
        }
    assert isinstance(answer, ScoreAnswer)
    labels = call.levels[qid]
    return {
        "type": "score",
        "name": name,
        "score": answer.score,
        "confidence": answer.confidence,
        "probabilities": [
            {"label": label, "value": level, "probability": p}
            for level, (label, p) in enumerate(zip(labels, probabilities, strict=True))
        ],
    }


def response_to_decisions(
    call: DecisionsCall,
    answers: Mapping[str, Any],
    model: str,
    *,
    refused: frozenset[str] = frozenset(),
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """The Decisions response to ``call``: each question's answer in order (a refusal for those
    in ``refused`` or without an answer), a Score's ``value`` its 0-based level and ``score``
    the expected level; ``usage`` the prompt tokens every read evaluated (``cached_tokens`` of
    them from the server's cache; nothing is generated, so no output token)."""
    rendered = []
    for (qid, _), name in zip(call.questions.items(), call.names, strict=True):
        answer = answers.get(qid)
        if qid in refused or answer is None:
            rendered.append({"type": "refusal", "name": name})
        else:
            rendered.append(_answer(call, qid, answer, name))
    return {
        "model": model,
        "answers": rendered,
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens,
        },
    }
