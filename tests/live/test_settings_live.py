"""One configuration, three doors, on the real llama.cpp server: the real ``typevet-async
judge`` (a child process) given ``--top-k``, ``--layout`` and ``--request-timeout`` as flags,
and again as ``TYPEVET_*`` variables, sends what they say. A pass-through proxy in front of the
server records each read's body (the replies are the server's) and, for the timeout, holds
each read for longer than the timeout given."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest
from aiohttp import web

from .faults import FaultInjectingProxy
from .helpers import TICKET

pytestmark = [pytest.mark.live, pytest.mark.asyncio]

QUESTION = ["--noul", "refund=Is a refund requested?"]
#: Generous for a loaded machine: the proxy holds each read this long ...
HELD = 6.0
#: ... and the command's request timeout, given as a flag or a variable, is far below it.
TIMEOUT = "1"


class RecordingProxy(FaultInjectingProxy):
    """Passes every request to the real server, keeping each read's body."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.reads: list[dict[str, Any]] = []

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == self.path:
            self.reads.append(json.loads(await request.read()))
        return await super()._handle(request)


async def typevet_async(*args: str, environ: dict[str, str]) -> tuple[int, str, str]:
    """The command as a child process, the test's event loop serving the proxy meanwhile."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TYPEVET_")}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "typevet_async._apps.cli",
        *args,
        env={**base, **environ},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), timeout=300)
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


def as_variables(url: str, **settings: str) -> dict[str, str]:
    return {"TYPEVET_BASE_URL": url} | {f"TYPEVET_{k.upper()}": v for k, v in settings.items()}


async def test_top_k_and_layout_reach_the_wire_as_flags_and_as_variables(gemma3_url: str) -> None:
    async with RecordingProxy(gemma3_url) as proxy:
        flags = ["--base-url", proxy.url, "--top-k", "40", "--layout", "split"]
        runs = {
            "flags": await typevet_async("judge", TICKET, *QUESTION, *flags, environ={}),
            "variables": await typevet_async(
                "judge",
                TICKET,
                *QUESTION,
                environ=as_variables(proxy.url, top_k="40", layout="split"),
            ),
        }
        for door, (code, out, err) in runs.items():
            assert code == 0, (door, err)
            answer = json.loads(out)["answers"]["refund"]
            assert 0.0 <= answer["noul"] <= 1.0, door
        # Each run's first read asks for 40 (the toy model may then escalate past a missing
        # candidate, as it does without the setting).
        assert [read["n_probs"] for read in proxy.reads].count(40) == 2
        assert proxy.reads[0]["n_probs"] == 40
        for read in proxy.reads:
            # The split layout: the evidence alone in a first user message, then the criterion.
            assert '{"evidence":' in read["prompt"]
            assert '{"criterion":' in read["prompt"]
        before = len(proxy.reads)
        # Without them: the default layout and the read size chosen by the menu.
        code, _, err = await typevet_async(
            "judge", TICKET, *QUESTION, "--base-url", proxy.url, environ={}
        )
        assert code == 0, err
        assert proxy.reads[before]["n_probs"] != 40
        assert '{"criterion":' not in proxy.reads[before]["prompt"]


async def test_the_request_timeout_reaches_the_client_as_a_flag_and_as_a_variable(
    gemma3_url: str,
) -> None:
    async with RecordingProxy(gemma3_url) as proxy:
        proxy.delay = HELD  # each read held (the probe's requests are not)
        given = ["--request-timeout", TIMEOUT, "--max-retries", "0"]
        by_flag = await typevet_async(
            "judge", TICKET, *QUESTION, "--base-url", proxy.url, *given, environ={}
        )
        by_variable = await typevet_async(
            "judge",
            TICKET,
            *QUESTION,
            environ=as_variables(proxy.url, request_timeout=TIMEOUT, max_retries="0"),
        )
        for door, (code, _, err) in {"flag": by_flag, "variable": by_variable}.items():
            assert code == 2, (door, err)
            assert "RequestTimeoutError" in err, (door, err)
        assert len(proxy.reads) == 2  # one attempt each: --max-retries 0 reached it too
