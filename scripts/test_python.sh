#!/usr/bin/env bash
# Tests of the Python binding (tests/python, pytest). Usage: scripts/test_python.sh [build-dir]
#  default: the package from python/ (PYTHONPATH) on <build-dir>/libllmkern.so (LLMKERN_LIB),
#           built beforehand by `make build` (default build dir: build);
#  LLMKERN_PY_INSTALL=1: `pip install ./python` first (it builds its own copy of the library
#           with cmake) and test the installed package.
# Installs numpy and pytest when missing. torch is optional (its tests skip without it).
# Prints pytest's summary line ("N passed ..."); exit status non-zero on any failure.
set -eo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
PY=${PYTHON:-python3}

pip_install() {
  "$PY" -m pip install -q "$@" 2>/dev/null || "$PY" -m pip install -q --break-system-packages "$@"
}

missing=()
"$PY" -c 'import numpy' 2>/dev/null || missing+=(numpy)
"$PY" -c 'import pytest' 2>/dev/null || missing+=(pytest)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  if "$PY" -m pip --version >/dev/null 2>&1; then
    pip_install "${missing[@]}"
  else  # no pip (Debian's python3 without python3-pip): Debian's packages
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]/#/python3-}"
  fi
fi

if [ "${LLMKERN_PY_INSTALL:-0}" = 1 ]; then
  pip_install ./python
  unset LLMKERN_LIB
  cd tests/python  # not from the checkout root: the installed package is the one imported
  exec "$PY" -m pytest -q -p no:cacheprovider .
fi
if [ ! -f "$build/libllmkern.so" ]; then
  echo "scripts/test_python.sh: $build/libllmkern.so not found (run make build first)"
  exit 1
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export LLMKERN_LIB="$PWD/$build/libllmkern.so"
exec "$PY" -m pytest -q -p no:cacheprovider tests/python
