#!/usr/bin/env bash
# `pip install --no-build-isolation` of python/ without a package index, into
# a temporary target, from a copy of the folder (the source tree stays
# clean); then pdkv and pdkv.sglang import from there, with the library the
# wheel carries, from a directory where no build tree is in sight.
#   pip_install_test.sh SOURCE_DIR LIBRARY
set -euo pipefail
source=$1 library=$(realpath "$2")
work=$(mktemp -d /tmp/pdkv-pip.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$source/python" "$work/src"
PDKV_LIBRARY=$library /usr/bin/python3 -m pip install --quiet --root-user-action=ignore --no-build-isolation --no-index \
  --no-deps --target "$work/site" "$work/src"
cd "$work"
PYTHONPATH=$work/site /usr/bin/python3 - "$work/site" <<'PY'
import sys
import pdkv, pdkv.sglang
site = sys.argv[1]
loaded = pdkv._native.lib._name
assert loaded.startswith(site), f"pdkv loaded {loaded}, not the wheel's library under {site}"
assert "mooncake" in pdkv.transport_names(), pdkv.transport_names()
print(f"pip install: ok (pdkv {pdkv.__version__}, {loaded})")
PY
