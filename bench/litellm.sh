#!/usr/bin/env bash
# LiteLLM's proxy in a venv of its own (var/bench-litellm), for bench_gateway.py --litellm:
# its dependencies are not the project's. Prints the executable to pass.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=var/bench-litellm
if [ ! -x "$venv/bin/litellm" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'litellm[proxy]'
fi
echo "$PWD/$venv/bin/litellm"
