#!/usr/bin/env bash
# Builds examples/cpp on its own against the C++ package installed from
# BUILD_DIR (find_package(shardkeep)), then writes a checkpoint with
# write_checkpoint and reads it back with load_params.
#   examples/cpp/check_installed.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > /dev/null
cmake -S "$here" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" > /dev/null
cmake --build "$work/build" > /dev/null
"$work/build/write_checkpoint" "$work/ckpt" 3 > /dev/null
total=$("$work/build/load_params" "$work/ckpt" | tail -n 1)
expected=$'total\tparameters=182\tarrays=3'
[[ $total == "$expected" ]] || { echo "load_params printed '$total', expected '$expected'" >&2; exit 1; }
echo "examples: built against the installed package; write_checkpoint -> load_params"
