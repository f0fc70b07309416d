#!/usr/bin/env bash
# Set up everything horovod_sparse needs on a fresh Debian machine, idempotently:
#   1. Debian packages (Open MPI, and headers the TensorFlow half of Horovod needs);
#   2. a virtual environment (.venv) with torch, tensorflow-cpu, mpi4py, numpy, pytest;
#   3. Horovod 0.28.1 built from its sdist (cached as a wheel outside the clone,
#      keyed by the torch and tensorflow versions);
#   4. horovod_sparse itself, editable, with its [torch,tensorflow] extras.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
TF_VERSION=2.21.0
HOROVOD_VERSION=0.28.1
CACHE_DIR=${HOROVOD_SPARSE_CACHE:-$HOME/.cache/horovod_sparse}
WHEEL_DIR=$CACHE_DIR/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-tf$TF_VERSION
APT_PACKAGES="openmpi-bin libopenmpi-dev libhighwayhash-dev libfarmhash-dev openssh-server openssh-client iproute2"

log() { printf '\n==> %s\n' "$*"; }
# pip, without the machine's notes about configured-but-absent local indexes
venv_pip() { "$VENV/bin/pip" "$@" 2> >(grep -v "^WARNING: Location '" >&2); }

install_apt_packages() {
  local missing=()
  for pkg in $APT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -eq 0 ]; then return; fi
  log "Installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

create_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "Creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  log "Installing Python dependencies"
  venv_pip install -q \
    "torch==$TORCH_VERSION" "tensorflow-cpu==$TF_VERSION" "tf_keras==$TF_VERSION" \
    mpi4py numpy numba pytest pytest-timeout scikit-learn matplotlib
}

build_horovod_wheel() {
  if ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    log "Using cached Horovod wheel in $WHEEL_DIR"
    return
  fi
  log "Building Horovod $HOROVOD_VERSION (a few minutes; cached afterwards in $WHEEL_DIR)"
  local work
  work=$(mktemp -d)
  venv_pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
  tar -xzf "$work"/horovod-$HOROVOD_VERSION.tar.gz -C "$work"
  local src=$work/horovod-$HOROVOD_VERSION
  # TensorFlow 2.21 no longer compiles Horovod's XLA ops (off by default at run time).
  sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
  # Horovod's CMake forces C++14; torch and tensorflow headers need C++17.
  cat > "$work/cxx17" <<'WRAP'
#!/bin/sh
for arg; do
  shift
  case "$arg" in -std=c++11|-std=c++14) arg=-std=c++17 ;; esac
  set -- "$@" "$arg"
done
exec g++ "$@"
WRAP
  chmod +x "$work/cxx17"
  (
    # The system cmake (3.25), not PyPI's cmake 4, which rejects Horovod's CMake files.
    export PATH="/usr/bin:$PATH"
    export CXX="$work/cxx17" CC=gcc MAKEFLAGS=-j"$(nproc)"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
    export HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_MXNET=1
    venv_pip wheel -q --no-build-isolation --no-deps --no-cache-dir "$src" -w "$work/dist"
  )
  mkdir -p "$WHEEL_DIR"
  cp "$work"/dist/horovod-*.whl "$WHEEL_DIR/"
  rm -rf "$work"
}

install_horovod() {
  if "$VENV/bin/python" -c "import horovod, sys; sys.exit(horovod.__version__ != '$HOROVOD_VERSION')" 2>/dev/null \
     && "$VENV/bin/python" -c "import horovod.torch, horovod.tensorflow" 2>/dev/null; then
    return
  fi
  build_horovod_wheel
  log "Installing Horovod"
  venv_pip install -q --force-reinstall --no-deps "$WHEEL_DIR"/horovod-*.whl
  venv_pip install -q cloudpickle psutil pyyaml packaging cffi
}

install_package() {
  log "Installing horovod_sparse (editable)"
  venv_pip install -q --no-build-isolation -e "$ROOT[torch,tensorflow]"
}

install_apt_packages
create_venv
install_horovod
[ -f "$ROOT/setup.py" ] && install_package
"$VENV/bin/horovodrun" --check-build
