"""A many-option Choice read with two-token codes, against whole-vocabulary reads: how close
the SDK's answer is to the product P(first) x P(second | first) computed from independent
reads of the whole vocabulary, and what each side costs.

The SDK judges a Choice of ``label0`` .. ``label<N-1>`` in reproducible mode (no prompt
cache, one read at a time). Here, with plain urllib and the stdlib ``json``, the codes' tokens
are found by the server's own tokenizer (the prompt tokenized with and without each code) and
every prompt the SDK read is read again over the whole vocabulary (``n_probs`` = 262,144, about
26 MB a read), the prompt cache off. Reported: the largest difference in an option's
probability (the SDK promises 1e-6), the off-menu mass on each side, and the seconds of the
SDK's judgment and of the whole-vocabulary reads. The live test
(tests/live/test_codes_live.py) makes the same check with reads of the top 4,096: the size of
a read does not change an answer, and a 26 MB read costs about twice a top-4,096 one.

    python -m benchmarks.real_answers.measure_codes               # 255 options, embedded server
    python -m benchmarks.real_answers.measure_codes --options 70  # a quick run: two first tokens
    python -m benchmarks.real_answers.measure_codes --url URL     # a running server, slots >= 6,144

It prints one JSON object; exit 1 if the answer is not within 1e-6.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from typing import Any

import anyio

import typevet_async as tv
from tests.live.test_codes_live import product

#: Gemma 3's vocabulary: a whole-vocabulary read asks for all of it.
VOCABULARY = 262_144
#: What the SDK promises of an answer against independent reads of the same prompt.
EQUAL = 1e-6
STATE = {"ticket": "The parcel for order label17 arrived broken; the box was crushed."}


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.loads(response.read())


def whole_vocabulary(url: str, prompt: Any) -> dict[int, float]:
    """Every token's logprob at the end of ``prompt`` (a string, or a string and token ids)."""
    body = {
        "prompt": prompt, "n_predict": 0, "n_probs": VOCABULARY,
        "cache_prompt": False, "post_sampling_probs": False,
    }  # fmt: skip
    entries = post(url, "/completion", body)["completion_probabilities"][0]["top_logprobs"]
    read = {entry["id"]: entry["logprob"] for entry in entries}
    if len(read) != VOCABULARY:
        raise SystemExit(f"a whole-vocabulary read returned {len(read)} entries")
    return read


async def measure(url: str, options: int) -> dict[str, Any]:
    labels = [f"label{index}" for index in range(options)]
    question = tv.Choice(labels, instructions="Which label names the ticket's topic?")
    async with tv.Session.llama_cpp(url, reproducible=True) as session:
        await session.probe()
        started = time.perf_counter()
        judgment = await session.judge(STATE, {"topic": question})
        sdk_s = time.perf_counter() - started
    answer, diagnostics = judgment["topic"], judgment.diagnostics["topic"]
    prompt = diagnostics.prompt
    base = post(url, "/tokenize", {"content": prompt})["tokens"]
    codes: list[tuple[int, int]] = []
    for code in diagnostics.controls:
        tokens = post(url, "/tokenize", {"content": prompt + code})["tokens"]
        if tokens[: len(base)] != base or len(tokens) != len(base) + 2:
            raise SystemExit(f"code {code!r} is not two tokens after the prompt")
        codes.append((tokens[-2], tokens[-1]))
    firsts = list(dict.fromkeys(head for head, _ in codes))
    started = time.perf_counter()
    first = whole_vocabulary(url, prompt)
    after = {head: whole_vocabulary(url, [prompt, head]) for head in firsts}
    whole_s = time.perf_counter() - started
    expected, off_menu = product(codes, first, after)
    probabilities = list(answer.probabilities.values())
    largest = max(abs(a - b) for a, b in zip(probabilities, expected, strict=True))
    figures = {
        "options": options,
        "prompt_tokens": len(base),
        "first_tokens": len(firsts),
        "codes_equal": diagnostics.codes == tuple(codes),
        "sdk_reads": diagnostics.reads,
        "sdk_judgment_s": round(sdk_s, 1),
        "whole_vocabulary_reads": 1 + len(firsts),
        "whole_vocabulary_s": round(whole_s, 1),
        "largest_probability_gap": largest,
        "off_menu_sdk": diagnostics.off_menu_mass,
        "off_menu_whole_vocabulary": off_menu,
    }
    figures["passed"] = bool(figures["codes_equal"]) and largest < EQUAL
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--options",
        type=int,
        default=255,
        help="the Choice's size: past the ~62 single-token controls, at most 255",
    )
    parser.add_argument("--url", help="a running llama.cpp server (else one is started here)")
    args = parser.parse_args()
    if args.url:
        figures = anyio.run(measure, args.url, args.options)
    else:  # the live tests' long server: 2 slots of 6,144 tokens
        server_options = tv.ServerOptions(chat_template="gemma", n_ctx=2 * 6144, n_parallel=2)
        with tv.EmbeddedServer(server_options) as server:
            figures = anyio.run(measure, server.url, args.options)
    print(json.dumps(figures))
    if not figures["passed"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
