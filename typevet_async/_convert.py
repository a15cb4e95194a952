"""One cattrs converter between judgments and JSON, in the System One answer shape::

    {"answers": {"route": {"type": "choice", "choice": "billing",
                           "probabilities": {"billing": 0.7, ...}, "confidence": 0.4}, ...},
     "usage": {"prompt_tokens": 412, "cached_tokens": 120, "reads": 3},
     "diagnostics": {"route": {"prompt": "...", "token_ids": [...], ...}, ...}}

A Noul answer carries ``"noul"`` (P(true)); a Score answer ``"score"`` and ``"legend"``, with
its probabilities keyed by level (``"0"``, ``"1"``, ... in JSON).
"""

from __future__ import annotations

from typing import Any

import cattrs.preconf.orjson
from cattrs.strategies import configure_tagged_union

from typevet_async._core import answers
from typevet_async._core.answers import Answer, Diagnostics, Judgment, Usage
from typevet_async._core.questions import Choice, Noul, Question, Score
from typevet_async._errors import QuestionError

__all__ = [
    "converter",
    "judgment_from_json",
    "judgment_to_json",
    "question_from_json",
    "questions_from_json",
]

_TAGS: dict[type, str] = {
    answers.NoulAnswer: "noul",
    answers.ChoiceAnswer: "choice",
    answers.ScoreAnswer: "score",
}

#: The converter; ``converter.unstructure(judgment)`` gives the JSON-ready dict.
converter = cattrs.preconf.orjson.make_converter()
configure_tagged_union(Answer, converter, tag_generator=_TAGS.__getitem__, tag_name="type")


def _unstructure_judgment(judgment: Judgment) -> dict[str, Any]:
    return {
        "answers": {qid: converter.unstructure(a, Answer) for qid, a in judgment.answers.items()},
        "usage": converter.unstructure(judgment.usage),
        "diagnostics": {qid: converter.unstructure(d) for qid, d in judgment.diagnostics.items()},
    }


def _structure_judgment(data: Any, _: type) -> Judgment:
    return Judgment(
        converter.structure(data["answers"], dict[str, Answer]),
        converter.structure(data.get("usage", {}), Usage),
        converter.structure(data.get("diagnostics", {}), dict[str, Diagnostics]),
    )


converter.register_unstructure_hook(Judgment, _unstructure_judgment)
converter.register_structure_hook(Judgment, _structure_judgment)


def judgment_to_json(judgment: Judgment) -> bytes:
    return converter.dumps(judgment)


def judgment_from_json(data: bytes | str) -> Judgment:
    return converter.loads(data, Judgment)


# -- questions ----------------------------------------------------------------------------
# The System One ``questions`` shape, as the CLI reads it:
#   {"questions": {"refund": {"type": "noul", "instructions": "..."},
#                  "route": {"type": "choice", "instructions": "...",
#                            "criteria": {"billing": "Money matters", "shipping": null}},
#                  "urgency": {"type": "score", "instructions": "...", "levels": ["low", ...]}}}


def question_from_json(data: Any, question_id: str = "?") -> Question:
    """One question from its JSON; a bad one raises `QuestionError` naming ``question_id``."""
    try:
        if not isinstance(data, dict):
            raise QuestionError(f"a question must be a JSON object, got {data!r}")
        kind = data.get("type")
        if kind == "noul":
            return Noul(instructions=data.get("instructions"), criteria=data.get("criteria"))
        if kind == "choice":
            return Choice(data.get("criteria"), instructions=data.get("instructions"))
        if kind == "score":
            return Score(data.get("levels"), instructions=data.get("instructions"))
        raise QuestionError(f"type must be 'noul', 'choice' or 'score', got {kind!r}")
    except QuestionError as error:
        error.question_id = question_id
        raise


def questions_from_json(data: Any) -> dict[str, Question]:
    """``{"questions": {id: question}}`` (or the inner mapping) to questions, in order."""
    if isinstance(data, dict) and "questions" in data:
        data = data["questions"]
    if not isinstance(data, dict) or not data:
        raise QuestionError("questions must be a non-empty JSON object of id to question")
    return {str(qid): question_from_json(item, str(qid)) for qid, item in data.items()}
