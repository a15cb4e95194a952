"""What every backend whose server judges whole judgments shares (System One's
``POST /v1/systemone``, OpenAI's ``POST /v1/decisions``): its settings, its pool, the model it
names, and what such a server does not do.

Each wire keeps its own module (its requests, its replies, its refusals); here is only the
lifecycle and the one rule of which model a request names: the pin, which the server must
list, or else the first model it lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from typevet_async._backends.base import Capabilities
from typevet_async._backends.http import HttpClient, HttpSettings
from typevet_async._core.generation.records import ChatOutput, GenerationRequest
from typevet_async._core.prompts.framing import TemplateFamily
from typevet_async._core.prompts.scoring import ScoringRequest
from typevet_async._core.reading.probe import Probe, check_served_model
from typevet_async._core.reading.readings import CandidateRead
from typevet_async._errors import ConfigurationError
from typevet_async._options import Unset, non_empty_text, optional, url
from typevet_async._redaction import redact, redacted_repr

__all__ = ["RemoteConfig", "RemoteJudge", "remote_capabilities"]


def remote_capabilities(server: str) -> Capabilities:
    """A remote server's capabilities: it frames and reads the questions itself, reuses no
    prefix the session could schedule for, and has no schema-bound generation."""
    return Capabilities(
        server=server,
        framing="remote",
        prefix_reuse=False,
        generation_images=False,
        generation=False,
    )


@attrs.frozen(kw_only=True)
class RemoteConfig:
    """A remote backend's settings; checked when built.

    :param base_url: the server's root (its judging route and ``/v1/models`` are under it).
    :param model: the model every request names; None: the first the server lists.
    """

    base_url: str = attrs.field(validator=url, repr=redacted_repr)
    model: str | None = attrs.field(default=None, validator=optional(non_empty_text))
    http: HttpSettings = attrs.field(factory=HttpSettings)


class RemoteJudge:
    """The shared half of a remote backend: a subclass adds its ``probe`` (through
    `listed_models`) and its ``judge``."""

    #: The wire's name in messages ("System One", "Decisions").
    wire_name: str = "remote"
    _capabilities: Capabilities = remote_capabilities("remote")

    def __init__(self, config: RemoteConfig) -> None:
        self.config = config
        self.http = HttpClient(config.base_url, config.http)
        #: The model requests name: the pin, or the first the probe found listed.
        self._model = config.model

    def __repr__(self) -> str:
        where = redact(self.config.base_url)
        return f"{type(self).__name__}({where!r}, model={self.config.model!r})"

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def model(self) -> str | None:
        return self.config.model

    async def open(self) -> None:
        await self.http.open()

    async def aclose(self) -> None:
        await self.http.aclose()

    def listed_models(self, names: tuple[str, ...]) -> Probe:
        """The probe of a server that lists ``names``: the pin must be among them, else the
        first is named from now on.

        :raises ConfigurationError: the pinned model is not listed, or none is.
        """
        check_served_model(self.config.model, names)
        if not names:
            raise ConfigurationError(f"the {self.wire_name} server lists no model (GET /v1/models)")
        self._model = self.config.model or names[0]
        return Probe(TemplateFamily.REMOTE, "", {}, 0, names)

    def request_model(self, probe: Probe) -> str:
        """The model a request names (the pin, or the first listed)."""
        return self._model or probe.model_ids[0]

    async def read(
        self, request: ScoringRequest, probe: Probe, *, max_retries: int | Unset
    ) -> CandidateRead:
        raise NotImplementedError(f"a {self.wire_name} server judges whole judgments: call judge")

    async def special_runs(self, runs: Sequence[str]) -> None:
        """None: the server frames caller text itself."""
        return None

    async def generate(self, request: GenerationRequest, *, max_retries: int | Unset) -> ChatOutput:
        raise NotImplementedError(f"the {self.wire_name} API has no schema-bound generation")
