"""The System One answer, declared once: each answer type's fields in wire order, what kind of
value each holds and what it means. Everything that writes or reads an answer is built from
this declaration:

- the response renderer (`typevet_async._core.wires.system_one.responses`) writes the wire fields in
  this order;
- the System One backend's msgspec decoders (`typevet_async._backends.system_one_wire`) read
  the fields marked ``read`` (what the answer check needs, and the server's confidence);
- MCP's result types (`typevet_async._apps.mcp.tools`) are every field, the wire's and MCP's own
  extras, with these descriptions (the tools' output schemas);
- Ray's Arrow types (`typevet_async._apps.ray.answer_type`) are the wire fields, a Choice's and a
  Score's probabilities and legend a struct over the question's own options.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import attrs

__all__ = ["ANSWER_FIELDS", "USAGE_FIELDS", "AnswerField", "Value", "wire_fields"]


class Value(enum.Enum):
    """What an answer field holds."""

    #: The answer's type, ``"noul"``, ``"choice"`` or ``"score"`` (the union's tag).
    TAG = "tag"
    #: A probability in [0, 1].
    PROBABILITY = "probability"
    #: A probability, or null when the server cannot tell.
    PROBABILITY_OR_NULL = "probability_or_null"
    #: A real number (an expected level).
    NUMBER = "number"
    #: One of the question's labels.
    LABEL = "label"
    #: A probability per option: by label (a Choice), ``"false"``/``"true"`` (a Noul) or level
    #: index ``"0"``, ``"1"``, ... (a Score).
    PROBABILITIES = "probabilities"
    #: A Score's level descriptions by level index.
    LEGEND = "legend"
    #: A token count.
    COUNT = "count"


@attrs.frozen
class AnswerField:
    """One field of an answer (or of the usage)."""

    name: str
    value: Value
    description: str
    #: On System One's wire (False: one of MCP's extras, which its tools add). The wire's
    #: answers hold exactly the spec's fields: a strict client of the spec (one whose answer
    #: schema forbids other fields) accepts them; the SDK's own extras ride in the response's
    #: top-level extension (`typevet_async._core.wires.system_one.EXTENSION`).
    wire: bool = True
    #: Read back from a server's response by the System One backend (what the answer check
    #: needs to rebuild and check the answer).
    read: bool = False


_CONFIDENCE: Final = {
    "noul": "System One's reference confidence over (false, true): |2 noul - 1|",
    "choice": "System One's reference confidence: (max p - 1/n) / (1 - 1/n), 0 even, 1 all on "
    "one label",
    "score": "System One's reference confidence: max(0, 1 - sum_i p_i |i - mode| / D), mode the "
    "most probable level, D = sum_i |i - (n-1)/2| / n (that distance for the even distribution)",
}
_ENTROPY: Final = (
    "1 - the normalised entropy of probabilities, 1 - H(p) / ln(n): 1 all on one option, 0 even "
    "(this SDK's own measure; an extension)"
)
_OFF_MENU: Final = (
    "the next-token probability on none of the options (1 - their summed probability); "
    "null when the server cannot tell"
)


def _tag(kind: str) -> AnswerField:
    return AnswerField("type", Value.TAG, f'"{kind}"', read=True)


def _mcp_extras() -> tuple[AnswerField, ...]:
    return (AnswerField("off_menu_mass", Value.PROBABILITY_OR_NULL, _OFF_MENU, wire=False),)


#: Each answer type's fields, in wire order (MCP's extras last).
ANSWER_FIELDS: Final[Mapping[str, tuple[AnswerField, ...]]] = {
    "noul": (
        _tag("noul"),
        AnswerField(
            "noul", Value.PROBABILITY, "P(true): the probability that the answer is yes", read=True
        ),
        AnswerField("confidence", Value.PROBABILITY, _CONFIDENCE["noul"], wire=False),
        AnswerField("x_entropy_confidence", Value.PROBABILITY, _ENTROPY, wire=False),
        AnswerField(
            "probabilities",
            Value.PROBABILITIES,
            '{"false": p, "true": p}, summing to 1',
            wire=False,
        ),
        *_mcp_extras(),
    ),
    "choice": (
        _tag("choice"),
        AnswerField("choice", Value.LABEL, "the most probable label (ties: the first)", read=True),
        AnswerField("confidence", Value.PROBABILITY, _CONFIDENCE["choice"], read=True),
        AnswerField(
            "probabilities",
            Value.PROBABILITIES,
            "every label's probability, in the options' order, summing to 1",
            read=True,
        ),
        AnswerField("x_entropy_confidence", Value.PROBABILITY, _ENTROPY, wire=False),
        *_mcp_extras(),
    ),
    "score": (
        _tag("score"),
        AnswerField(
            "score",
            Value.NUMBER,
            "the expected level, sum of i * p(i): 0 is the first level",
            read=True,
        ),
        AnswerField("confidence", Value.PROBABILITY, _CONFIDENCE["score"], read=True),
        AnswerField("legend", Value.LEGEND, 'level index ("0", "1", ...) -> level'),
        AnswerField(
            "probabilities",
            Value.PROBABILITIES,
            'each level\'s probability by index ("0", "1", ...), summing to 1',
            read=True,
        ),
        AnswerField("x_entropy_confidence", Value.PROBABILITY, _ENTROPY, wire=False),
        *_mcp_extras(),
    ),
}

#: A response's usage.
USAGE_FIELDS: Final = (
    AnswerField("input_tokens", Value.COUNT, "prompt tokens evaluated for every read", read=True),
    AnswerField("output_tokens", Value.COUNT, "always 0: no token is generated"),
)


#: Each answer type's fields on System One's wire, in order (worked out once: the gateway
#: renders every answer through them).
_WIRE_FIELDS: Final = {
    kind: tuple(field for field in fields if field.wire) for kind, fields in ANSWER_FIELDS.items()
}


def wire_fields(kind: str) -> tuple[AnswerField, ...]:
    """An answer type's fields on System One's wire, in order."""
    return _WIRE_FIELDS[kind]
