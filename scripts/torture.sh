#!/usr/bin/env bash
# Crash torture: scripts/torture.sh N runs N trials in which a checkpointing
# writer (a CheckpointManager with forced replaces and retention deletions)
# is killed with SIGKILL, and checks the root after each kill. See
# scripts/torture/driver.py for the kinds of kill and the checks. As root it
# also mounts a small tmpfs per lane for trials where the disk fills up
# mid-save. Prints the counts; exits non-zero on any failure.
#
# The trials run in TORTURE_JOBS lanes at once (default: one per core):
# each lane is one checker with its own roots, seed and tmpfs, so a lane is
# the same sequence of trials as a run of its own. A trial mostly waits
# for its writer to start and be killed, so one lane keeps about one core
# busy. TORTURE_SEED=<n> replays a run's draws (lane i draws from n+i; the
# same N and TORTURE_JOBS replay it whole), TORTURE_KINDS=delete,replace
# limits the kinds of kill, TORTURE_DIR=<dir> keeps the work folder
# (failed roots).
set -euo pipefail
cd "$(dirname "$0")/.."
trials="${1:?usage: scripts/torture.sh TRIALS}"
python=.venv/bin/python
[ -x "$python" ] || { echo "torture: run scripts/setup.sh first" >&2; exit 2; }
lanes=${TORTURE_JOBS:-$(nproc)}
(( lanes > trials )) && lanes=$trials
seed=${TORTURE_SEED:-$(( $(date +%s%N) % 4294967296 ))}

workdir="${TORTURE_DIR:-$(mktemp -d -t shardkeep-torture.XXXXXX)}"
mkdir -p "$workdir"
tmpfs=()
cleanup() {
  for t in "${tmpfs[@]}"; do
    [ -n "$t" ] || continue
    umount "$t" 2>/dev/null || true
    rmdir "$t"
  done
  if [ -z "${TORTURE_DIR:-}" ]; then rm -rf "$workdir"; fi
}
trap cleanup EXIT
for ((lane = 0; lane < lanes; lane++)); do
  t=""
  if [ "$(id -u)" = 0 ]; then
    t="$(mktemp -d -t shardkeep-torture-tmpfs.XXXXXX)"
    if ! mount -t tmpfs -o size=12m tmpfs "$t"; then
      echo "torture: could not mount a tmpfs; diskfull trials skipped"
      rmdir "$t"; t=""
    fi
  fi
  tmpfs+=("$t")
done

# One lane: its share of the trials, from its own seed, in its own roots.
lane() {
  local n=$(( trials / lanes + (LANE < trials % lanes ? 1 : 0) ))
  mkdir -p "$workdir/lane-$LANE"
  TORTURE_SEED=$((seed + LANE)) "$python" scripts/torture/driver.py "$n" \
    "$workdir/lane-$LANE" ${tmpfs[$LANE]}
}
source scripts/lanes.sh
run_lanes "$lanes" "$workdir/lane" lane
