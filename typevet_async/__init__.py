"""typevet_async: typed questions to language-model servers, typed answers with probabilities.

import typevet_async as tv

async with tv.Session.local() as session:
    judgment = await session.judge(ticket, {"refund": tv.Noul(instructions="Refund?")})
    judgment["refund"].noul

``__all__`` is the public surface; every module under this package is private (its name starts
with an underscore, or it sits in ``_core`` or ``_backends``).
"""

from typevet_async._backends.base import Backend, Capabilities, Framing
from typevet_async._backends.embedded import EmbeddedServer, ServerOptions, cache_dir, ensure_model
from typevet_async._backends.http import HttpSettings, RetryPolicy
from typevet_async._backends.llama_cpp import AsyncLlamaCpp, LlamaCppConfig
from typevet_async._backends.vllm import AsyncVllm, VllmConfig
from typevet_async._batch import BatchItem, BatchStream, Progress
from typevet_async._convert import (
    converter,
    judgment_from_json,
    judgment_to_json,
    questions_from_json,
)
from typevet_async._core.answers import (
    Answer,
    ChoiceAnswer,
    Diagnostics,
    Judgment,
    NoulAnswer,
    ScoreAnswer,
    Usage,
)
from typevet_async._core.framing import TemplateFamily
from typevet_async._core.generation import ChatOutput, Generation, GenerationRequest
from typevet_async._core.layouts import JEV_SYSTEM_PROMPT, Layout, Message
from typevet_async._core.probe import Probe
from typevet_async._core.questions import Choice, Noul, Question, Score
from typevet_async._core.readings import CandidateRead
from typevet_async._core.scoring import ScoringRequest
from typevet_async._errors import (
    BackendError,
    BatchRecordError,
    CandidateMissingError,
    ConfigurationError,
    ControlTokenError,
    DeadlineExceededError,
    GenerationError,
    InvalidInputError,
    InvalidLogprobsError,
    OffMenuError,
    OutputValidationError,
    ProtocolError,
    QuestionError,
    RequestTimeoutError,
    SchemaError,
    ServerError,
    SessionStateError,
    TooManyOptionsError,
    TransportError,
    TruncatedOutputError,
    TypevetError,
    UnsupportedTemplateError,
)
from typevet_async._images import Image
from typevet_async._options import UNSET, Unset
from typevet_async._session import Session
from typevet_async._settings import SessionSettings

__version__ = "0.1.0"

__all__ = [
    "JEV_SYSTEM_PROMPT",
    "UNSET",
    "Answer",
    "AsyncLlamaCpp",
    "AsyncVllm",
    "Backend",
    "BackendError",
    "BatchItem",
    "BatchRecordError",
    "BatchStream",
    "CandidateMissingError",
    "CandidateRead",
    "Capabilities",
    "ChatOutput",
    "Choice",
    "ChoiceAnswer",
    "ConfigurationError",
    "ControlTokenError",
    "DeadlineExceededError",
    "Diagnostics",
    "EmbeddedServer",
    "Framing",
    "Generation",
    "GenerationError",
    "GenerationRequest",
    "HttpSettings",
    "Image",
    "InvalidInputError",
    "InvalidLogprobsError",
    "Judgment",
    "Layout",
    "LlamaCppConfig",
    "Message",
    "Noul",
    "NoulAnswer",
    "OffMenuError",
    "OutputValidationError",
    "Probe",
    "Progress",
    "ProtocolError",
    "Question",
    "QuestionError",
    "RequestTimeoutError",
    "RetryPolicy",
    "SchemaError",
    "Score",
    "ScoreAnswer",
    "ScoringRequest",
    "ServerError",
    "ServerOptions",
    "Session",
    "SessionSettings",
    "SessionStateError",
    "TemplateFamily",
    "TooManyOptionsError",
    "TransportError",
    "TruncatedOutputError",
    "TypevetError",
    "Unset",
    "UnsupportedTemplateError",
    "Usage",
    "VllmConfig",
    "cache_dir",
    "converter",
    "ensure_model",
    "judgment_from_json",
    "judgment_to_json",
    "questions_from_json",
]
