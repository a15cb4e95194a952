"""OpenAI's Decisions wire (``POST /v1/decisions``, ``client.decisions.create`` in the
``openai`` package 3.60), both directions, pure: the gateway's side (a request as typed
questions, `request_from_decisions`; a judgment as the response, `response_to_decisions`) and
the client backend's (questions as a request, `request_to_decisions`; a response's answers
checked, `answers_from_decisions`).

- request ``{"model", "input", "questions", "prompt_cache_key"?, "prompt_cache_options"?,
  "safety_identifier"?}``: ``input`` a string or a list of messages (user, developer,
  system, assistant; content a string or text, image and JSON parts) and tool items (function
  and custom tool calls and their outputs, each output naming an earlier call); ``questions``
  1 to 400 of ``predicate`` (a Noul), ``choice`` (2 to 255 values, each a string or a
  boolean, with an optional description) and ``score`` (levels ``{label, description?}``);
  instructions a string or text, image and JSON parts.
- response ``{"model", "answers", "usage"}``: ``answers`` a list in question order, each
  ``{"type": "predicate", "name", "probability"}``, ``{"type": "choice", "name", "choice",
  "confidence", "probabilities": [{"value", "probability"}]}`` (each value as it was sent: a
  boolean stays a boolean), ``{"type": "score", "name", "score", "confidence",
  "probabilities": [{"label", "value", "probability"}]}`` (``value`` the 0-based level,
  ``score`` the expected level) or ``{"type": "refusal", "name"}``; ``usage`` with
  ``input_tokens_details.cached_tokens``.
- validation failure: `DecisionsValidationError` with every problem (``loc``, ``msg``,
  ``type``); the gateway answers 422 in OpenAI's error shape.

Images are read from base64 data URLs only (the gateway fetches no URL); each becomes ``[image
N]`` in the text. The input's images are the judgment's (every question's reads show them,
before the state); a question's own, from its instructions, go with that question's reads
only, after the state, in request order (`DecisionsCall.question_images`). A boolean choice
value is shown to the model as ``true`` / ``false``, so a string ``"true"`` beside the
boolean ``true`` is refused: the model could not tell them apart.
"""

from __future__ import annotations

from typevet_async._core.wires.decisions.answers import (
    DecisionsAnswer,
    answers_from_decisions,
    request_to_decisions,
)
from typevet_async._core.wires.decisions.requests import (
    MAX_CHOICES,
    MAX_QUESTIONS,
    DecisionsCall,
    choice_label,
    request_from_decisions,
)
from typevet_async._core.wires.decisions.responses import refused_questions, response_to_decisions
from typevet_async._errors import DecisionsValidationError

__all__ = [
    "MAX_CHOICES",
    "MAX_QUESTIONS",
    "DecisionsAnswer",
    "DecisionsCall",
    "DecisionsValidationError",
    "answers_from_decisions",
    "choice_label",
    "refused_questions",
    "request_from_decisions",
    "request_to_decisions",
    "response_to_decisions",
]
