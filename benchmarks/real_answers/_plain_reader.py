"""The plain hand-written letter prompt, the reference the real-answer benchmarks measure the
SDK against: the text, the instructions, the options as ``A. label: description`` and "Answer
with one letter." in Qwen's ChatML turn with its default system message (`plain_prompt`), and
its reader, the letters' logprobs from one ``POST /completion`` of llama.cpp (`PlainReader`).

Not a benchmark itself: bench_real_model, bench_public_data and measure_framing use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import aiohttp

import typevet_async as tv

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
PLAIN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def plain_prompt(state: str, question: tv.Question, order: Sequence[int]) -> str:
    options = question.options()
    lines = [state, "", question.instructions]
    for letter, index in zip(LETTERS, order, strict=False):
        option = options[index]
        if isinstance(question, tv.Noul):
            text = "Yes" if option.label == "true" else "No"
        elif isinstance(question, tv.Score):
            text = option.description or option.label
        else:
            text = f"{option.label}: {option.description}" if option.description else option.label
        lines.append(f"{letter}. {text}")
    lines.append("Answer with one letter.")
    user = "\n".join(lines)
    return (
        f"<|im_start|>system\n{PLAIN_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


class PlainReader:
    """The hand-written loop: one ``/completion`` per question, the answer tokens' logprobs
    read from its top 4,096 (the whole vocabulary if one is missing)."""

    def __init__(
        self, url: str, http: aiohttp.ClientSession, vocab: int, *, cache_prompt: bool = True
    ) -> None:
        self.url, self.http, self.vocab, self.cache_prompt = url, http, vocab, cache_prompt
        self._ids: dict[str, int] = {}

    async def token_id(self, text: str) -> int:
        """The one token ``text`` is (an error if it is several)."""
        if text not in self._ids:
            body = {"content": text, "add_special": False}
            async with self.http.post(f"{self.url}/tokenize", json=body) as response:
                (self._ids[text],) = (await response.json())["tokens"]
        return self._ids[text]

    async def read(self, prompt: str, answers: Sequence[str]) -> tuple[list[float], float]:
        """The logprobs of ``answers`` (one token each) after ``prompt``, and the mass off them."""
        ids, top_k = [await self.token_id(answer) for answer in answers], 4096
        while True:
            body = {
                "prompt": prompt,
                "n_predict": 0,
                "n_probs": top_k,
                "cache_prompt": self.cache_prompt,
            }
            async with self.http.post(f"{self.url}/completion", json=body) as response:
                reply = await response.json()
            entries = reply["completion_probabilities"][0]["top_logprobs"]
            top = {entry["id"]: entry["logprob"] for entry in entries}
            if all(token in top for token in ids) or top_k >= self.vocab:
                logprobs = [top[token] for token in ids]
                return logprobs, 1 - sum(math.exp(lp) for lp in logprobs)
            top_k = self.vocab


async def served_vocabulary(url: str, http: aiohttp.ClientSession) -> int:
    async with http.get(f"{url}/v1/models") as response:
        return int((await response.json())["data"][0]["meta"]["n_vocab"])


def softmax(logprobs: Sequence[float]) -> list[float]:
    peak = max(logprobs)
    weights = [math.exp(lp - peak) for lp in logprobs]
    total = sum(weights)
    return [w / total for w in weights]
