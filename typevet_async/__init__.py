"""typevet_async: typed questions to language-model servers, typed answers with probabilities.

import typevet_async as tv

async with tv.Session.local() as session:
    judgment = await session.judge(ticket, {"refund": tv.Noul(instructions="Refund?")})
    judgment["refund"].noul

``__all__`` is the public surface; every module under this package is private (its name starts
with an underscore, or it sits in ``_core`` or ``_backends``).

``tv.RayJudge`` (batches on Ray Data, the ``ray`` extra), ``tv.evaluate`` and
``tv.Evaluation`` (labelled evaluation and calibration fitting, the ``eval`` extra: numpy,
scipy, matplotlib, jinja2) are public too, but loaded only when first named, so importing the
SDK never imports Ray or the plotting stack; they are not in ``__all__`` (a star import would
load them). Without the extra, naming one raises ImportError saying which
``pip install 'typevet_async[...]'`` to run.
"""

import typing as _typing

from typevet_async._backends.base import (
    AnswerTokenizing,
    Backend,
    BatchJudging,
    Capabilities,
    Framing,
    ReadIdentifying,
    RemoteJudging,
)
from typevet_async._backends.embedded import EmbeddedServer, ServerOptions
from typevet_async._backends.fleet import AsyncFleet
from typevet_async._backends.http import HttpSettings
from typevet_async._backends.llama_cpp import AsyncLlamaCpp, LlamaCppConfig
from typevet_async._backends.local_models import LOCAL_MODELS, LocalModel, cache_dir, ensure_model
from typevet_async._backends.openai_compatible import AsyncOpenAICompatible, OpenAICompatibleConfig
from typevet_async._backends.openai_decisions import AsyncOpenAIDecisions, OpenAIDecisionsConfig
from typevet_async._backends.retrying import RetryPolicy
from typevet_async._backends.system_one import AsyncSystemOne, SystemOneConfig
from typevet_async._backends.vllm import AsyncVllm, VllmConfig
from typevet_async._core.generation.records import ChatOutput, Generation, GenerationRequest
from typevet_async._core.prompts.framing import TemplateFamily
from typevet_async._core.prompts.layouts import JEV_SYSTEM_PROMPT, Layout, Message
from typevet_async._core.prompts.questions import Choice, Noul, Question, Score
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.answers import (
    Answer,
    ChoiceAnswer,
    Diagnostics,
    Judgment,
    NoulAnswer,
    ScoreAnswer,
    Usage,
)
from typevet_async._core.reading.answers_json import (
    converter,
    judgment_from_json,
    judgment_to_json,
    questions_from_json,
)
from typevet_async._core.reading.batch_records import BatchItem, Progress
from typevet_async._core.reading.chat_reads import ChatServer
from typevet_async._core.reading.probe import Probe
from typevet_async._core.reading.readings import CandidateRead
from typevet_async._core.statistics.batch_calibration import BatchPrior
from typevet_async._core.statistics.calibration import CalibrationMap, Pins, Reading
from typevet_async._core.statistics.fitted_prior import FittedPrior
from typevet_async._core.statistics.read_plan import ReadPlan
from typevet_async._errors import (
    BackendError,
    BadEncodingError,
    BatchRecordError,
    BodyTooLargeError,
    BudgetExceededError,
    CalibrationError,
    CandidateMissingError,
    ConfigurationError,
    ControlTokenError,
    DeadlineExceededError,
    DecisionsValidationError,
    DecodeError,
    GenerationError,
    InvalidInputError,
    InvalidLogprobsError,
    LogprobsUnavailableError,
    ModelIntegrityError,
    OffMenuError,
    OutputValidationError,
    PromptTooLongError,
    ProtocolError,
    QuestionError,
    RefusalError,
    RequestTimeoutError,
    SchemaError,
    ServerError,
    SessionStateError,
    SystemOneValidationError,
    TooManyOptionsError,
    TransportError,
    TruncatedOutputError,
    TypevetError,
    UnsupportedTemplateError,
)
from typevet_async._options import UNSET, Unset
from typevet_async._session.batch import BatchStream
from typevet_async._session.images import Image
from typevet_async._session.read_cache import MemoryReadCache, ReadCache, SqliteReadCache
from typevet_async._session.session import Session
from typevet_async._session.settings import SessionSettings
from typevet_async._version import __version__ as __version__

if _typing.TYPE_CHECKING:
    from typevet_async._apps.evaluation.evaluate import evaluate as evaluate
    from typevet_async._apps.evaluation.evaluation import Evaluation as Evaluation
    from typevet_async._apps.ray import RayJudge as RayJudge


#: Public names loaded when first named, from the module of an optional extra.
_LAZY = {
    "RayJudge": ("typevet_async._apps.ray", "ray"),
    "evaluate": ("typevet_async._apps.evaluation.evaluate", "eval"),
    "Evaluation": ("typevet_async._apps.evaluation.evaluation", "eval"),
}


def __getattr__(name: str) -> _typing.Any:
    """``RayJudge`` (the ``ray`` extra), ``evaluate`` and ``Evaluation`` (the ``eval``
    extra), imported when first named (not cached here: ``vars(tv)`` stays ``__all__``)."""
    if name in _LAZY:
        import importlib

        module, extra = _LAZY[name]
        try:
            return getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as error:
            raise ImportError(
                f"tv.{name} needs {error.name}: pip install 'typevet_async[{extra}]'"
            ) from error
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "JEV_SYSTEM_PROMPT",
    "LOCAL_MODELS",
    "UNSET",
    "Answer",
    "AnswerTokenizing",
    "AsyncFleet",
    "AsyncLlamaCpp",
    "AsyncOpenAICompatible",
    "AsyncOpenAIDecisions",
    "AsyncSystemOne",
    "AsyncVllm",
    "Backend",
    "BackendError",
    "BadEncodingError",
    "BatchItem",
    "BatchJudging",
    "BatchPrior",
    "BatchRecordError",
    "BatchStream",
    "BodyTooLargeError",
    "BudgetExceededError",
    "CalibrationError",
    "CalibrationMap",
    "CandidateMissingError",
    "CandidateRead",
    "Capabilities",
    "ChatOutput",
    "ChatServer",
    "Choice",
    "ChoiceAnswer",
    "ConfigurationError",
    "ControlTokenError",
    "DeadlineExceededError",
    "DecisionsValidationError",
    "DecodeError",
    "Diagnostics",
    "EmbeddedServer",
    "FittedPrior",
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
    "LocalModel",
    "LogprobsUnavailableError",
    "MemoryReadCache",
    "Message",
    "ModelIntegrityError",
    "Noul",
    "NoulAnswer",
    "OffMenuError",
    "OpenAICompatibleConfig",
    "OpenAIDecisionsConfig",
    "OutputValidationError",
    "Pins",
    "Probe",
    "Progress",
    "PromptTooLongError",
    "ProtocolError",
    "Question",
    "QuestionError",
    "ReadCache",
    "ReadIdentifying",
    "ReadPlan",
    "Reading",
    "RefusalError",
    "RemoteJudging",
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
    "SqliteReadCache",
    "SystemOneConfig",
    "SystemOneValidationError",
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
