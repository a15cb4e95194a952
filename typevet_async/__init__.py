"""typevet_async: typed questions to language-model servers, typed answers with probabilities.

import typevet_async as tv

async with tv.Session.local() as session:
    judgment = await session.judge(ticket, {"refund": tv.Noul(instructions="Refund?")})
    judgment["refund"].noul
"""

from typevet_async.batch import BatchItem, Progress
from typevet_async.convert import (
    converter,
    judgment_from_json,
    judgment_to_json,
    questions_from_json,
)
from typevet_async.core.answers import (
    Answer,
    ChoiceAnswer,
    Diagnostics,
    Judgment,
    NoulAnswer,
    ScoreAnswer,
    Usage,
)
from typevet_async.core.framing import TemplateFamily
from typevet_async.core.generation import Generation
from typevet_async.core.layouts import JEV_SYSTEM_PROMPT, Layout
from typevet_async.core.questions import Choice, Noul, Question, Score
from typevet_async.core.scoring import Probe
from typevet_async.errors import (
    BackendError,
    CandidateMissingError,
    ConfigurationError,
    ControlTokenError,
    DeadlineExceededError,
    GenerationError,
    InvalidInputError,
    InvalidLogprobsError,
    JudgmentTimeoutError,
    OffMenuError,
    OutputValidationError,
    ProtocolError,
    QuestionError,
    ReadTimeoutError,
    SchemaError,
    ServerError,
    SessionStateError,
    TooManyOptionsError,
    TransportError,
    TruncatedOutputError,
    TypevetError,
    UnsupportedTemplateError,
)
from typevet_async.images import Image
from typevet_async.session import Session

__version__ = "0.1.0"

__all__ = [
    "JEV_SYSTEM_PROMPT",
    "Answer",
    "BackendError",
    "BatchItem",
    "CandidateMissingError",
    "Choice",
    "ChoiceAnswer",
    "ConfigurationError",
    "ControlTokenError",
    "DeadlineExceededError",
    "Diagnostics",
    "Generation",
    "GenerationError",
    "Image",
    "InvalidInputError",
    "InvalidLogprobsError",
    "Judgment",
    "JudgmentTimeoutError",
    "Layout",
    "Noul",
    "NoulAnswer",
    "OffMenuError",
    "OutputValidationError",
    "Probe",
    "Progress",
    "ProtocolError",
    "Question",
    "QuestionError",
    "ReadTimeoutError",
    "SchemaError",
    "Score",
    "ScoreAnswer",
    "ServerError",
    "Session",
    "SessionStateError",
    "TemplateFamily",
    "TooManyOptionsError",
    "TransportError",
    "TruncatedOutputError",
    "TypevetError",
    "UnsupportedTemplateError",
    "Usage",
    "converter",
    "judgment_from_json",
    "judgment_to_json",
    "questions_from_json",
]
