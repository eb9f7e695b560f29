#!/usr/bin/env bash
# Writes the King James Bible (Debian package bible-kjv) as JSON lines, one document per chapter:
#   {"text": "In the beginning God created ... And the evening and the morning were the sixth day."}
# The verses of a chapter are joined with single spaces, without their "Ge1:1 " references.
# usage: scripts/kjv-to-jsonl.sh [OUTPUT]   (default data/kjv.jsonl)
set -euo pipefail
out=${1:-data/kjv.jsonl}
command -v bible >/dev/null || { echo "kjv-to-jsonl: 'bible' not found (apt-get install bible-kjv)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT

# A line is "<book><chapter>:<verse> <text>", the book possibly starting with a digit ("1Sa3:4 ").
bible -f "gen1:1-rev22:21" | LC_ALL=C awk '
  function flush() { if (text != "") printf "{\"text\": \"%s\"}\n", text; text = "" }
  # Literal replacement (gsub treats backslashes in the replacement differently across awks).
  function replace(s, ch, rep,   out, i) {
    out = ""
    while ((i = index(s, ch)) > 0) { out = out substr(s, 1, i - 1) rep; s = substr(s, i + 1) }
    return out s
  }
  function esc(s) {
    s = replace(replace(replace(s, "\\", "\\\\"), "\"", "\\\""), "\t", "\\t")
    gsub(/[\001-\037]/, " ", s)
    return s
  }
  match($0, /^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ /) {
    ref = substr($0, 1, RLENGTH - 1); chapter = substr(ref, 1, index(ref, ":") - 1)
    if (chapter != current) { flush(); current = chapter }
    verse = esc(substr($0, RLENGTH + 1))
    text = (text == "") ? verse : text " " verse
    verses++; next
  }
  { printf "kjv-to-jsonl: line %d has no verse reference: %s\n", NR, $0 > "/dev/stderr"; bad = 1; exit 1 }
  END {
    if (bad) exit 1
    flush()
    if (verses != 31102) { printf "kjv-to-jsonl: expected 31102 verses, got %d\n", verses > "/dev/stderr"; exit 1 }
  }' >"$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "kjv-to-jsonl: wrote $out ($(wc -l <"$out") chapters, $(wc -c <"$out") bytes)"
