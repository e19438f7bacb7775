#!/usr/bin/env bash
# Install Horovod 0.28.1 into the given Python's environment, built against its TensorFlow.
#
# The PyPI release does not build against TF 2.21 as shipped: TF's XLA headers need two Debian
# header packages, and one include moved (Horovod's main branch made the same fix for TF >= 2.19).
# The build takes minutes, so the wheel is kept in a cache outside the checkout, keyed by the
# Horovod, TensorFlow and Python versions, and reused by every later install on this machine.
#
# Usage: scripts/install_horovod.sh PYTHON      (TFPERF_WHEEL_CACHE overrides the cache folder)
set -euo pipefail

PY=${1:?usage: scripts/install_horovod.sh PYTHON}
HVD_VERSION=0.28.1
CACHE=${TFPERF_WHEEL_CACHE:-$HOME/.cache/tfperf/wheels}
BIN=$(dirname "$PY")

say() { echo "install_horovod: $*"; }

TF_VERSION=$("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) || {
  say "TensorFlow is not importable by $PY: install requirements.txt first"; exit 1; }
PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# On a GPU host (an NVIDIA driver and the CUDA compiler), all-reduce must go through NCCL on the GPUs:
# without it every gradient crosses host memory through Gloo, correct and slow enough to mislead.
NCCL=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  if command -v nvcc >/dev/null; then
    NCCL=$("$PY" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) || NCCL="system"
  else
    say "nvidia-smi sees GPUs but there is no nvcc (CUDA toolkit): building without NCCL, all-reduce on the host"
  fi
fi
KEY="horovod-$HVD_VERSION-tf$TF_VERSION-$PY_TAG${NCCL:+-nccl}"
WHEEL_DIR="$CACHE/$KEY"

verify() {
  # The build must have TensorFlow and at least the Gloo controller, or distributed recipes cannot run.
  local report
  report=$(PATH="$BIN:$PATH" "$BIN/horovodrun" --check-build 2>/dev/null) || return 1
  grep -q '\[X\] TensorFlow' <<<"$report" && grep -q '\[X\] Gloo' <<<"$report" || return 1
  [ -z "$NCCL" ] || grep -q '\[X\] NCCL' <<<"$report"
}

if "$PY" -c "import horovod, sys; sys.exit(horovod.__version__ != '$HVD_VERSION')" 2>/dev/null \
   && "$PY" -c 'import horovod.tensorflow' 2>/dev/null && verify; then
  say "horovod $HVD_VERSION already installed and built with TensorFlow and Gloo"
  exit 0
fi

if ! compgen -G "$WHEEL_DIR/horovod-*.whl" >/dev/null; then
  say "no cached wheel for $KEY: building from the sdist (several minutes, once per machine)"
  missing=()
  for pkg in libhighwayhash-dev libfarmhash-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    say "installing Debian packages TF's XLA headers include: ${missing[*]}"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null || {
      say "could not install ${missing[*]} with apt-get: install them, then run this again"; exit 1; }
  fi
  command -v cmake >/dev/null || "$PY" -m pip install -q cmake
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$HVD_VERSION" -d "$work"
  tar -xzf "$work/horovod-$HVD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HVD_VERSION"
  sed -i 's#tensorflow/compiler/xla/client/xla_builder.h#xla/hlo/builder/xla_builder.h#' \
    "$src/horovod/tensorflow/xla_mpi_ops.cc"
  grep -q 'xla/hlo/builder/xla_builder.h' "$src/horovod/tensorflow/xla_mpi_ops.cc" || {
    say "the include fix did not apply: the sdist changed; see DEVELOPERS.md"; exit 1; }
  flags=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1)
  if command -v mpicc >/dev/null; then flags+=(HOROVOD_WITH_MPI=1); else flags+=(HOROVOD_WITHOUT_MPI=1); fi
  if [ -n "$NCCL" ]; then
    flags+=(HOROVOD_GPU_OPERATIONS=NCCL)
    # tensorflow[and-cuda] brings NCCL as the nvidia-nccl wheel; otherwise the system's.
    [ "$NCCL" = system ] || flags+=(HOROVOD_NCCL_HOME="$NCCL")
  fi
  say "building with ${flags[*]}"
  # --no-build-isolation: the extension must compile against the TensorFlow installed here.
  env "${flags[@]}" MAKEFLAGS="-j$(nproc)" PATH="$BIN:$PATH" \
    "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$work/wheel" "$src" >"$work/build.log" 2>&1 || {
      tail -n 40 "$work/build.log"; say "build failed (log above)"; exit 1; }
  mkdir -p "$CACHE"
  rm -rf "$WHEEL_DIR.tmp" && mkdir "$WHEEL_DIR.tmp" && cp "$work"/wheel/horovod-*.whl "$WHEEL_DIR.tmp/"
  mv -T "$WHEEL_DIR.tmp" "$WHEEL_DIR"  # atomic: a cache folder is complete or absent
else
  say "reusing the cached wheel in $WHEEL_DIR"
fi

"$PY" -m pip install -q --force-reinstall --no-deps "$WHEEL_DIR"/horovod-*.whl
"$PY" -m pip install -q cloudpickle psutil pyyaml packaging  # horovod's own runtime requirements
verify || { say "horovodrun --check-build does not list TensorFlow and Gloo${NCCL:+ and NCCL}"; exit 1; }
say "horovod $HVD_VERSION installed (TensorFlow $TF_VERSION, Gloo${NCCL:+, NCCL})"
