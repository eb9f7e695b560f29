#!/usr/bin/env bash
# Builds, here, what scripts/gpu-check.sh runs on a borrowed GPU machine whose image has CUDA,
# CMake and PyTorch but not lattice's other build dependencies (Open MPI, oneDNN, GoogleTest,
# nlohmann-json) and no network: lattice and lattice_cuda_tests for sm_90 (Hopper; ARCH to
# change), stripped, with the shared libraries they need that are not part of glibc or the
# CUDA driver/toolkit, in one compressed file to carry:
#
#   scripts/gpu-bundle.sh                 # writes .gpu-bundle.tar.xz (ignored by git)
#   device run: carry [".gpu-bundle.tar.xz"], command "PREBUILT=.gpu-bundle.tar.xz scripts/gpu-check.sh"
#
# The CPU code is built for x86-64-v3 (AVX2; the GPU host's CPU may lack AVX-512); oneDNN picks
# its kernels at run time. NCCL and cuBLASLt are not bundled (hundreds of MB): gpu-check.sh finds
# them in the GPU machine's CUDA toolkit or its PyTorch's nvidia-* packages.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ARCH=${ARCH:-90}
BUILD=${BUILD:-build-gpu-bundle}
OUTFILE=${OUTFILE:-.gpu-bundle.tar.xz}

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DLATTICE_ARCH=x86-64-v3 >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target lattice lattice_cuda_tests

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu-bundle/bin" "$stage/gpu-bundle/lib"
for b in lattice lattice_cuda_tests; do
  strip -o "$stage/gpu-bundle/bin/$b" "$BUILD/$b"
done
# Every resolved dependency except glibc's own libraries, the dynamic loader and CUDA's
# (the GPU machine has its own driver and toolkit).
ldd "$BUILD/lattice" "$BUILD/lattice_cuda_tests" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libcuda.so.*|libnccl.so.*) continue ;;
  esac
  cp -L "$lib" "$stage/gpu-bundle/lib/"
done
{ git rev-parse --short HEAD 2>/dev/null || echo unknown; } | tr -d '\n' >"$stage/gpu-bundle/COMMIT"
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || echo -n " + uncommitted changes" >>"$stage/gpu-bundle/COMMIT"
tar -C "$stage" -cJf "$OUTFILE" gpu-bundle
echo "gpu-bundle: $OUTFILE ($(du -h "$OUTFILE" | cut -f1)): $(ls "$stage/gpu-bundle/bin" "$stage/gpu-bundle/lib" | tr '\n' ' ')"
