#!/usr/bin/env bash
# Preprocessing throughput and peak memory: `lattice preprocess` (--append-eod) with 1 and 2 workers
# against tiktoken in node (bench/tiktoken_preprocess.cjs) on the same jsonl: the King James Bible
# (scripts/kjv-to-jsonl.sh) repeated to at least SIZE_MB megabytes. Two tokenizers: GPT-2's
# (GPT2BPETokenizer against tiktoken's gpt2) and a Llama 3-style tokenizer.json over cl100k_base
# (HuggingFaceTokenizer, tests/e2e/make_hf_tokenizer.cjs, against tiktoken's cl100k_base).
# usage: bench/preprocess_bench.sh            (environment: LATTICE, NPM_DIR, SIZE_MB=200, ROUNDS=1,
#                                              WORKERS="1 2", TOKENIZERS="gpt2 llama3",
#                                              WORK=a temp dir, KEEP=1 keeps it)
# Prints one line per run (stderr) and a Markdown table of the medians (docs/benchmarks.md): wall time,
# MB/s of wall time and of CPU time (user + system: fair on a busy machine), peak RSS (GNU time).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
LATTICE=${LATTICE:-$src/build/lattice}
NPM_DIR=${NPM_DIR:-$(dirname "$LATTICE")/npm}
SIZE_MB=${SIZE_MB:-200}
ROUNDS=${ROUNDS:-1}
WORKERS=${WORKERS:-1 2}
TOKENIZERS=${TOKENIZERS:-gpt2 llama3}
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/lattice-prebench.XXXXXX")}
[[ ${KEEP:-0} == 1 ]] || trap 'rm -rf "$WORK"' EXIT

flags=$("$src/scripts/install-tokenizer-assets.sh" "$NPM_DIR")
read -r -a gpt2_flags <<<"$flags"
gpt2_flags=(--tokenizer-type GPT2BPETokenizer "${gpt2_flags[@]}")
node "$src/tests/e2e/make_hf_tokenizer.cjs" "$NPM_DIR" "$WORK/llama3"
llama3_flags=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$WORK/llama3")
"$src/scripts/kjv-to-jsonl.sh" "$WORK/kjv.jsonl" >/dev/null
input="$WORK/bench.jsonl"
: >"$input"
while (( $(stat -c %s "$input") < SIZE_MB * 1000000 )); do cat "$WORK/kjv.jsonl" >>"$input"; done
echo "input: $input, $(stat -c %s "$input") bytes, $(wc -l <"$input") documents" >&2

# run NAME CMD...: one line "NAME wall_s cpu_s peak_rss_kb" from GNU time.
[[ -x /usr/bin/time ]] || { echo "preprocess_bench: needs GNU time (apt-get install time)" >&2; exit 1; }
results="$WORK/results"
: >"$results"
run() {
  local name=$1
  shift
  /usr/bin/time -f "%e %U %S %M" -o "$WORK/time" "$@" >"$WORK/stdout" 2>"$WORK/stderr" ||
    { cat "$WORK/stderr" >&2; exit 1; }
  echo "$name: $(tail -n 1 "$WORK/stderr") $(tail -n 1 "$WORK/stdout")" >&2
  awk -v n="$name" '{ printf "%s %s %s %s\n", n, $1, $2 + $3, $4 }' "$WORK/time" >>"$results"
}
for ((r = 0; r < ROUNDS; ++r)); do
  for t in $TOKENIZERS; do
    declare -n flags_of_t="${t}_flags"
    for w in $WORKERS; do
      run "lattice-$t-w$w" "$LATTICE" preprocess --input "$input" --json-keys text "${flags_of_t[@]}" \
        --output-prefix "$WORK/out" --append-eod --workers "$w" --no-progress
    done
    unset -n flags_of_t
    run "tiktoken-$t" node "$src/bench/tiktoken_preprocess.cjs" "$NPM_DIR" "$input" \
      "$([[ $t == gpt2 ]] && echo gpt2 || echo cl100k_base)"
  done
done

mb=$(awk -v b="$(stat -c %s "$input")" 'BEGIN { printf "%.1f", b / 1e6 }')
echo
echo "input: $mb MB; medians over $ROUNDS round(s); MB/s of CPU = input MB / (user + system seconds)"
echo
echo "| system | tokenizer | workers | wall s | MB/s (wall) | MB/s per CPU second | peak RSS MB |"
echo "|---|---|---:|---:|---:|---:|---:|"
for name in $(awk '{ print $1 }' "$results" | sort -u); do
  med() { awk -v n="$name" -v c="$1" '$1 == n { print $c }' "$results" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
  wall=$(med 2) cpu=$(med 3) rss=$(med 4)
  row=$(awk -v mb="$mb" -v w="$wall" -v c="$cpu" -v r="$rss" 'BEGIN { printf "%.1f | %.1f | %.1f | %.0f", w, mb / w, mb / c, r / 1024 }')
  t=${name#*-}
  t=${t%-w*}
  tok=$([[ $t == gpt2 ]] && echo "GPT-2 BPE" || echo "Llama 3-style (cl100k)")
  case $name in
    lattice-*) echo "| lattice preprocess | $tok | ${name##*-w} | $row |" ;;
    tiktoken-*) echo "| tiktoken 1.0.22 (node) | $tok | 1 | $row |" ;;
  esac
done
