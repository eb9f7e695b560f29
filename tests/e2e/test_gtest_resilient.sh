#!/usr/bin/env bash
# scripts/gtest_resilient.py (how scripts/gpu-check.sh runs the GPU tests) reports every test
# of a binary whose tests crash, hang and break the process: each such test as failed with
# how, the others with their own results, each run once.
#   bash tests/e2e/test_gtest_resilient.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
FIXTURE=$(dirname "$LATTICE")/gtest_resilient_fixture
[ -x "$FIXTURE" ] || { fail "no fixture binary at $FIXTURE"; e2e_finish; }

rc=0
python3 "$SRC/scripts/gtest_resilient.py" --test-timeout 3 "$FIXTURE" > "$TMP/out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && pass "exit status 1 (tests failed)" || fail "exit status $rc, expected 1"

# expect LINE: the summary holds exactly this line.
expect() {
  grep -qxF -- "$1" "$TMP/out" && pass "$1" || fail "missing: $1"
}
expect "[  PASSED  ] 6 tests."
expect "[  SKIPPED ] 1 tests, listed below:"
expect "[  SKIPPED ] Fixture.Skips"
expect "[  FAILED  ] 5 tests, listed below:"
expect "[  FAILED  ] Fixture.Fails"
expect "[  FAILED  ] Fixture.Crashes (crashed: SIGSEGV)"
expect "[  FAILED  ] Fixture.BreaksTheState (left the process unusable: the state is broken)"
expect "[  FAILED  ] Fixture.Hangs (hung: killed after 3 s)"
expect "[  FAILED  ] Values/Param.EvenPasses/1"
grep -qE '^\[==========\] 12 tests, 12 reported, in 4 process\(es\), [0-9]+ s' "$TMP/out" &&
  pass "12 tests reported, in 4 processes" || fail "not: 12 tests reported, in 4 processes"
# Each test ran once; the output of the tests is passed through.
runs=$(grep -c '^\[ RUN      \]' "$TMP/out")
[ "$runs" -eq 12 ] && pass "12 tests started once each" || fail "$runs test starts for 12 tests"
expect "[ info ] crashes ran"
grep -q "a failure the runner must report" "$TMP/out" && pass "failure messages passed through" ||
  fail "the failure message is not in the output"
if [ "$FAILURES" -ne 0 ]; then sed 's/^/    /' "$TMP/out" >&2; fi

# A deadline ends the run and names what did not run.
rc=0
python3 "$SRC/scripts/gtest_resilient.py" --test-timeout 30 --deadline 2 "$FIXTURE" > "$TMP/out2" 2>&1 || rc=$?
if [ "$rc" -eq 1 ] && grep -q '^\[  NOT RUN \] FixtureLast.Passes' "$TMP/out2" &&
   grep -qF '[  FAILED  ] Fixture.Hangs (not finished by the deadline)' "$TMP/out2"; then
  pass "--deadline: exit 1, the tests not run listed"
else
  fail "--deadline: exit $rc; $(grep 'NOT RUN\|reported' "$TMP/out2" | head -3 | tr '\n' ' ')"
fi
# No binary: one line, exit 2.
rc=0
err=$(python3 "$SRC/scripts/gtest_resilient.py" "$TMP/nope" 2>&1) || rc=$?
[ "$rc" -eq 2 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && pass "missing binary: $err" || fail "missing binary: exit $rc: $err"
e2e_finish
