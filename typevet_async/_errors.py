"""Every error the SDK raises.

The tree::

    TypevetError
    ├── InvalidInputError (also ValueError)          bad caller input, raised before any request
    │   ├── QuestionError                             a question, or the mapping of questions
    │   │   └── TooManyOptionsError                   more options than single-token controls
    │   ├── SchemaError                               a JSON Schema that is malformed or remote
    │   ├── ConfigurationError                        session settings or TYPEVET_* variables
    │   │   └── CalibrationError                      a map unreadable, or fitted for another run
    │   ├── SystemOneValidationError                  a body without the System One shape (422)
    │   ├── DecisionsValidationError                  a body without the Decisions shape (422)
    │   ├── PromptTooLongError                        a prompt that cannot fit the served context
    │   └── DecodeError                               a served body past its decode budget
    │       ├── BodyTooLargeError                     bytes, compressed or not (413)
    │       ├── BadEncodingError                      a Content-Encoding refused or corrupt (415)
    │       └── BudgetExceededError                   items, depth, parts, frames or CPU (422)
    ├── UnsupportedTemplateError                      served template cannot frame a judgment
    ├── BackendError                                  talking to the server failed
    │   ├── TransportError (also ConnectionError)     refused, reset, disconnected
    │   ├── ServerError                               an HTTP error status (carries status, body)
    │   ├── RequestTimeoutError (also TimeoutError)   one HTTP request outlived request_timeout
    │   ├── LogprobsUnavailableError                  the server gives no logprobs (at the probe)
    │   └── ProtocolError                             the response is not what the protocol says
    │       ├── InvalidLogprobsError                  candidates missing, repeated, non-finite, > 0
    │       │   └── CandidateMissingError             a candidate outside the top-K it may read
    │       └── ControlTokenError                     a control has no token of its own
    ├── GenerationError                               the server's output is empty or not JSON
    │   ├── TruncatedOutputError                      output cut off by the token limit
    │   └── OutputValidationError                     output does not pass the schema
    ├── OffMenuError                                  off-menu mass above the threshold (if asked)
    ├── RefusalError                                  a Decisions server declined questions
    ├── DeadlineExceededError (also TimeoutError)     a call's ``timeout`` passed
    ├── BatchRecordError                              a batch record raised a non-SDK error
    ├── ModelIntegrityError                           a local model's chunk or file fails its sha256
    └── SessionStateError (also RuntimeError)         used before opening or after closing

A `GenerationError` is the client's verdict on what the server sent (checked on the client),
not a failure to talk to it, so it is not a `BackendError`. Errors raised while reading one
question carry its id in ``question_id``; errors of one prompt of a generation carry the
prompt's index in ``prompt_index``.

Every error redacts itself as it is built: its message, every attribute it is given (a body,
a payload, the raw output) and every note pass through `typevet_async._redaction`, so no
API key or URL password reaches ``str``, ``repr``, a traceback or a batch's answers file,
whichever part of the SDK raised it.
"""

from __future__ import annotations

from typing import Any, Literal

from typevet_async._redaction import redact, redact_value

__all__ = [
    "BackendError",
    "BadEncodingError",
    "BatchRecordError",
    "BodyTooLargeError",
    "BudgetExceededError",
    "CalibrationError",
    "CandidateMissingError",
    "ConfigurationError",
    "ControlTokenError",
    "DeadlineExceededError",
    "DecisionsValidationError",
    "DecodeError",
    "GenerationError",
    "InvalidInputError",
    "InvalidLogprobsError",
    "LogprobsUnavailableError",
    "ModelIntegrityError",
    "OffMenuError",
    "OutputValidationError",
    "PromptTooLongError",
    "ProtocolError",
    "QuestionError",
    "RefusalError",
    "RequestTimeoutError",
    "SchemaError",
    "ServerError",
    "SessionStateError",
    "SystemOneValidationError",
    "TooManyOptionsError",
    "TransportError",
    "TruncatedOutputError",
    "TypevetError",
    "UnsupportedTemplateError",
]


