#!/usr/bin/env bash
# Crash torture: scripts/torture.sh N runs N trials in which a checkpointing
# writer (a CheckpointManager with forced replaces and retention deletions)
# is killed with SIGKILL, and checks the root after each kill. See
# scripts/torture/driver.py for the kinds of kill and the checks. As root it
# also mounts a small tmpfs for trials where the disk fills up mid-save.
# Prints the counts; exits non-zero on any failure. TORTURE_SEED=<n> replays
# a run's draws, TORTURE_KINDS=delete,replace limits the kinds of kill,
# TORTURE_DIR=<dir> keeps the work folder (failed roots).
set -euo pipefail
cd "$(dirname "$0")/.."
trials="${1:?usage: scripts/torture.sh TRIALS}"
python=.venv/bin/python
[ -x "$python" ] || { echo "torture: run scripts/setup.sh first" >&2; exit 2; }

workdir="${TORTURE_DIR:-$(mktemp -d -t shardkeep-torture.XXXXXX)}"
mkdir -p "$workdir"
tmpfs=""
cleanup() {
  if [ -n "$tmpfs" ]; then umount "$tmpfs" 2>/dev/null || true; rmdir "$tmpfs"; fi
  if [ -z "${TORTURE_DIR:-}" ]; then rm -rf "$workdir"; fi
}
trap cleanup EXIT
if [ "$(id -u)" = 0 ]; then
  tmpfs="$(mktemp -d -t shardkeep-torture-tmpfs.XXXXXX)"
  if ! mount -t tmpfs -o size=12m tmpfs "$tmpfs"; then
    echo "torture: could not mount a tmpfs; diskfull trials skipped"
    rmdir "$tmpfs"; tmpfs=""
  fi
fi
"$python" scripts/torture/driver.py "$trials" "$workdir" $tmpfs
