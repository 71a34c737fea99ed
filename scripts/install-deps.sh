#!/usr/bin/env bash
# Installs what building and testing msa needs on a Debian machine: compilers and CMake, Ninja,
# GoogleTest (Debian packages) and nanobind, scikit-build-core, numpy, pytest, ml_dtypes (PyPI).
# Idempotent and quick when everything is present. The CUDA toolkit is optional and not installed
# here: with nvcc on the PATH the GPU kernels are built too.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

PY=${PYTHON:-python3}
if ! "$PY" -c "import nanobind, scikit_build_core, numpy, pytest, ml_dtypes" 2>/dev/null; then
  echo "install-deps: pip install nanobind scikit-build-core numpy pytest ml_dtypes"
  "$PY" -m pip install -q --disable-pip-version-check "nanobind>=2.0" "scikit-build-core>=0.10" numpy pytest ml_dtypes
fi
