"""Build a tiny random-weight model over Mistral 7B Instruct v0.3's real SentencePiece vocabulary.

    python scripts/build_mistral_model.py OUT_DIR      (the vLLM venv's python: torch,
                                                        transformers, tokenizers, gguf,
                                                        sentencepiece and mistral-common)

writes
    OUT_DIR/hf/                 a Hugging Face folder (LlamaForCausalLM, bfloat16 safetensors,
                                tokenizer.json converted from the SentencePiece model with the
                                dummy prefix, tokenizer_config.json with the chat template of
                                tests/fixtures/mistral-v3.jinja) that vLLM serves
    OUT_DIR/mistral-tiny.gguf   the same weights (float32) and vocabulary as a GGUF that llama.cpp
                                serves, with ``tokenizer.ggml.add_space_prefix`` true as real
                                Mistral GGUFs carry it

The vocabulary is the real one: ``mistral_instruct_tokenizer_240323.model.v3`` as the PyPI
package ``mistral-common`` ships it (32,768 pieces, BPE, byte fallback, ``[INST]`` and
``[/INST]`` control pieces 3 and 4). On it a digit after ``[/INST]`` is two tokens, ``▁`` then
the digit, while ``A`` is the one token ``▁A``: the family whose controls need a lead
(`typevet_async._core.prompts.controls`). The model is Llama's architecture at toy size (hidden 128,
2 layers, 4 heads, 2 KV heads, intermediate 256, tied embeddings) with random weights from a
fixed seed: its answers mean nothing; its tokenizer, template and logprobs are real.

The GGUF is written with the ``gguf`` package the way llama.cpp's convert_hf_to_gguf.py writes
a Llama/Mistral SentencePiece model: tokenizer ``llama``, every piece with its score and type
(control, unknown, byte, normal), BOS 1, EOS 2, UNK 0, BOS added, the Q and K projections
permuted as llama.cpp's rope expects. The script checks its output before it returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "tests" / "fixtures" / "mistral-v3.jinja"
GGUF_NAME = "mistral-tiny.gguf"
SP_FILE = "mistral_instruct_tokenizer_240323.model.v3"
SEED = 20261204

MODEL = {
    "vocab_size": 32_768,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention takes 32, 64, 80, ...
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def log(message: str) -> None:
    print(f"build_mistral_model: {message}", flush=True)


def sentencepiece_file() -> Path:
    import mistral_common

    return Path(mistral_common.__file__).parent / "data" / SP_FILE


def build_tokenizer(hf: Path, chat_template: str) -> None:
    """tokenizer.json as transformers' LlamaConverter writes a legacy Llama/Mistral one (its
    own converter fails on this version, so the same parts are put together here): BPE over the
    pieces with merges ordered by score, byte fallback, the dummy prefix before every text
    segment (after special tokens too, as SentencePiece, mistral-common and llama.cpp's
    add_space_prefix do), control pieces as special added tokens."""
    from sentencepiece import SentencePieceProcessor
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE
    from transformers.tokenization_utils_base import generate_merges

    processor = SentencePieceProcessor(model_file=str(sentencepiece_file()))
    pieces = [processor.id_to_piece(i) for i in range(processor.vocab_size())]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    scores = {piece: processor.get_score(i) for i, piece in enumerate(pieces)}
    merges = generate_merges(vocab, scores)
    tokenizer = Tokenizer(BPE(vocab, merges, unk_token="<unk>", fuse_unk=True,
                              byte_fallback=True, dropout=None))  # fmt: skip
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(content=" ", left=1, right=0),
    ])  # fmt: skip
    tokenizer.add_tokens([
        AddedToken(piece, normalized=False, special=True)
        for i, piece in enumerate(pieces) if processor.is_control(i) or processor.is_unknown(i)
    ])  # fmt: skip
    hf.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(hf / "tokenizer.json"))
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 32768,
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json as written
    }
    (hf / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (hf / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}) + "\n",
        encoding="utf-8",
    )


def build_model(hf: Path) -> Any:  # a LlamaForCausalLM
    from random_model_parts import random_model
    from transformers import LlamaConfig, LlamaForCausalLM

    return random_model(hf, LlamaConfig, LlamaForCausalLM, MODEL, SEED, bos_token_id=1,
                        eos_token_id=2)  # fmt: skip


def permute(weights: Any, n_head: int, n_head_kv: int | None) -> Any:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotary halves to llama.cpp's pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    shape = weights.shape
    return (
        weights.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:])
        .swapaxes(1, 2)
        .reshape(shape)
    )


def write_gguf(model: Any, path: Path, chat_template: str) -> None:
    import gguf
    from random_model_parts import finish_writer, start_writer
    from sentencepiece import SentencePieceProcessor

    config = model.config
    name = "mistral-tiny (random weights, Mistral v3 vocabulary)"
    writer = start_writer(path, gguf.MODEL_ARCH.LLAMA, name, config, MODEL["rope_theta"])
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_vocab_size(config.vocab_size)

    # The vocabulary as convert_hf_to_gguf.py's _create_vocab_sentencepiece writes it.
    processor = SentencePieceProcessor(model_file=str(sentencepiece_file()))
    tokens, scores, types = [], [], []
    for i in range(processor.vocab_size()):
        tokens.append(processor.id_to_piece(i).encode("utf-8"))
        scores.append(processor.get_score(i))
        if processor.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif processor.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif processor.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        elif processor.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    if len(tokens) != config.vocab_size:
        raise SystemExit(f"{SP_FILE}: {len(tokens)} pieces, the model has {config.vocab_size}")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    writer.add_chat_template(chat_template)

    def rope_pairs(name: str, data: Any) -> Any:
        if name.endswith("q_proj.weight"):
            return permute(data, config.num_attention_heads, config.num_attention_heads)
        if name.endswith("k_proj.weight"):
            return permute(data, config.num_attention_heads, config.num_key_value_heads)
        return data

    finish_writer(writer, gguf.MODEL_ARCH.LLAMA, model, rope_pairs)


def check(hf: Path, path: Path) -> None:
    """The HF tokenizer agrees with mistral-common's encoder, and the GGUF loads as written."""
    import gguf
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf)
    reference = MistralTokenizer.from_file(str(sentencepiece_file()))
    raw = reference.instruct_tokenizer.tokenizer
    assert tokenizer.convert_tokens_to_ids("[INST]") == 3
    assert tokenizer.convert_tokens_to_ids("[/INST]") == 4
    samples = ["A", "0", "Reply with 0 or 1", "héllo wörld 12345", "def f(x):\n    return x\n",
               "  leading and trailing  ", "日本語", "emoji 🤖"]  # fmt: skip
    for sample in samples:
        ours = tokenizer.encode(sample, add_special_tokens=False)
        theirs = raw.encode(sample, bos=False, eos=False)
        if ours != theirs:
            raise SystemExit(f"HF tokenizer {ours} != mistral-common {theirs} for {sample!r}")
    assert raw.encode("0", bos=False, eos=False) == [29473, 29502]
    reader = gguf.GGUFReader(path)
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "llama"
    assert bool(fields["tokenizer.ggml.add_space_prefix"].parts[-1][0])
    assert len(fields["tokenizer.ggml.tokens"].data) == MODEL["vocab_size"]
    log(f"checked: {len(samples)} samples agree with mistral-common")


def build(hf: Path, path: Path) -> None:
    template = TEMPLATE.read_text(encoding="utf-8")
    build_tokenizer(hf, template)
    model = build_model(hf)
    write_gguf(model, path, template)
    check(hf, path)


def main() -> None:
    from random_model_parts import build_main

    build_main("build_mistral_model.py", GGUF_NAME, build)


if __name__ == "__main__":
    main()
