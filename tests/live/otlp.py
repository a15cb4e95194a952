"""An OTLP/HTTP trace receiver, written for the tests: it takes what a real server's own
OpenTelemetry exporter sends (vLLM's, started with ``--otlp-traces-endpoint``) and keeps each
span's ids and name, decoded with OpenTelemetry's own protobuf types (``opentelemetry-proto``).

It runs its aiohttp server on a thread of its own, in its own event loop, for the whole test
session (the vLLM server it receives from outlives every test's loop).
"""

from __future__ import annotations

import asyncio
import threading
import time

import attrs
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@attrs.frozen
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, object]


class OtlpReceiver:
    """``POST /v1/traces`` (``application/x-protobuf``) on 127.0.0.1; ``endpoint`` once
    started."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.endpoint = ""
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> str:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)
        self.endpoint = f"http://127.0.0.1:{port}/v1/traces"
        return self.endpoint

    async def _serve(self) -> int:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def _traces(self, request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        received = [
            ReceivedSpan(
                span.name,
                span.trace_id.hex(),
                span.span_id.hex(),
                span.parent_span_id.hex(),
                {kv.key: _value(kv.value) for kv in span.attributes},
            )
            for resource in message.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self._lock:
            self.spans += received
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def wait_for(self, trace_id: str, timeout: float = 30.0) -> list[ReceivedSpan]:
        """The spans of ``trace_id`` received within ``timeout`` seconds (the server's batch
        exporter sends them a moment after the request)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = [span for span in self.spans if span.trace_id == trace_id]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


def _value(value: object) -> object:
    kind = value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(value, kind) if kind else None
