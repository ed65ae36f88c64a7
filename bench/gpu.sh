#!/usr/bin/env bash
# The accelerator benchmark (bench/gpu.py) in one command, on a machine
# with a GPU, JAX, Orbax, torch and safetensors, and no package registry.
#
# Here:   scripts/build_wheels.sh 3.12      # dist/shardkeep-*-cp312-*.whl
# There:  bash bench/gpu.sh OUT_DIR         # the device tool: carry ["dist"],
#                                           # OUT_DIR="$OUT"
#
# Installs the carried wheel alone (--no-deps: numpy, ml_dtypes and JAX
# are the machine's), picks a checkpoint folder on a real disk (not a
# tmpfs, whose "disk" would be memory), then runs every measurement with
# cold loads that drop the page cache, and one save traced by JAX's
# profiler. OUT_DIR gets gpu.json, log.txt and trace.tar.gz. Commit them
# with a RESULTS.md made by bench/report_gpu.py (bench/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:?usage: bench/gpu.sh OUT_DIR}")
mkdir -p "$out"

wheel=$(ls dist/shardkeep-*-cp312-cp312-*.whl | tail -n 1)
site=/tmp/shardkeep-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "$wheel"
export PYTHONPATH=$site PYTHONUNBUFFERED=1

root=""
for folder in /var/tmp /root /home "$PWD"; do
  [ -d "$folder" ] && [ -w "$folder" ] || continue
  case $(stat -f -c %T "$folder") in tmpfs|ramfs) continue ;; esac
  root=$folder/shardkeep-gpu-bench
  break
done
[ -n "$root" ] || { echo "gpu.sh: no folder on a disk to write to" >&2; exit 1; }
df -h "$folder" /tmp || true
nvidia-smi || true

python3 bench/gpu.py --out "$out/gpu.json" --root "$root" --drop-caches --trace \
  --budget-s "${GPU_BENCH_BUDGET_S:-480}" 2>&1 | tee "$out/log.txt"
