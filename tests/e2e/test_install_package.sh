#!/usr/bin/env bash
# The installed CMake package works: `cmake --install` the build tree into a temporary prefix,
# build examples/consumer (find_package(lattice) + lattice::lattice, compiling
# examples/quickstart.cpp) against it, and run the quickstart, which exits 0 when the loss falls.
#   bash tests/e2e/test_install_package.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"

BUILD=$(dirname "$LATTICE")
PREFIX=$TMP/prefix

step() {
  local name=$1
  shift
  if ! "$@" >"$TMP/$name.log" 2>&1; then
    fail "$name failed: $*"
    tail -n 40 "$TMP/$name.log" | sed 's/^/    /' >&2
    e2e_finish
  fi
  pass "$name"
}

[ -f "$BUILD/cmake_install.cmake" ] || { fail "$BUILD is not a configured build dir"; e2e_finish; }

step "install" cmake --install "$BUILD" --prefix "$PREFIX"
for f in bin/lattice include/lattice/model/gpt_model.h; do
  [ -e "$PREFIX/$f" ] || fail "install did not put $f under the prefix"
done
config=$(find "$PREFIX" -name latticeConfig.cmake -print -quit)
lib=$(find "$PREFIX" -name liblattice.a -print -quit)
[ -n "$config" ] || fail "install did not write latticeConfig.cmake"
[ -n "$lib" ] || fail "install did not write liblattice.a"
# The package must not point back into the source tree.
if grep -rqF "$SRC/src" "$(dirname "$config")"; then
  fail "installed CMake package refers to the source tree $SRC/src"
fi

step "configure consumer" cmake -S "$SRC/examples/consumer" -B "$TMP/consumer" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX"
step "build consumer" cmake --build "$TMP/consumer" -j2
# Compiled against the installed headers, not the source tree.
if grep -rqF -- "-I$SRC/src" "$TMP/consumer/CMakeFiles" 2>/dev/null; then
  fail "consumer was compiled with -I$SRC/src instead of the installed headers"
fi
step "run quickstart 5" "$TMP/consumer/quickstart" 5
grep -q 'lm loss' "$TMP/run quickstart 5.log" || fail "quickstart printed no loss"
sed 's/^/    /' "$TMP/run quickstart 5.log"

e2e_finish
