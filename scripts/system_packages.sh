#!/usr/bin/env bash
# Installs the Debian packages that building and testing shardkeep need
# (apt-get, as root), only those missing. scripts/setup.sh and
# scripts/build_wheels.sh start with it.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev
          libxxhash-dev libzstd-dev libexpat1-dev libgtest-dev libbenchmark-dev
          libssl-dev libcurl4-openssl-dev  # S3: signing hashes, HTTP client
          libcli11-dev  # the command-line tool's argument parsing
          clang libclang-rt-14-dev  # sanitizers and libFuzzer
          ccache)  # the wheels of several Python versions compile the core once
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
