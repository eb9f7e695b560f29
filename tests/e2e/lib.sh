# Shared helpers for the end-to-end tests: source it from a test_*.sh script.
#   source "$(dirname "$0")/lib.sh"; e2e_init "$@"
# Gives LATTICE (the binary), SRC (the source dir), TMP (a temp dir removed on exit),
# fail/check helpers that record failures, and e2e_finish, which exits non-zero if any failed.
# KEEP_TMP=1 keeps TMP after the run, to look at what a failing check compared.

e2e_init() {
  if [ $# -lt 1 ]; then
    echo "usage: $0 <path to lattice binary> [source dir]" >&2
    exit 2
  fi
  LATTICE=$(realpath "$1")
  SRC=$(realpath "${2:-$(dirname "$0")/../..}")
  if [ ! -x "$LATTICE" ]; then
    echo "FAIL: $LATTICE is not an executable" >&2
    exit 1
  fi
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/lattice-e2e.XXXXXX")
  trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"' EXIT
  FAILURES=0
  # Keep each run small and independent of the machine it runs on.
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
}

fail() {
  echo "FAIL: $*" >&2
  FAILURES=$((FAILURES + 1))
}

pass() {
  echo "ok: $*"
}

# squeezed_has FILE... -- STRING...: whether the files' text, without spaces, newlines and NULs, contains
# every fixed STRING. The text is read whole first: `tr ... <big | grep -q` would be killed by SIGPIPE when
# grep stops at an early match, which `set -o pipefail` reports as a failure of the check.
squeezed_has() {
  local files=() text s
  while [ $# -gt 0 ] && [ "$1" != -- ]; do files+=("$1"); shift; done
  shift
  text=$(cat "${files[@]}" | tr -d ' \n\0') || return 1
  for s in "$@"; do [[ $text == *"$s"* ]] || return 1; done
}

# run NAME CMD...: runs CMD with stdout/stderr in NAME.out/NAME.err (in the current directory);
# on a non-zero exit fails the test, shows NAME.err and returns 1.
run() {
  local name=$1
  shift
  if ! "$@" >"$name.out" 2>"$name.err"; then
    fail "$name: exited non-zero: $*"
    sed 's/^/    /' "$name.err" >&2
    return 1
  fi
}

# expect_resumed_losses NAME STRAIGHT RESUMED N: the last N lm losses of the straight run's metrics
# file are every lm loss of the resumed run's, digit for digit.
expect_resumed_losses() {
  local name=$1 want got
  want=$(tail -n "$4" "$2" | grep -o '"lm_loss":[^,}]*')
  got=$(grep -o '"lm_loss":[^,}]*' "$3")
  if [ -n "$want" ] && [ "$got" = "$want" ]; then
    pass "$name"
  else
    fail "$name: want $(echo $want) got $(echo $got)"
  fi
}

# expect_close_losses NAME GOT WANT N: the metrics files GOT and WANT hold N lm losses each, every one of
# GOT within 1e-5 (relative) of WANT's: another parallel layout's run against one process's.
expect_close_losses() {
  local got want
  got=$(grep -o '"lm_loss":[^,}]*' "$2" | cut -d: -f2)
  want=$(grep -o '"lm_loss":[^,}]*' "$3" | cut -d: -f2)
  if paste <(echo "$got") <(echo "$want") |
     awk -v n="$4" '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $2) bad = 1; k++ } END { exit bad || k != n }'; then
    pass "$1"
  else
    fail "$1: $(echo $got | tr -s ' ' | cut -c1-80) against $(echo $want | cut -c1-80)"
  fi
}

# Number of lines in a file, counting a last line without a newline.
line_count() { awk 'END { print NR }' "$1"; }

# wait_for FILE PATTERN [SECONDS]: polls (up to SECONDS, default 10) for a line in FILE
# matching the ERE PATTERN; non-zero if none came.
wait_for() {
  local i
  for i in $(seq 1 $((${3:-10} * 200))); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.005
  done
  return 1
}

# expect_error NAME "PATTERN1|PATTERN2..." -- CMD ARGS...
# Runs CMD; asserts a non-zero exit that is not a crash (< 126), exactly one line on stderr, and that the line contains every
# '|'-separated fixed string in PATTERNS (case-insensitive).
expect_error() {
  local name=$1 patterns=$2
  shift 2
  [ "$1" = "--" ] && shift
  local out="$TMP/.stdout" err="$TMP/.stderr" rc=0 cmd="$*"
  "$@" >"$out" 2>"$err" || rc=$?
  local ok=1
  if [ "$rc" -eq 0 ]; then
    fail "$name: exited 0, expected an error: $cmd"
    ok=0
  elif [ "$rc" -ge 126 ]; then
    fail "$name: exit status $rc (crashed or could not run), expected a clean error exit: $cmd"
    ok=0
  fi
  local n
  n=$(line_count "$err")
  if [ "$n" -ne 1 ]; then
    fail "$name: stderr has $n lines, expected exactly 1: $cmd"
    ok=0
  fi
  local p rest="$patterns|"
  while [ -n "$rest" ]; do
    p=${rest%%|*}
    rest=${rest#*|}
    [ -z "$p" ] && continue
    if ! grep -qiF -- "$p" "$err"; then
      fail "$name: stderr does not mention '$p': $cmd"
      ok=0
    fi
  done
  if [ "$ok" -eq 1 ]; then
    pass "$name: $(head -n 1 "$err")"
  else
    echo "  exit status: $rc" >&2
    echo "  stderr:" >&2
    sed 's/^/    /' "$err" >&2
  fi
}

e2e_finish() {
  if [ "$FAILURES" -ne 0 ]; then
    echo "$(basename "$0"): $FAILURES check(s) failed" >&2
    exit 1
  fi
  echo "$(basename "$0"): all checks passed"
  exit 0
}
