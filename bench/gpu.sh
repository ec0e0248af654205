#!/usr/bin/env bash
# One command for a CUDA GPU: the GPU-relevant tests, then training and decoding in bfloat16,
# Flax against PyTorch (SDPA, eager and torch.compile), into one JSON (bench/gpu.py says what).
#   bash bench/gpu.sh --json gpu.json [--skip-tests] [--rounds 3] [--steps 5]
# Refuses with one line and exit status 2 where there is no CUDA GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
exec "$PYTHON" -m bench.gpu "$@"
