#!/usr/bin/env bash
# Prints the CPython interpreter of a version (`scripts/find_python.sh 3.12`)
# for the wheel scripts: $PYTHON_3_12 if set, else pyenv's newest 3.12.x,
# else python3.12 on PATH. Fails, saying so, when there is none.
set -euo pipefail
version=${1:?usage: scripts/find_python.sh X.Y}
[[ $version =~ ^3\.[0-9]+$ ]] || { echo "find_python.sh: not a version X.Y: $version" >&2; exit 2; }

named_var=PYTHON_${version//./_}
if [ -n "${!named_var:-}" ]; then
  python=${!named_var}
elif command -v pyenv > /dev/null && prefix=$(pyenv prefix "$version" 2> /dev/null); then
  python=$prefix/bin/python$version
else
  python=$(command -v "python$version" || true)
fi
if [ -z "$python" ] || ! "$python" -c 'import sys; sys.exit(0)' 2> /dev/null; then
  echo "find_python.sh: no CPython $version: install it (pyenv install $version)," \
       "put python$version on PATH, or name it in \$$named_var" >&2
  exit 1
fi
# The version asked for, not another one that answers to the name.
actual=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$actual" != "$version" ]; then
  echo "find_python.sh: $python is CPython $actual, not $version" >&2
  exit 1
fi
echo "$python"
