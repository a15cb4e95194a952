#!/usr/bin/env bash
# Installs everything the suite needs and runs it: lint, types, layering, unit and live tests.
# Live tests start their own real servers (llama.cpp through xllamacpp, with Gemma 3 270M).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,local]"
.venv/bin/python -c "from typevet_async.local import ensure_model; print('model:', ensure_model())"
.venv/bin/ruff check typevet_async tests benchmarks
.venv/bin/ruff format --check typevet_async tests benchmarks
.venv/bin/mypy --strict typevet_async
.venv/bin/lint-imports
exec .venv/bin/python -m pytest tests "$@"
