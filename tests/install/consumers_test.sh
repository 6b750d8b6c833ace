#!/usr/bin/env bash
# Installs the build into a temporary prefix, then checks what a consumer
# sees there: the SONAME, that each library exports its one interface only,
# a C program built with pkg-config and a C++ program built with
# find_package(pdkv), each moving a room over every backend given.
#   consumers_test.sh BUILD_DIR SOURCE_DIR BACKEND...
set -euo pipefail
build=$1 source=$2
shift 2
prefix=$(mktemp -d /tmp/pdkv-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix/usr" >/dev/null
lib=$prefix/usr/lib

fail() { echo "FAIL: $*" >&2; exit 1; }

soname=$(readelf -d "$lib/libpdkv.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[[ $soname == libpdkv.so.0 ]] || fail "libpdkv.so has SONAME '$soname', expected libpdkv.so.0"

# Dynamic symbols defined by each library, less the version node itself.
exports() { nm -D --defined-only "$1" | awk '$2 != "A" {sub(/@.*/, "", $3); print $3}'; }
stray=$(exports "$lib/libpdkv.so" | grep -v '^pdkv_' || true)
[[ -z $stray ]] || fail "libpdkv.so exports non-pdkv_ symbols: $(echo "$stray" | head -5)"
exports "$lib/libpdkv.so" | grep -x pdkv_engine_create >/dev/null || fail "libpdkv.so lacks pdkv_engine_create"
stray=$(exports "$lib/libpdkv_cxx.so" | c++filt | grep -v 'pdkv::' || true)
[[ -z $stray ]] || fail "libpdkv_cxx.so exports symbols outside namespace pdkv: $(echo "$stray" | head -5)"

export PKG_CONFIG_PATH=$lib/pkgconfig
work=$prefix/work
mkdir -p "$work"
# shellcheck disable=SC2046  # pkg-config's flags are words
gcc -std=c11 -Wall -Wextra -Werror "$source/tests/install/consumer.c" \
    $(pkg-config --cflags --libs pdkv) -Wl,-rpath,"$lib" -o "$work/c_pkgconfig"
cmake -S "$source/tests/install" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix/usr" \
      -DCMAKE_BUILD_RPATH="$lib" >/dev/null
cmake --build "$work/cmake" >/dev/null

for backend in "$@"; do
  "$work/c_pkgconfig" "$backend" 2>/dev/null
  "$work/cmake/c_consumer" "$backend" 2>/dev/null
  "$work/cmake/cxx_consumer" "$backend" 2>/dev/null
done
echo "consumers: ok (${*})"
