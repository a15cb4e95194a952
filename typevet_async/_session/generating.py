"""The generation pipeline: check every prompt and the schema, generate under the caps, parse
and validate each output on the client (server grammars do not enforce every keyword).

A generation that outlives ``request_timeout`` fails once: sent again it would start from
scratch and take as long again (the backends send it with ``retry_timeouts=False``), so its
`RequestTimeoutError` says so and how to allow it longer. Its other transient failures are
retried as a scoring read's are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from jsonschema import Draft202012Validator

from typevet_async._backends.base import Backend
from typevet_async._concurrency.fanout import gather_in_order, gather_settled
from typevet_async._core.generation.records import Generation, GenerationRequest, interpret_output
from typevet_async._core.generation.schemas import check_schema
from typevet_async._core.wires.jsonvalues import check_text
from typevet_async._errors import InvalidInputError, RequestTimeoutError, TypevetError
from typevet_async._session.fair_slots import SlotShare
from typevet_async._session.images import Image, check_images
from typevet_async._session.settings import GenerationOptions, SessionSettings

__all__ = ["checked_prompts", "generate_in_order", "generate_settled", "plan_generations"]


def plan_generations(
    backend: Backend,
    settings: SessionSettings,
    prompts: Sequence[str],
    schema: Any,
    images: Image | Sequence[Image],
    options: GenerationOptions,
) -> tuple[list[GenerationRequest], Draft202012Validator]:
    """Every prompt's request and the schema's validator, or the error that refuses the call
    unsent.

    :raises SchemaError: the schema is malformed or needs a remote document.
    :raises InvalidInputError: no prompts, an empty prompt, images the backend's generation
        does not take or the session's caps refuse.
    """
    if not backend.capabilities.generation:
        raise InvalidInputError(
            f"{type(backend).__name__} has no schema-bound generation; nothing was sent"
        )
    validator = check_schema(schema)
    if isinstance(prompts, str):
        raise InvalidInputError("prompts must be a sequence of strings, not one string")
    prompts = list(prompts)
    if not prompts:
        raise InvalidInputError("prompts is empty")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInputError(f"prompt {index} must be a non-empty string")
    checked = check_images(
        images, max_images=settings.max_images, max_bytes=settings.max_image_bytes
    )
    if checked and not backend.capabilities.generation_images:
        raise InvalidInputError(
            f"{type(backend).__name__} generation does not take images; nothing was sent"
        )
    requests = [
        GenerationRequest(prompt, schema, checked, options.max_tokens) for prompt in prompts
    ]
    return requests, validator


def _generator(
    backend: Backend,
    slots: SlotShare,
    validator: Draft202012Validator,
    options: GenerationOptions,
) -> Callable[[GenerationRequest], Awaitable[Generation]]:
    call_slots = asyncio.Semaphore(options.max_in_flight)

    async def one(request: GenerationRequest) -> Generation:
        async with call_slots, slots:
            try:
                output = await backend.generate(request, max_retries=options.max_retries)
            except RequestTimeoutError as error:
                raise RequestTimeoutError(
                    f"the generation outlived request_timeout and was not retried (it would "
                    f"start again from scratch): {error}. Allow it longer with "
                    f"http=tv.HttpSettings(request_timeout=...) (or TYPEVET_REQUEST_TIMEOUT, "
                    f"--request-timeout), or "
                    f"ask for fewer tokens with max_tokens= ({request.max_tokens} here)"
                ) from None
        return interpret_output(output, validator)

    return one


def _tag(error: TypevetError, index: int) -> None:
    error.prompt_index = index


async def generate_in_order(
    backend: Backend,
    slots: SlotShare,
    requests: list[GenerationRequest],
    validator: Draft202012Validator,
    options: GenerationOptions,
) -> list[Generation]:
    """One generation per request, in request order, at most ``options.max_in_flight`` of this
    call and the session's ``slots`` at once; the first failure (in request order) is raised
    and the rest are cancelled."""
    one = _generator(backend, slots, validator, options)
    return await gather_in_order(requests, one, tag=_tag)


async def generate_settled(
    backend: Backend,
    slots: SlotShare,
    requests: list[GenerationRequest],
    validator: Draft202012Validator,
    options: GenerationOptions,
) -> list[Generation | TypevetError]:
    """As `generate_in_order`, but every request runs and each failure takes its place."""
    one = _generator(backend, slots, validator, options)
    return await gather_settled(requests, one, tag=_tag)


def checked_prompts(prompts: Any) -> Sequence[str]:
    """``prompts`` as a list once each string in it can be sent (the rest of the checks are
    `plan_generations`'); nothing is sent before this passes."""
    if isinstance(prompts, str):
        raise InvalidInputError("prompts must be a sequence of strings, not one string")
    if not isinstance(prompts, Iterable):
        raise InvalidInputError(
            f"prompts must be a sequence of strings, got {type(prompts).__name__}"
        )
    listed = list(prompts)
    for index, prompt in enumerate(listed):
        if isinstance(prompt, str):
            check_text(prompt, f"prompt {index}")
    return listed
