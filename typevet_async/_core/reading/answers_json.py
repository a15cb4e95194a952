"""One cattrs converter between judgments and the SDK's own JSON: every field of the answer,
usage and diagnostics records (`tv.judgment_to_json`, the command line's judge output). It is
not System One's wire, whose answer shape is declared once in
`typevet_async._core.wires.system_one.schema` and rendered there::

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

from typevet_async._core.prompts.questions import Question
from typevet_async._core.reading import answers
from typevet_async._core.reading.answers import Answer, Diagnostics, Judgment, Usage
from typevet_async._core.wires.system_one import question_from_system_one, questions_from_system_one

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
# The System One ``questions`` shape (`typevet_async._core.wires.system_one` owns it), as the CLI
# and
# the gateway read it:
#   {"questions": {"refund": {"type": "noul", "instructions": "..."},
#                  "route": {"type": "choice", "instructions": "...",
#                            "criteria": {"billing": "Money matters", "shipping": null}},
#                  "urgency": {"type": "score", "instructions": "...", "criteria": ["low", ...]}}}


def question_from_json(data: Any, question_id: str = "?") -> Question:
    """One question from its System One JSON; a bad one raises `QuestionError` naming
    ``question_id``. A Score's old ``levels`` key is read with a `DeprecationWarning`."""
    return question_from_system_one(data, question_id)


def questions_from_json(data: Any) -> dict[str, Question]:
    """``{"questions": {id: question}}`` (or the inner mapping) to questions, in order."""
    return questions_from_system_one(data)
