"""What a session decides whatever its backend: concurrency, layout, the off-menu guard, caps.

`SessionSettings` is validated once, when it is built (by a factory from its keywords, or by
the caller). A call's overrides become a `ReadOptions` through the same validators.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar, Literal, Self, TypedDict

import attrs

from typevet_async._core.prompts.controls import (
    DEFAULT_CONTROLS,
    Controls,
    NoulControls,
    ScoreControls,
)
from typevet_async._core.prompts.layouts import Layout
from typevet_async._core.statistics.batch_judgments import (
    DEFAULT_BATCH_CALIBRATION,
    DEFAULT_WINDOW,
    BatchCalibration,
    batch_calibration_setting,
    calibration_window,
)
from typevet_async._core.statistics.calibration import CalibrationMap
from typevet_async._core.statistics.content_free import ContentFree, content_free_setting
from typevet_async._core.statistics.fitted_prior import FittedPrior
from typevet_async._errors import ConfigurationError
from typevet_async._options import (
    UNSET,
    Unset,
    boolean,
    callable_or_none,
    non_negative_int,
    one_of,
    optional,
    positive_int,
    positive_number,
    probability_or_none,
    resolve,
    unset_or,
)
from typevet_async._session.images import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGES, Image
from typevet_async._session.read_cache import ReadCache, check_cache

#: A judgment's rotations of the options: one count for every question, or by question id.
Permutations = int | Mapping[str, int]


def _permutations(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, Mapping):
        for question_id, count in value.items():
            if not isinstance(question_id, str):
                raise ConfigurationError(
                    f"{attribute.name} maps question ids to counts, got the key {question_id!r}"
                )
            positive_int(None, attribute, count)
        return
    positive_int(None, attribute, value)


def _calibration(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, CalibrationMap):
        raise ConfigurationError(
            f"{attribute.name} must be a CalibrationMap or None (read a map's file with "
            f"tv.CalibrationMap.from_json), got {type(value).__name__}"
        )


def _prior(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, FittedPrior):
        raise ConfigurationError(
            f"{attribute.name} must be a FittedPrior or None (fit one with Session.fit_prior, "
            f"or read its file with tv.FittedPrior.from_json), got {type(value).__name__}"
        )


def refuse_prior_and_map(prior: FittedPrior | None, calibration: CalibrationMap | None) -> None:
    """A fitted prior and a calibration map are not applied together: each was fitted on the
    answers as read, so neither is fitted on what the other leaves.

    :raises ConfigurationError: both are given.
    """
    if prior is not None and calibration is not None:
        raise ConfigurationError(
            "prior and calibration are both given: a fitted prior and a calibration map are "
            "each fitted on the answers as read, so one cannot follow the other; give one (a "
            "call's calibration=None or prior=None turns the session's off)"
        )


__all__ = [
    "DEFAULT_BATCH_CALIBRATION",
    "DEFAULT_BATCH_CALIBRATION_WINDOW",
    "DEFAULT_CONTENT_FREE",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_NOUL_CONTROLS",
    "DEFAULT_SCORE_CONTROLS",
    "BatchOptions",
    "GenerateKeywords",
    "GenerationKeywords",
    "GenerationOptions",
    "Permutations",
    "PrefixReuse",
    "ReadOptions",
    "SessionSettings",
    "refuse_batch_calibration_with",
    "refuse_prior_and_map",
]

DEFAULT_MAX_CONCURRENCY = 4
#: Tokens a schema-bound generation may produce, unless the session or the call says otherwise.
DEFAULT_MAX_TOKENS = 512

PrefixReuse = Literal["auto", "first", "sequential", "off"]

#: The defaults of the answer methods, from their figures on held-out public data and the
#: shipped tickets (docs/guide/real-answers.md; Qwen2.5 Coder 1.5B): a Noul in words (SST-2:
#: NLL -0.121, accuracy +0.042; shipped refund: NLL 0.476 -> 0.258). A Score stays the plain
#: letter prompt, without a content-free prior: its scale with the prior won SST-5 (NLL -0.107)
#: and lost the shipped urgency (NLL +0.077), a coin flip by data set, not a default. A Choice
#: stays the plain letter prompt (the prior cost AG News 0.051 of NLL, and SST-2 0.006).
DEFAULT_NOUL_CONTROLS: NoulControls = "words"
DEFAULT_SCORE_CONTROLS: ScoreControls = "letters"
DEFAULT_CONTENT_FREE: ContentFree = "off"
#: A stream's warm-up under batch calibration (`typevet_async._core.statistics.batch_judgments`).
DEFAULT_BATCH_CALIBRATION_WINDOW = DEFAULT_WINDOW


def refuse_batch_calibration_with(
    batch_calibration: BatchCalibration, content_free: ContentFree, calibration: Any, prior: Any
) -> None:
    """Batch calibration divides the answers as read: a content-free prior, a calibration
    map or a fitted prior would have changed them first, and which to undo for which would be
    a guess.

    :raises ConfigurationError: batch calibration on with any of them, naming both.
    """
    if batch_calibration == "off":
        return
    if content_free != "off":
        raise ConfigurationError(
            f"batch_calibration='on' and content_free={content_free!r} both divide out a prior: "
            "choose one (content_free='off', or batch_calibration='off')"
        )
    if calibration is not None:
        raise ConfigurationError(
            "batch_calibration='on' and a calibration map (calibration=) both recalibrate the "
            "answers: choose one (calibration=None, or batch_calibration='off')"
        )
    if prior is not None:
        raise ConfigurationError(
            "batch_calibration='on' and a fitted prior (prior=) both divide a prior out of the "
            "answers (a fitted prior is batch calibration kept): choose one (prior=None, or "
            "batch_calibration='off')"
        )


def _layout(value: Any) -> Layout:
    try:
        return Layout(value)
    except ValueError:
        allowed = ", ".join(repr(layout.value) for layout in Layout)
        raise ConfigurationError(f"layout must be one of {allowed}, got {value!r}") from None


@attrs.frozen(kw_only=True)
class SessionSettings:
    """A session's own settings; every field is checked when the record is built.

    :param max_concurrency: requests (reads and generations) in flight to the server at once,
        across every call of the session.
    :param layout: ``"typevet"`` (the default framing), or the Jev gateway's ``"fused"`` or
        ``"split"``.
    :param controls: the default layout's controls: ``"letters"`` (A, B, C, ...; the default,
        measured best on a real instruction model) or ``"digits"`` (0, 1, 2, ...).
    :param noul_controls: how the default layout asks a Noul: ``"letters"`` (``A. No`` /
        ``B. Yes``, "Answer with one letter.") or ``"words"`` (the default: the tokens ``Yes``
        and ``No`` as the model writes them, "Answer Yes or No.").
    :param score_controls: how the default layout asks a Score: ``"letters"`` (the default:
        its levels lettered) or ``"scale"`` (numbered 1..n, lowest first, "Answer with one
        number from 1 to n."; a Score of more than 9 levels stays lettered). A words Noul and a
        scale Score are read in their one order whatever ``permutations`` says (their order is
        their meaning).
    :param content_free: content-free calibration (Zhao et al., ICML 2021) of ``"all"``
        questions (or True), ``"scores"`` only, or ``"off"`` (or False; the default): each
        such question is read once per session on content-free states
        (`CONTENT_FREE_STATES`), the mean of those answers is the question's prior, and every
        answer is divided by it and renormalised; the prior and the undivided probabilities
        are in the diagnostics.
    :param off_menu_threshold: flag answers whose off-menu mass exceeds it (and with
        ``raise_off_menu`` raise `OffMenuError`); a judgment may override both.
    :param max_images: most images one judgment or generation may take; ``max_image_bytes``
        per image.
    :param prefix_reuse: where the backend reuses a cached prefix (llama.cpp), how a
        judgment's questions share it: ``"auto"`` (default) reads the first two alone and goes
        on one at a time if the second came from the server's prompt cache, else reads the rest
        at once; ``"sequential"``, ``"first"`` (first alone, rest at once) and ``"off"`` (all
        at once) force a strategy. The README has the figures.
    :param max_tokens: the token limit of a generation, unless the call gives one.
    :param permutations: read each question under this many cyclic rotations of its option
        order (at most one per option) and average them; a mapping gives counts by question
        id (others: 1). Each rotation is one more read.
    :param label_prior: divide out the positions' prior, estimated from each question's own
        rotations, before averaging (a question read under rotations needs all of them).
    :param calibration: a fitted `CalibrationMap` applied to every judgment's answers (it
        must have been fitted for this model, template family, server kind and questions).
    :param batch_calibration: ``"on"`` (or True): `Session.judge_many` divides each
        question's batch prior (the mean of its answers over the batch, Zhou et al., ICLR
        2024) out of every answer, with no extra read; a list or tuple of records is divided
        whole once judged, any other input after a warm-up of ``batch_calibration_window``
        records by the running prior. ``"off"`` (or False; the default) leaves the answers as
        read. Not with ``content_free`` or ``calibration`` (refused here and at the call).
    :param batch_calibration_window: a stream's warm-up, in records (at least
        `MIN_BATCH_ITEMS`): held until it fills, then divided by its own prior.
    :param prior: a `FittedPrior` (`Session.fit_prior`) divided out of every judgment's
        answers (pinned as a map is); not with ``calibration``, nor on a question that
        ``content_free`` divides.
    :param cache: a read cache (`MemoryReadCache`, `SqliteReadCache` or any `ReadCache`):
        each read is looked up by everything that decides its bytes before it is sent, and
        stored once validated; identical reads in flight at once are sent once. None (the
        default): every read is sent. The session never closes it (its owner does).
    """

    max_concurrency: int = attrs.field(default=DEFAULT_MAX_CONCURRENCY, validator=positive_int)
    layout: Layout = attrs.field(default=Layout.TYPEVET, converter=_layout)
    controls: Controls = attrs.field(default=DEFAULT_CONTROLS, validator=one_of(Controls))
    noul_controls: NoulControls = attrs.field(
        default=DEFAULT_NOUL_CONTROLS, validator=one_of(NoulControls)
    )
    score_controls: ScoreControls = attrs.field(
        default=DEFAULT_SCORE_CONTROLS, validator=one_of(ScoreControls)
    )
    content_free: ContentFree = attrs.field(
        default=DEFAULT_CONTENT_FREE, converter=content_free_setting
    )
    off_menu_threshold: float | None = attrs.field(default=None, validator=probability_or_none)
    raise_off_menu: bool = attrs.field(default=False, validator=boolean)
    max_images: int = attrs.field(default=DEFAULT_MAX_IMAGES, validator=positive_int)
    max_image_bytes: int = attrs.field(default=DEFAULT_MAX_IMAGE_BYTES, validator=positive_int)
    prefix_reuse: PrefixReuse = attrs.field(default="auto", validator=one_of(PrefixReuse))
    max_tokens: int = attrs.field(default=DEFAULT_MAX_TOKENS, validator=positive_int)
    permutations: Permutations = attrs.field(default=1, validator=_permutations)
    label_prior: bool = attrs.field(default=False, validator=boolean)
    calibration: CalibrationMap | None = attrs.field(default=None, validator=_calibration)
    prior: FittedPrior | None = attrs.field(default=None, validator=_prior)
    cache: ReadCache | None = attrs.field(default=None, validator=check_cache)
    batch_calibration: BatchCalibration = attrs.field(
        default=DEFAULT_BATCH_CALIBRATION, converter=batch_calibration_setting
    )
    batch_calibration_window: int = attrs.field(
        default=DEFAULT_BATCH_CALIBRATION_WINDOW, validator=calibration_window
    )

    def __attrs_post_init__(self) -> None:
        refuse_batch_calibration_with(
            self.batch_calibration, self.content_free, self.calibration, self.prior
        )
        refuse_prior_and_map(self.prior, self.calibration)

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any]) -> SessionSettings:
        """The settings a factory's ``**settings`` name; an unknown name is refused."""
        known = {field.name for field in attrs.fields(cls)}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise ConfigurationError(
                f"unknown session setting(s) {unknown}; the settings are {sorted(known)}"
            )
        return cls(**keywords)

    def with_keywords(
        self, keywords: Mapping[str, Any], *, fixed: Mapping[str, str] | None = None
    ) -> SessionSettings:
        """These settings with others by name (`from_keywords`' rules); ``fixed`` maps the
        settings that may not be given to where they come from."""
        for name, source in (fixed or {}).items():
            if name in keywords:
                raise ConfigurationError(f"{name} comes from {source} here, not a keyword")
        return SessionSettings.from_keywords({**attrs.asdict(self, recurse=False), **keywords})


