#!/usr/bin/env bash
# Sets everything up, then runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
  .venv/bin/python examples/demo/main.py
