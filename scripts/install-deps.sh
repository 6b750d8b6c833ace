#!/usr/bin/env bash
# Installs every Debian package pdkv needs, and nothing when all are present.
#
# Idempotent and non-interactive: `make demo`, `make test` and CI call it on
# every run, so a machine that already has everything pays one dpkg query and
# prints nothing. Compiler and CMake are assumed (they are part of the image),
# and so is CUDA's nvcc (in /usr/local/cuda, outside Debian): the build uses
# it when it is there.
set -euo pipefail

packages=(
  pkg-config
  ninja-build
  libucx-dev ucx-utils          # nixl backend; ucx_perftest baseline for bench
  libfabric-dev libfabric-bin   # mori backend; fi_info for diagnostics
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev
  libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  iperf3                        # TCP baseline for bench
  gnuplot-nox                   # pdkv bench --plot
  iproute2                      # ip, tc: the mooncake rails test builds network namespaces
  hipcc                         # HIP path of the GPU staging kernels (compiled, run on AMD GPUs)
  python3-numpy python3-pytest  # the Python package's tests (Debian's /usr/bin/python3)
  python3-pip python3-setuptools python3-wheel  # pip install --no-build-isolation ./python
  python3-torch                 # examples/tiny_llm: a real model through pdkv.sglang
  libssl-dev                    # HMAC-SHA256 of the authenticated control plane
  clang-14 libfuzzer-14-dev     # tests/fuzz: libFuzzer targets (build-fuzz/)
  openssl                       # the TLS tests make a throwaway CA and certificates
)

missing=()
for p in "${packages[@]}"; do
  # `dpkg-query -W` reports "install ok installed" only for fully installed packages.
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
# iperf3 asks whether to start a daemon; answer no so the install never blocks.
echo "iperf3 iperf3/start_daemon boolean false" | $sudo debconf-set-selections
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