@attrs.frozen(kw_only=True)
class _CallOptions:
    """A call's own settings, checked by the same validators as the session's."""

    #: Which of the call's options fall back to which session setting when left `UNSET`.
    _session_fields: ClassVar[Mapping[str, str]] = {}

    #: `UNSET`: the backend's retry policy.
    max_retries: int | Unset = attrs.field(default=UNSET, validator=unset_or(non_negative_int))
    #: Seconds for the whole call (a judgment: probe included); None: no deadline.
    timeout: float | None = attrs.field(default=None, validator=optional(positive_number))

    @classmethod
    def for_call(cls, settings: SessionSettings, **given: Any) -> Self:
        """The call's options, each `UNSET` one replaced by the session's setting."""
        resolved = {
            name: resolve(value, getattr(settings, cls._session_fields[name]))
            if name in cls._session_fields
            else value
            for name, value in given.items()
        }
        return cls(**resolved)


@attrs.frozen(kw_only=True)
class ReadOptions(_CallOptions):
    """One judgment's settings."""

    _session_fields: ClassVar[Mapping[str, str]] = {
        "off_menu_threshold": "off_menu_threshold",
        "raise_off_menu": "raise_off_menu",
        "permutations": "permutations",
        "label_prior": "label_prior",
        "calibration": "calibration",
        "prior": "prior",
    }

    off_menu_threshold: float | None = attrs.field(validator=probability_or_none)
    raise_off_menu: bool = attrs.field(validator=boolean)
    permutations: Permutations = attrs.field(default=1, validator=_permutations)
    label_prior: bool = attrs.field(default=False, validator=boolean)
    calibration: CalibrationMap | None = attrs.field(default=None, validator=_calibration)
    prior: FittedPrior | None = attrs.field(default=None, validator=_prior)

    def __attrs_post_init__(self) -> None:
        refuse_prior_and_map(self.prior, self.calibration)

    def for_priors(self, question_ids: Collection[str]) -> ReadOptions:
        """The options the content-free priors of ``question_ids`` are read under: each
        question's rotations and label prior as here (the counts of the other questions left
        out), no calibration map or fitted prior, and no off-menu guard, which judges the
        answer to the state (a prior's off-menu mass is reported in that answer's
        diagnostics)."""
        permutations = self.permutations
        if isinstance(permutations, Mapping):
            permutations = {qid: n for qid, n in permutations.items() if qid in question_ids}
        return attrs.evolve(
            self,
            off_menu_threshold=None,
            raise_off_menu=False,
            permutations=permutations,
            calibration=None,
            prior=None,
        )


