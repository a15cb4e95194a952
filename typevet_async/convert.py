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

from typevet_async.core.answers import (
    Answer,
    ChoiceAnswer,
    Diagnostics,
    Judgment,
    NoulAnswer,
    ScoreAnswer,
    Usage,
)

__all__ = ["converter", "judgment_from_json", "judgment_to_json"]

_TAGS: dict[type, str] = {NoulAnswer: "noul", ChoiceAnswer: "choice", ScoreAnswer: "score"}

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
