"""Parallel schema-bound generation on vLLM at caps 1, 4 and 8: requests per second, and the
ratio to cap 1, in one run over the same prompts.

    python -m benchmarks.scale.bench_vllm_generation --url URL  # a running vLLM server
    python -m benchmarks.scale.bench_vllm_generation            # starts one (tests/live/servers.py)
"""

from __future__ import annotations

import argparse
import time

import anyio

import typevet_async as tv

MODEL = "gemma3-270m"
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "price": {"type": "integer",
                   "minimum": 0, "maximum": 999}},
    "required": ["colour", "price"],
    "additionalProperties": False,
}  # fmt: skip
COLOURS = ["red", "green", "blue"]


def prompts(count: int) -> list[str]:
    return [
        f'Reply in JSON like {{"colour": "red", "price": 12}}. '
        f"The car is {COLOURS[n % 3]} and cost {10 + n} dollars."
        for n in range(count)
    ]


async def run(url: str, count: int) -> None:
    batch = prompts(count)
    rates: dict[int, float] = {}
    async with tv.Session.vllm(url, model=MODEL, max_concurrency=8) as session:
        await session.generate_many(batch[:4], schema=SCHEMA, max_tokens=48)  # warm-up
        for cap in (1, 4, 8):
            started = time.perf_counter()
            results = await session.generate_many(
                batch, schema=SCHEMA, max_tokens=48, max_in_flight=cap, return_exceptions=True
            )
            elapsed = time.perf_counter() - started
            failures = sum(isinstance(r, Exception) for r in results)
            rates[cap] = len(batch) / elapsed
            print(f"cap {cap}: {len(batch)} generations in {elapsed:.1f} s = "
                  f"{rates[cap]:.2f} req/s ({failures} failed)")  # fmt: skip
    for cap in (4, 8):
        print(f"cap {cap} / cap 1: {rates[cap] / rates[1]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url")
    parser.add_argument("--count", type=int, default=24)
    args = parser.parse_args()
    if args.url:
        anyio.run(run, args.url, args.count)
        return
    from tests.live.servers import VllmServerProcess

    with VllmServerProcess("bench-vllm") as server:
        anyio.run(run, server.url, args.count)


if __name__ == "__main__":
    main()