@attrs.frozen(kw_only=True)
class GenerationOptions(_CallOptions):
    """One generation call's settings."""

    _session_fields: ClassVar[Mapping[str, str]] = {
        "max_tokens": "max_tokens",
        "max_in_flight": "max_concurrency",
    }

    max_tokens: int = attrs.field(validator=positive_int)
    #: This call's generations in flight at once (the session's ``max_concurrency`` holds too).
    max_in_flight: int = attrs.field(validator=positive_int)
    #: Each failure in its place, instead of raising the first.
    return_exceptions: bool = attrs.field(default=False, validator=boolean)


class GenerateKeywords(TypedDict, total=False):
    """The keywords of `Session.generate` besides ``schema``."""

    images: Image | Sequence[Image]
    max_tokens: int | Unset
    timeout: float | None
    model: str | None
    max_retries: int | Unset


class GenerationKeywords(GenerateKeywords, total=False):
    """The keywords of `Session.generate_many` besides ``schema`` and ``return_exceptions``."""

    max_in_flight: int | Unset


@attrs.frozen(kw_only=True)
class BatchOptions:
    """One `judge_many` call's bounds: the session's, where the call leaves them `UNSET`."""

    #: Records being judged at once (their reads share the session's ``max_concurrency``).
    max_in_flight: int = attrs.field(validator=positive_int)
    #: Records in flight or waiting to be yielded (the reorder buffer); at least
    #: ``max_in_flight``, by default 4 times it.
    window: int = attrs.field(validator=positive_int)
    #: Yield in input order (else as completed); raise the first error item (else yield it).
    ordered: bool = attrs.field(default=True, validator=boolean)
    fail_fast: bool = attrs.field(default=False, validator=boolean)
    #: Called with each `Progress` (typed loosely: `_session.batch` imports this module).
    on_progress: Callable[[Any], None] | None = attrs.field(
        default=None, validator=callable_or_none
    )
    #: Divide out each question's batch prior, and a stream's warm-up (in records).
    batch_calibration: BatchCalibration = attrs.field(
        default=DEFAULT_BATCH_CALIBRATION, converter=batch_calibration_setting
    )
    batch_calibration_window: int = attrs.field(
        default=DEFAULT_BATCH_CALIBRATION_WINDOW, validator=calibration_window
    )

    def __attrs_post_init__(self) -> None:
        if self.window < self.max_in_flight:
            raise ConfigurationError(
                f"window must be >= max_in_flight ({self.max_in_flight}), got {self.window!r}"
            )

    @classmethod
    def for_call(
        cls,
        settings: SessionSettings,
        *,
        max_in_flight: int | Unset,
        window: int | Unset,
        batch_calibration: BatchCalibration | bool | Unset = UNSET,
        **flags: Any,
    ) -> BatchOptions:
        """The call's bounds (``flags``: ``ordered``, ``fail_fast``, ``on_progress``)."""
        in_flight = resolve(max_in_flight, settings.max_concurrency)
        default_window = 4 * in_flight if isinstance(in_flight, int) else in_flight
        return cls(
            max_in_flight=in_flight,
            window=resolve(window, default_window),
            batch_calibration=resolve(batch_calibration, settings.batch_calibration),
            batch_calibration_window=settings.batch_calibration_window,
            **flags,
        )
