"""A strict client of the System One spec against the real command, ``typevet-async serve``
(a child process) over the real llama.cpp server (Gemma 3 270M): a request as krite-bench sends
one (no ``model``, no key, the gateway run with ``--no-auth``) is answered by the one model
served, and every answer passes a strict schema of the spec's answer (no field beyond the
spec's) and the official client's models."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import aiohttp
import jsonschema
import pytest
from typesafe_sdk._schemas import models

from tests.unit.test_system_one_interop import QUESTIONS, strict_schema

from .test_gateway_live import GatewayProcess

pytestmark = pytest.mark.live


@pytest.fixture
def open_gateway(gemma3_url: str) -> Iterator[GatewayProcess]:
    """``typevet-async serve --no-auth`` over the Gemma server, as krite-bench needs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TYPEVET_")}
    gateway = GatewayProcess(["--base-url", gemma3_url, "--no-auth"], env)
    yield gateway
    gateway.stop()


async def ready(http: aiohttp.ClientSession, url: str) -> str:
    """The served model's name, once the gateway's probe succeeded."""
    for _ in range(600):
        async with http.get(f"{url}/v1/models") as response:
            if response.status == 200:
                name: str = (await response.json())["models"][0]["name"]
                return name
        await asyncio.sleep(0.1)
    raise AssertionError("the gateway never became ready")


@pytest.mark.asyncio
async def test_a_request_without_model_is_answered_by_the_served_model_in_the_spec_shape(
    open_gateway: GatewayProcess,
) -> None:
    gateway = open_gateway
    body: dict[str, Any] = {
        "state": "I was charged twice, please refund me.",
        "questions": QUESTIONS,
    }
    timeout = aiohttp.ClientTimeout(total=300)  # three reads on a loaded machine
    async with aiohttp.ClientSession(timeout=timeout) as http:
        served = await ready(http, gateway.url)
        async with http.post(f"{gateway.url}/v1/systemone", json=body) as response:
            answered = await response.json()
            status = response.status
    assert status == 200, answered
    assert answered["model"] == served
    models.SystemOneResponse.model_validate(answered)
    problems = [
        e.message for e in jsonschema.Draft202012Validator(strict_schema()).iter_errors(answered)
    ]
    assert problems == []
    assert sorted(answer["type"] for answer in answered["answers"].values()) == [
        "choice", "noul", "score",
    ]  # fmt: skip