class TypevetError(Exception):
    """Base of every error the SDK raises."""

    #: The id of the question being read when the error happened, if any.
    question_id: str | None = None
    #: The index of the prompt being generated when the error happened, if any.
    prompt_index: int | None = None

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact_value(arg) for arg in args))

    def __setattr__(self, name: str, value: Any) -> None:
        # Dunder slots (__cause__, __context__, __traceback__, __notes__) are the
        # interpreter's: only the error's own fields are redacted.
        if not name.startswith("__"):
            value = redact_value(value)
        super().__setattr__(name, value)

    def add_note(self, note: str, /) -> None:
        super().add_note(redact(note))

    def __str__(self) -> str:
        message = super().__str__()
        if self.question_id is not None:
            return f"question {self.question_id!r}: {message}"
        if self.prompt_index is not None:
            return f"prompt {self.prompt_index}: {message}"
        return message


class InvalidInputError(TypevetError, ValueError):
    """The caller's input is not valid; nothing was sent."""


class QuestionError(InvalidInputError):
    """A question (or the mapping of questions) is not valid."""


class TooManyOptionsError(QuestionError):
    """A question has more options than there are single-token controls."""

    def __init__(self, message: str, *, count: int, limit: int) -> None:
        super().__init__(message)
        self.count = count
        self.limit = limit


class SchemaError(InvalidInputError):
    """A JSON Schema is malformed, too deep, or refers to a remote document; nothing was sent."""

    def __init__(self, message: str, *, path: str = "$") -> None:
        super().__init__(message)
        self.path = path


class ConfigurationError(InvalidInputError):
    """A session setting or TYPEVET_* environment variable is not valid."""


class CalibrationError(ConfigurationError):
    """A calibration map that cannot be read, or was not fitted for this judgment: another
    model, template family, server kind, question or way of reading it (nothing was sent)."""


