#!/usr/bin/env python3
"""Runs a GoogleTest binary so that one broken test cannot take the others with it.

On a GPU the first run of new kernels can do what no CPU test shows: a kernel that reads
out of bounds leaves the CUDA context unusable (a "sticky" error, after which every CUDA
call of the process fails), a trap or a driver fault kills the process, a kernel that never
finishes hangs it. Run whole, the binary would then report every later test as failed, or
nothing at all. This runner runs the binary over the tests not yet reported, and when the
process ends early (a crash, a hang it kills after --test-timeout seconds, or the binary's
"[  BROKEN  ]" line: tests/common/broken_state_listener.h, which the CUDA tests' main prints
and exits with when a test leaves the context unusable) it records that test as failed and
starts a new process for the rest, until every test is reported or --deadline is reached.

Its output is the binary's (the "[ info ]" lines and failure messages included), then one
summary in GoogleTest's words: "[  PASSED  ] N tests.", "[  SKIPPED ] N tests, listed
below:", "[  FAILED  ] N tests, listed below:" with each failed test and how it failed.
Exit status 0 only when every test ran and none failed.

usage: scripts/gtest_resilient.py [--test-timeout S] [--deadline S] BINARY [GTEST FLAGS...]
"""
import argparse
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time

RUN = re.compile(r"^\[ RUN      \] (\S+)$")
ENDED = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+?),?( where .*)? \(\d+ ms\)$")
BROKEN = re.compile(r"^\[  BROKEN  \] (\S+): (.*)$")


def list_tests(binary, extra):
    """The binary's test names (Suite.Name), in its order, from --gtest_list_tests."""
    out = subprocess.run([binary, "--gtest_list_tests"] + extra, check=True, capture_output=True,
                         text=True, timeout=120).stdout
    names, suite = [], None
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        else:
            names.append(suite + line.split("#")[0].strip())
    return names


def signal_name(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def run_once(binary, extra, tests, test_timeout, deadline, results):
    """One process over `tests`; fills results[name] = (status, detail). Returns the
    number of tests it reported."""
    filt = "--gtest_filter=" + ":".join(tests)
    # Line-buffered, so what a test printed before it crashed is not lost with the process.
    line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
    proc = subprocess.Popen(line_buffered + [binary, filt] + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            bufsize=0, start_new_session=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    running, started, killed, buf, reported = None, time.monotonic(), None, b"", 0

    def handle(line):
        nonlocal running, started, reported
        print(line, flush=True)
        m = RUN.match(line)
        if m:
            running, started = m.group(1), time.monotonic()
            return
        m = ENDED.match(line)
        if m and m.group(2) == running:
            status = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}[m.group(1)]
            results[running] = (status, "")
            running, reported = None, reported + 1
            return
        m = BROKEN.match(line)
        if m and m.group(1) == running:
            results[running] = ("failed", "left the process unusable: " + m.group(2))
            running, reported = None, reported + 1

    while True:
        now = time.monotonic()
        if running and now - started > test_timeout:
            killed = f"hung: killed after {test_timeout:.0f} s"
        elif now > deadline:
            killed = "not finished by the deadline"
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        if not sel.select(timeout=1.0):
            continue
        chunk = proc.stdout.read(65536)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            handle(raw.decode("utf-8", "replace").rstrip("\r"))
    if buf:
        handle(buf.decode("utf-8", "replace"))
    rc = proc.wait()
    if running:
        if killed:
            how = killed
        elif rc < 0:
            how = f"crashed: {signal_name(rc)}"
        else:
            how = f"the process exited with status {rc} during the test"
        results[running] = ("failed", how)
        print(f"[  ABORTED ] {running}: {how}", flush=True)
        reported += 1
    return reported


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--test-timeout", type=float, default=120, help="seconds one test may run [120]")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for the whole run (0: none) [0]")
    ap.add_argument("binary")
    ap.add_argument("gtest_flags", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    t0 = time.monotonic()
    deadline = t0 + a.deadline if a.deadline > 0 else float("inf")
    try:
        tests = list_tests(a.binary, a.gtest_flags)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"gtest_resilient.py: {a.binary}: cannot list its tests: {e}", file=sys.stderr)
        return 2
    results, processes = {}, 0
    while True:
        remaining = [t for t in tests if t not in results]
        if not remaining or time.monotonic() > deadline:
            break
        processes += 1
        if processes > 1:
            print(f"[ RESTART  ] a new process for the {len(remaining)} tests not yet reported", flush=True)
        reported = run_once(a.binary, a.gtest_flags, remaining, a.test_timeout, deadline, results)
        if reported == 0:
            print(f"gtest_resilient.py: {a.binary} reported no test (exit before the first); stopping",
                  file=sys.stderr)
            break

    count = lambda s: sorted(t for t in tests if results.get(t, ("",))[0] == s)
    passed, skipped, failed = count("passed"), count("skipped"), count("failed")
    not_run = [t for t in tests if t not in results]
    print(f"[==========] {len(tests)} tests, {len(tests) - len(not_run)} reported, in {processes} "
          f"process(es), {time.monotonic() - t0:.0f} s (scripts/gtest_resilient.py)")
    print(f"[  PASSED  ] {len(passed)} tests.")
    def listing(tag, names, what, describe=lambda t: t):
        if names:
            print(f"[{tag}] {len(names)} tests{what}, listed below:")
            for t in names:
                print(f"[{tag}] {describe(t)}")

    listing("  SKIPPED ", skipped, "")
    listing("  FAILED  ", failed, "", lambda t: t + (f" ({results[t][1]})" if results[t][1] else ""))
    listing("  NOT RUN ", not_run, " (the deadline, or the binary stopped reporting)")
    if failed:
        print(f"\n{len(failed)} FAILED TEST{'S' if len(failed) > 1 else ''}")
    return 0 if not failed and not not_run else 1


if __name__ == "__main__":
    sys.exit(main())
