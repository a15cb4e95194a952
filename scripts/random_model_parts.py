"""What both random-weight test models share (scripts/build_qwen_model.py and
scripts/build_mistral_model.py): the HF model at toy size from a fixed seed, and its GGUF written
the way llama.cpp's convert_hf_to_gguf.py writes one: the architecture's header from the HF
config, and the tensors under gguf's own name map, the tied output left out (llama.cpp reads a
missing ``output.weight`` as ``token_embd.weight``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build_main(script: str, gguf_name: str, build: Callable[[Path, Path], None]) -> None:
    """A build script's command line: ``script OUT_DIR``; ``build(hf, gguf)`` writes both
    files and checks them; the sizes and the time are printed."""
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {script} OUT_DIR")
    out = Path(sys.argv[1])
    hf, path = out / "hf", out / gguf_name
    started = time.monotonic()
    build(hf, path)
    size = sum(f.stat().st_size for f in hf.iterdir())
    seconds = time.monotonic() - started
    print(
        f"{script.removesuffix('.py')}: built in {seconds:.0f} s: {hf} ({size / 1e6:.1f} MB), "
        f"{path} ({path.stat().st_size / 1e6:.1f} MB)",
        flush=True,
    )


def random_model(
    hf: Any, config_class: Any, model_class: Any, settings: dict[str, Any], seed: int,
    **generation: Any,
) -> Any:  # fmt: skip
    """The model of ``settings`` (a ``rope_theta`` among them) with random bfloat16 weights
    from ``seed``, saved to the folder ``hf`` with its generation config."""
    import torch
    from transformers import GenerationConfig

    settings = dict(settings)
    rope_theta = settings.pop("rope_theta")
    config = config_class(**settings, rope_parameters={"rope_type": "default",
                                                       "rope_theta": rope_theta})  # fmt: skip
    config.architectures = [model_class.__name__]
    torch.manual_seed(seed)
    model = model_class(config).to(torch.bfloat16).eval()
    model.save_pretrained(hf, safe_serialization=True)
    GenerationConfig(**generation).save_pretrained(hf)
    return model


def start_writer(path: Any, arch: Any, name: str, config: Any, rope_theta: float) -> Any:
    """A ``gguf.GGUFWriter`` for ``arch`` with the model's header (float32 tensors)."""
    import gguf

    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    return writer


def finish_writer(
    writer: Any, arch: Any, model: Any, adjust: Callable[[str, Any], Any] | None = None
) -> None:
    """Add every tensor (float32: bfloat16 values are exact in it, so both files hold the same
    numbers; ``adjust`` may rewrite one by its HF name) and write the file."""
    import gguf
    import numpy as np

    config = model.config
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.float().numpy().astype(np.float32)
        if adjust is not None:
            data = adjust(name, data)
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise SystemExit(f"no GGUF name for {name}")
        writer.add_tensor(mapped, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