class SystemOneValidationError(InvalidInputError):
    """A request that does not have the System One shape: ``detail`` is the 422 body's list
    (``loc``, ``msg``, ``type``, ``input``, ``ctx``)."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        first = detail[0]
        super().__init__(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
        self.detail = detail


class DecisionsValidationError(InvalidInputError):
    """A request that does not have the OpenAI Decisions shape: ``detail`` lists every problem
    (``loc``, ``msg``, ``type``, ``input``), as `SystemOneValidationError`'s does."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        first = detail[0]
        super().__init__(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
        self.detail = detail


class PromptTooLongError(InvalidInputError):
    """A question's prompt (its state, examples, instructions and options) certainly cannot
    fit the served context, refused before any request: ``prompt_bytes`` of text take at least
    ``min_tokens`` tokens, and a request may hold at most ``context_tokens`` (the prompt and
    the one token read after it)."""

    def __init__(
        self, message: str, *, prompt_bytes: int, min_tokens: int, context_tokens: int
    ) -> None:
        super().__init__(message)
        self.prompt_bytes = prompt_bytes
        self.min_tokens = min_tokens
        self.context_tokens = context_tokens


class DecodeError(InvalidInputError):
    """A body a server was sent that cannot be decoded within its budget (subclasses say
    which way)."""


class BodyTooLargeError(DecodeError):
    """A body (or what it decompresses to) beyond the byte cap."""


class BadEncodingError(DecodeError):
    """A ``Content-Encoding`` not accepted, or a body that is not of its encoding."""


class BudgetExceededError(DecodeError):
    """A body past one of its budget's limits other than bytes; ``limit`` names it."""

    def __init__(
        self, message: str, limit: Literal["items", "depth", "parts", "frames", "cpu"]
    ) -> None:
        super().__init__(message)
        self.limit = limit


class UnsupportedTemplateError(TypevetError):
    """The served chat template cannot frame a judgment: degraded (its turn markers are not
    the served model's special tokens), without turn markers, or moving with the message."""

    def __init__(self, message: str, *, family: str, rendered: str) -> None:
        super().__init__(message)
        self.family = family
        self.rendered = rendered


class BackendError(TypevetError):
    """Talking to the model server failed."""


class TransportError(BackendError, ConnectionError):
    """The connection was refused, reset or dropped."""


class ServerError(BackendError):
    """The server answered with an HTTP error status."""

    def __init__(
        self, message: str, *, status: int, body: str, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        #: Seconds the server asked us to wait (``Retry-After``), if it said.
        self.retry_after = retry_after


class RequestTimeoutError(BackendError, TimeoutError):
    """One HTTP request (sending it and reading the whole response) outlived ``request_timeout``.

    Waiting for a free pooled connection does not count against it.
    """


class ProtocolError(BackendError):
    """The server's response does not have the shape the protocol promises."""

    def __init__(self, message: str, *, payload: Any = None) -> None:
        super().__init__(message)
        self.payload = payload


class LogprobsUnavailableError(BackendError):
    """The server returns no logprobs (or refuses every read that asks for them): typed
    answers cannot be read from it. Raised at the probe, before any question is read."""


class InvalidLogprobsError(ProtocolError):
    """The candidates' logprobs failed validation: the SDK never guesses a missing value."""


class CandidateMissingError(InvalidLogprobsError):
    """``on_missing="error"`` (or ``"exact"`` at a server's ``top_logprobs`` cap): a candidate
    is outside the top-N the read returned."""

    def __init__(self, message: str, *, missing: tuple[int, ...]) -> None:
        super().__init__(message)
        self.missing = missing


class OffMenuError(TypevetError):
    """The off-menu mass exceeded the threshold, and the caller asked for an error."""

    def __init__(self, message: str, *, off_menu_mass: float, threshold: float) -> None:
        super().__init__(message)
        self.off_menu_mass = off_menu_mass
        self.threshold = threshold


class RefusalError(TypevetError):
    """A Decisions server (``Session.openai_decisions``) answered some questions with a
    refusal: ``refused`` names them (in question order) and ``answers`` holds the typed
    answers to the others, checked as any answer is (our gateway refuses where its off-menu
    guard flags the answer)."""

    def __init__(self, message: str, *, refused: tuple[str, ...], answers: Any) -> None:
        super().__init__(message)
        self.refused = refused
        self.answers = answers


class ControlTokenError(ProtocolError):
    """A required control (``A``, ``B``) adds no token of its own at the answer position of the
    served tokenizer (one token, or a lead and one: `typevet_async._core.prompts.controls`)."""


class GenerationError(TypevetError):
    """Schema-bound generation returned nothing usable; ``raw`` is the text the server sent."""

    def __init__(self, message: str, *, raw: str = "", payload: Any = None) -> None:
        super().__init__(message)
        self.raw = raw
        self.payload = payload


class TruncatedOutputError(GenerationError):
    """The output was cut off by the token limit before it was complete."""


class OutputValidationError(GenerationError):
    """The output parsed as JSON but does not pass the schema; ``path`` names where."""

    def __init__(self, message: str, *, raw: str, value: Any, path: str) -> None:
        super().__init__(message, raw=raw, payload=value)
        self.value = value
        self.path = path


class DeadlineExceededError(TypevetError, TimeoutError):
    """A whole call (``judge``, ``generate``, ``generate_many``) outlived its ``timeout``."""


class ModelIntegrityError(TypevetError):
    """A local model's chunk package, or the file assembled from them, fails its size or
    sha256: nothing is written under the model's name; reinstall the package it names."""


class SessionStateError(TypevetError, RuntimeError):
    """The session is not open (never opened, or already closed)."""


class BatchRecordError(TypevetError):
    """Judging one record of a `judge_many` batch raised an exception that is not an SDK error
    (a bug, e.g. a ``KeyError`` from a backend); ``__cause__`` is that exception. The batch
    yields it as that record's error and goes on."""
