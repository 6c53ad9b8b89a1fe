#!/usr/bin/env bash
# Tests of the Python binding (tests/python, pytest). Usage: scripts/test_python.sh [build-dir]
#  default: the package from python/ (PYTHONPATH) on <build-dir>/libllmkern.so (LLMKERN_LIB),
#           built beforehand by `make build` (default build dir: build);
#  LLMKERN_PY_INSTALL=1: `pip install ./python` first, into <build-dir>/py-install (pip
#           --target: nothing outside the build directory changes; the package builds its
#           own copy of the library with cmake, or, with LLMKERN_LIB set to a library file,
#           ships that one: python/setup.py), and test that installed package.
# Installs numpy, pytest and ml_dtypes (NumPy's bf16 dtype) when missing, and torch from
# PyPI (the torch-path tests and the llmkern.torch custom ops need it; PyPI's Linux wheel
# is a CUDA build: torch ~0.9 GB plus ~2.5 GB of nvidia-* / triton packages, a few minutes
# on a fast link, see the README). LLMKERN_NO_TORCH=1 skips that install (the torch tests
# then skip).
# Prints pytest's summary line ("N passed ..."); exit status non-zero on any failure.
set -eo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
case $build in /*) ;; *) build="$PWD/$build" ;; esac # absolute from here on (a relative one is the checkout's)
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
# ml_dtypes (bf16 NumPy arrays) from PyPI where pip is there
if ! "$PY" -c 'import ml_dtypes' 2>/dev/null && "$PY" -m pip --version >/dev/null 2>&1; then
  echo "installing: ml_dtypes"
  pip_install ml_dtypes
fi
# torch from PyPI (as make bench-torch does); a failed install leaves its tests skipping
if [ "${LLMKERN_NO_TORCH:-0}" != 1 ] && ! "$PY" -c 'import torch' 2>/dev/null && "$PY" -m pip --version >/dev/null 2>&1; then
  echo "installing: torch (PyPI; first install downloads ~3.5 GB)"
  t0=$(date +%s)
  pip_install torch || echo "torch could not be installed: its tests skip"
  echo "torch install took $(( $(date +%s) - t0 )) s"
fi

if [ "${LLMKERN_PY_INSTALL:-0}" = 1 ]; then
  target="$build/py-install"
  rm -rf "$target"
  echo "pip install ./python -> $target"
  pip_install --no-deps --target "$target" ./python
  unset LLMKERN_LIB
  export PYTHONPATH="$target"
  cd tests/python  # not from the checkout root: the installed package is the one imported
  # the package imported, and the library it loaded, must be the installed ones
  "$PY" -c 'import llmkern, sys; t = sys.argv[1]; print("installed package:", llmkern.__file__, "library:", llmkern.lib_path); sys.exit(0 if llmkern.__file__.startswith(t) and str(llmkern.lib_path).startswith(t) else 1)' "$target"
  exec "$PY" -m pytest -q -p no:cacheprovider .
fi
if [ ! -f "$build/libllmkern.so" ]; then
  echo "scripts/test_python.sh: $build/libllmkern.so not found (run make build first)"
  exit 1
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export LLMKERN_LIB="$build/libllmkern.so"
exec "$PY" -m pytest -q -p no:cacheprovider tests/python
