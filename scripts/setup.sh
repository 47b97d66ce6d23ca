#!/usr/bin/env bash
# Installs the Debian packages rlsched needs (when any is missing), then configures
# and builds everything into build/. Usage: scripts/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake ninja-build g++ clang libclang-rt-14-dev pkg-config
  libtbb-dev libprotobuf-dev protobuf-compiler libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev python3 python3-pytest python3-protobuf
  libgrpc++-dev protobuf-compiler-grpc python3-grpcio python3-torch pybind11-dev python3-numpy
  python3-venv python3-pip python3-setuptools python3-wheel openssl python3-matplotlib
  python3-flake8 mypy mkdocs mkdocs-material mkdocstrings mkdocstrings-python-handlers
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >&2
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >&2
cmake --build build -j2 >&2
