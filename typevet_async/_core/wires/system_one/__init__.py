"""The System One wire (``POST /v1/systemone``), both directions: requests, responses, errors.

Shapes as the official client's models define them (``typesafe_sdk._schemas.models``):

- request ``{"model", "state", "questions", "assets"?}``: ``model`` may be left out where the
  server serves one model, which then answers; ``state`` a string, object or array
  (``document``, the v1 draft's name, is read as ``state``; both at once are refused);
  ``questions`` id -> ``{"type": "noul" | "choice" | "score", "instructions"?, "criteria"?}``
  (a Noul without instructions is asked `NOUL_DEFAULT_INSTRUCTIONS`; a ``box`` question is
  refused with the 422 type ``unsupported``; a question's in-context examples ride in the
  ``x_examples`` extension, `EXAMPLES_FIELD`)
  (a Noul's criteria ``{"true"?, "false"?}``, a Choice's name -> description, a Score's an
  ordered list of level descriptions); ``assets`` placeholder -> ``{"type": "image",
  "format", "data_base64"}``.
- response ``{"model", "answers", "usage": {"input_tokens", "output_tokens"}}``, each answer
  the System One answer of its type, exactly the spec's fields (a strict client, whose answer
  schema allows no other field, accepts it), its ``confidence`` the reference formula's. Our
  richer record rides along at the top level under ``"x_typevet"`` (`EXTENSION`: each answer
  as `tv.judgment_to_json` writes it, with our entropy confidence, our usage and each
  answer's diagnostics), which System One clients ignore: every extension is
  ``x_``-prefixed, as the spec reserves.
- a batch (``POST /v1/systemone/batch``: several states, the same questions, one result or
  error per state): `typevet_async._core.wires.system_one.batch`.
- validation failure: HTTP 422 with ``{"detail": [{"loc", "msg", "type", "input", "ctx"}]}``.

**Structured text.** Instructions and criteria may be a string, an object or an array. A string
is used as it is; any other value is rendered as compact JSON, its keys in the order given,
non-ASCII kept (`render_structured`): the same value always gives the same prompt text. A
Score's legend in the response carries the criteria as they were sent.

**Usage.** ``input_tokens`` is the prompt tokens the server evaluated for every read, cached or
not (what a read costs); ``output_tokens`` is 0: no token is generated, each read is one
forward pass over the prompt.

**Assets.** Each image asset becomes an image of the judgment, in the order its placeholder
first appears (state, then each question's instructions and criteria); the placeholder text
itself is replaced by ``[image N]``. The SDK puts a judgment's images before its state, so an
image is not placed inline where its placeholder stood. An asset no placeholder uses is
refused. A ``multipart/form-data`` request (how the official client sends images: a
``request`` part holding the JSON, whose assets name their ``part``, then one part per image)
is HTTP work, the gateway's (`typevet_async._apps.gateway.multipart`): it turns the parts into JSON
assets and hands the request to `request_from_system_one`.
"""

from __future__ import annotations

from typevet_async._core.wires.system_one.answers import (
    SYSTEM_ONE_SLACK,
    SystemOneAnswer,
    answers_from_system_one,
    rounding_slack,
)
from typevet_async._core.wires.system_one.batch import (
    ADVERTISEMENT,
    BATCH_PATH,
    CALIBRATION_ADVERTISEMENT,
    SystemOneBatch,
    advertisement,
    batch_from_system_one,
    batch_item_error,
    batch_response,
    batch_to_system_one,
    calibration_advertisement,
)
from typevet_async._core.wires.system_one.questions import (
    EXAMPLES_ADVERTISEMENT,
    EXAMPLES_FIELD,
    EXTENSION,
    NOUL_DEFAULT_INSTRUCTIONS,
    UnsupportedQuestionError,
    examples_advertisement,
    question_from_system_one,
    question_to_system_one,
    questions_from_system_one,
    render_structured,
)
from typevet_async._core.wires.system_one.requests import (
    SystemOneCall,
    request_from_system_one,
    request_to_system_one,
    state_problem,
    validation_detail,
)
from typevet_async._core.wires.system_one.responses import (
    answer_fields,
    answer_to_system_one,
    response_to_system_one,
)
from typevet_async._core.wires.system_one.schema import (
    ANSWER_FIELDS,
    USAGE_FIELDS,
    AnswerField,
    Value,
    wire_fields,
)
from typevet_async._errors import SystemOneValidationError

__all__ = [
    "ADVERTISEMENT",
    "ANSWER_FIELDS",
    "BATCH_PATH",
    "CALIBRATION_ADVERTISEMENT",
    "EXAMPLES_ADVERTISEMENT",
    "EXAMPLES_FIELD",
    "EXTENSION",
    "NOUL_DEFAULT_INSTRUCTIONS",
    "SYSTEM_ONE_SLACK",
    "USAGE_FIELDS",
    "AnswerField",
    "SystemOneAnswer",
    "SystemOneBatch",
    "SystemOneCall",
    "SystemOneValidationError",
    "UnsupportedQuestionError",
    "Value",
    "advertisement",
    "answer_fields",
    "answer_to_system_one",
    "answers_from_system_one",
    "batch_from_system_one",
    "batch_item_error",
    "batch_response",
    "batch_to_system_one",
    "calibration_advertisement",
    "examples_advertisement",
    "question_from_system_one",
    "question_to_system_one",
    "questions_from_system_one",
    "render_structured",
    "request_from_system_one",
    "request_to_system_one",
    "response_to_system_one",
    "rounding_slack",
    "state_problem",
    "validation_detail",
    "wire_fields",
]
