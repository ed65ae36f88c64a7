#!/usr/bin/env bash
# Builds the libFuzzer targets of cpp/fuzz with clang (ASan + UBSan, in
# build/asan beside the sanitized tests: scripts/build_sanitized.sh) and
# runs each one, seeded from the golden files and the compatibility
# checkpoints under cpp/testdata and from its kept corpus,
# cpp/fuzz/corpus/<target>.tar.xz: the inputs earlier runs found that
# reach code no other input reaches, so a short run starts where they
# ended instead of finding them again.
#
#   scripts/fuzz.sh [--seconds N | --runs N] [--keep] [target...]
#
# --seconds N runs each target for N seconds (default 60), --runs N for N
# inputs; FUZZ_JOBS targets at a time (default: the number of cores).
# Targets default to all of them (index_fuzzer, ...). Each target's
# corpus grows in build/fuzz/corpus/<target> across runs; --keep merges
# into the kept corpus what of it adds coverage (libFuzzer's -merge=1)
# and packs it again (commit the archives it changed).
# A crash leaves its input in build/fuzz/crashes/ and makes the script
# fail. Turn every crash into a regression test (cpp/src/.../*_test.cc
# with the input).
set -euo pipefail
cd "$(dirname "$0")/.."

limit=(-max_total_time=60)
keep=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) limit=(-max_total_time="$2"); shift 2 ;;
    --runs) limit=(-runs="$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n 2,19p "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done

build=build/fuzz  # seeds, corpora, crashes and logs; the binaries: build/asan
kept=$build/kept  # the kept corpora, unpacked
if [ ${#targets[@]} -eq 0 ]; then
  for f in cpp/fuzz/*_fuzzer.cc; do targets+=("$(basename "$f" .cc)"); done
fi
scripts/build_sanitized.sh asan "${targets[@]}"

# Seeds: the file each decoder reads, from the golden files and from every
# checkpoint under cpp/testdata (S3 answers: cpp/testdata/s3/*.xml;
# safetensors files: cpp/testdata/safetensors; leases:
# cpp/testdata/format/lease*.json); the
# whole-checkpoint target gets each checkpoint packed into its input layout
# (cpp/fuzz/checkpoint_fuzzer.cc).
seeds="$build/seeds"
rm -rf "$seeds"
mkdir -p "$seeds"/{index_fuzzer,commit_record_fuzzer,checkpointable_meta_fuzzer,checkpoint_fuzzer,s3_xml_fuzzer,safetensors_fuzzer,lease_fuzzer}
copy_seeds() {  # copy_seeds <target> <find -name pattern>
  find cpp/testdata -type f -name "$2" | while read -r f; do
    cp "$f" "$seeds/$1/$(echo "$f" | tr / _)"
  done
}
copy_seeds index_fuzzer '*.idx'
copy_seeds commit_record_fuzzer '*SHARDKEEP'
copy_seeds checkpointable_meta_fuzzer '*meta.json'
copy_seeds s3_xml_fuzzer '*.xml'
copy_seeds safetensors_fuzzer '*.safetensors'
copy_seeds lease_fuzzer 'lease*.json'
python3 scripts/pack_fuzz_checkpoints.py cpp/testdata "$seeds/checkpoint_fuzzer"
rm -rf "$kept"
for target in "${targets[@]}"; do
  mkdir -p "$kept/$target"
  archive=cpp/fuzz/corpus/$target.tar.xz
  [ ! -f "$archive" ] || tar -C "$kept/$target" -xJf "$archive"
done

# fuzz_target <target>: one libFuzzer run; its output goes to the target's
# log, its exit code to the log's .rc.
fuzz_target() {
  local target=$1 rc=0
  local log="$build/logs/$target.log"
  mkdir -p "$build/corpus/$target" "$build/crashes" "$build/logs"
  build/asan/cpp/fuzz/$target "${limit[@]}" -rss_limit_mb=2048 -timeout=30 \
    -print_final_stats=1 -artifact_prefix="$build/crashes/$target-" \
    "$build/corpus/$target" "$seeds/$target" "$kept/$target" > "$log" 2>&1 || rc=$?
  echo "$rc" > "$log.rc"
}

# A libFuzzer run uses one core: the targets run FUZZ_JOBS at a time
# (default: one per core), each for the whole time given.
jobs=${FUZZ_JOBS:-$(nproc)}
echo "== ${targets[*]}: ${limit[*]} each, $jobs at a time"
for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_target "$target" &
done
wait

failed=()
for target in "${targets[@]}"; do
  log="$build/logs/$target.log"
  echo "== $target"
  grep -E "stat::number_of_executed_units|ERROR|SUMMARY|fuzz check failed|Test unit written" "$log" || true
  if [ "$(cat "$log.rc")" -ne 0 ]; then failed+=("$target"); tail -40 "$log"; fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in ${failed[*]}; inputs in $build/crashes/, logs in $build/logs/" >&2
  exit 1
fi
if [ "$keep" = 1 ]; then
  for target in "${targets[@]}"; do
    build/asan/cpp/fuzz/$target -merge=1 -rss_limit_mb=2048 "$kept/$target" \
      "$build/corpus/$target" > "$build/logs/$target.merge.log" 2>&1
    # Packed the same way each time, so an unchanged corpus is an unchanged file.
    (cd "$kept/$target" && find . -type f | LC_ALL=C sort |
       tar --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - -T - | xz -9) \
      > "cpp/fuzz/corpus/$target.tar.xz"
    echo "$target: $(ls "$kept/$target" | wc -l) inputs kept"
  done
fi
