# Sourced by scripts that split one job into lanes that run at once
# (sanitize.sh's gtest shards, torture.sh's trials).
#
# run_lanes COUNT LOG_PREFIX COMMAND...: runs COMMAND COUNT times at once,
# with LANE=0 .. COUNT-1 in its environment and its output in
# LOG_PREFIX-<lane>.log. Prints each lane's log, in order, once that lane
# ends (so the output of lanes never interleaves), after a line such as
# "== shard 1 of 2" (the prefix's last part). Returns non-zero if any lane
# failed.
run_lanes() {
  local count=$1 prefix=$2 lane failed=0
  shift 2
  local pids=()
  for ((lane = 0; lane < count; lane++)); do
    LANE=$lane "$@" > "$prefix-$lane.log" 2>&1 &
    pids+=($!)
  done
  for ((lane = 0; lane < count; lane++)); do
    wait "${pids[$lane]}" || failed=1
    echo "== ${prefix##*/} $lane of $count"
    cat "$prefix-$lane.log"
  done
  return $failed
}
