#!/usr/bin/env bash
# Sets up .venv with everything the project needs. Safe to run again (it only installs what is
# missing). torch is installed first and pinned: the pinned CPU wheel is what this project
# tests with, and an unpinned torch would pull several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: Python >= 3.11 is needed ($PYTHON is $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[dev,export,bench]"
# The native kernels (C++, jax.ffi), built once into the kernel cache (docs/kernels.md). Without
# a compiler the install still works: the library runs XLA's own operations in their place.
.venv/bin/ftx kernels build || echo "setup: the native kernels were not built (the line above says why); everything runs without them" >&2
