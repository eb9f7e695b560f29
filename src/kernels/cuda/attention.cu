// Causal flash attention on the GPU, fp32, with the CPU kernel's definition
// (kernels/attention.h): online softmax over key tiles held in shared memory, only the
// log-sum-exp per query row saved, never a T x T tensor in global memory.
//
// Tiles are 32 query rows by 32 keys, so one warp lane stands for one key (or one query
// row) of a tile, and a block of 4 warps gives each warp 8 rows (or 8 keys) of its tile.
// Row statistics stay in registers, reductions over a tile's keys are warp shuffles,
// and the output (or gradient) rows a warp owns stay in registers, each lane holding
// the elements d = lane + 32*m (m < NC = ceil(D/32) <= 8).
//
//   forward      block = (query tile, b*H+h): loops over key tiles up to the diagonal (from the
//                first row's window with --window-size).
//   backward dKV block = (key tile, b*G+g): for each head of group g, loops over query
//                tiles from the diagonal on, accumulating dK and dV of the group's keys
//                (FlashAttention-2 order; a group is one head without grouped-query attention).
//   backward dQ  block = (query tile, b*H+h): loops over key tiles up to the diagonal,
//                accumulating dQ of its rows.
// Each output element has one owner block and a fixed summation order, so results are
// the same run to run (no atomics). D_i = dO_i . O_i is recomputed where needed.
//
// Context parallelism (ContextKeys): the keys and values come from the gathered kv [B, Tk, G, 2, D]
// (key_at), each query row sits at its position in the sequence (position(); causality and the
// dropout index use it), the dK/dV blocks cover the Tk keys and write dkv.
//
// A faster version would run the two products of each tile on tensor cores (bf16 MMA
// with fp32 accumulation, larger tiles, K/V loads pipelined with cp.async/TMA), or call
// cuDNN's SDPA through its graph API; which one to choose is for a measurement on the
// GPU. This first version favours simplicity and exactness over speed.
#include "kernels/cuda/attention.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace lattice::cuda {

namespace {

using namespace attention_detail;

constexpr int kTile = 32;                      // query rows and keys per tile (= warp size)
constexpr int kWarps = 4;
constexpr int kThreads = kTile * kWarps;       // 128
constexpr int kSlots = kTile / kWarps;         // rows (or keys) per warp: 8
constexpr int kPad = kTile + 1;                // transposed tiles are [D][kPad]: no bank conflicts
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
// Butterfly sum: lanes x and x^o add the same two values at every step, so every lane
// ends with the same bits.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

struct IdRange {
  int32_t lo, hi;
};
// The document-id range of rows [t0, t0+n) of batch row b (n <= 32) of ids [B, len] (the queries'
// doc [B, T], or the keys' kdoc [B, Tk]), known to every lane.
__device__ IdRange id_range(const int32_t* ids, int64_t len, int64_t b, int64_t t0, int n) {
  const int lane = threadIdx.x % 32;
  const int32_t id = ids[b * len + t0 + (lane < n ? lane : 0)];
  int32_t lo = id, hi = id;
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(kFull, lo, o));
    hi = max(hi, __shfl_xor_sync(kFull, hi, o));
  }
  return {lo, hi};
}
// Rows of a tile that starts where `left` rows remain: min(kTile, left).
__device__ __forceinline__ int tile_len(int64_t left) { return left < kTile ? int(left) : kTile; }
__device__ __forceinline__ bool disjoint(IdRange a, IdRange b) { return a.hi < b.lo || b.hi < a.lo; }

// ---------------------------------------------------------------------------------------
// Forward. Shared: Q [kTile][D], Kt [D][kPad] (keys transposed), V [kTile][D].
// Warp w owns query rows r = w + kWarps*k; lane c is key j0 + c of the current tile.
template <int NC>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(float* out, float* lse, AttentionOperand qkv, Params p) {
  LATTICE_DYNAMIC_SHARED(float, smem);
  const int D = int(p.D);
  float* Qs = smem;
  float* Kt = Qs + kTile * D;
  float* Vs = Kt + D * kPad;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int64_t sq = p.L.slot(h, 0), sk = p.L.slot(h, 1);  // the head's query, its group's key (value: sk + 1)
  const int64_t g = h / p.L.R();
  const int64_t q_tiles = (p.T + kTile - 1) / kTile;
  const int64_t i0 = (q_tiles - 1 - int64_t(blockIdx.x)) * kTile;  // longest tiles first
  const int nq = tile_len(p.T - i0);
  const int64_t keys_end = position(p, i0 + nq - 1) + 1;  // the tile's last row sees the most keys
  const int64_t keys_begin = first_key(p, i0) / kTile * kTile;  // and its first row the earliest

  for (int e = threadIdx.x; e < nq * D; e += kThreads)
    Qs[e] = qkv_at(qkv, p, qkv_row(p, b, i0 + e / D), sq, e % D);
  const IdRange q_ids = p.doc ? id_range(p.doc, p.T, b, i0, nq) : IdRange{0, 0};

  float acc[kSlots][NC];
  float row_m[kSlots], row_l[kSlots];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    row_m[k] = p.sink ? p.sink[h] : -INFINITY;  // the online softmax starts from the sink's term
    row_l[k] = p.sink ? 1.0f : 0.0f;
#pragma unroll
    for (int m = 0; m < NC; ++m) acc[k][m] = 0.0f;
  }

  for (int64_t j0 = keys_begin; j0 < keys_end; j0 += kTile) {
    const int nk = tile_len(keys_end - j0);
    // Every thread computes the same range, so the skip is uniform over the block.
    if (p.doc && disjoint(q_ids, id_range(p.kdoc, p.Tk, b, j0, nk))) continue;
    __syncthreads();  // the previous tile is no longer read
    for (int e = threadIdx.x; e < nk * D; e += kThreads) {
      const int c = e / D, d = e % D;
      Kt[d * kPad + c] = key_at(qkv, p, b, j0 + c, g, sk, 0, d);
      Vs[c * D + d] = key_at(qkv, p, b, j0 + c, g, sk, 1, d);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int r = warp + kWarps * k;
      if (r >= nq) continue;  // uniform over the warp
      const int64_t i = i0 + r, j = j0 + lane;
      const bool live = lane < nk && visible(p, b, i, j);
      float s = -INFINITY;
      if (live) {
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot += Qs[r * D + d] * Kt[d * kPad + lane];
        s = dot * p.scale;
      }
      const float mx = fmaxf(row_m[k], warp_max(s));
      if (mx == -INFINITY) continue;  // no visible key of this row so far (uniform)
      const float alpha = expf(row_m[k] - mx);  // 0 on the row's first live tile
      float e = live ? expf(s - mx) : 0.0f;
      row_l[k] = row_l[k] * alpha + warp_sum(e);
      row_m[k] = mx;
      if (p.dropout && live) e *= dropout_factor(p, b, h, i, j);
      float t[NC];
#pragma unroll
      for (int m = 0; m < NC; ++m) t[m] = 0.0f;
      for (int c = 0; c < nk; ++c) {
        const float pc = __shfl_sync(kFull, e, c);
#pragma unroll
        for (int m = 0; m < NC; ++m) {
          const int d = lane + 32 * m;
          if (d < D) t[m] += pc * Vs[c * D + d];
        }
      }
#pragma unroll
      for (int m = 0; m < NC; ++m) acc[k][m] = acc[k][m] * alpha + t[m];
    }
  }

#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int r = warp + kWarps * k;
    if (r >= nq) continue;
    const int64_t i = i0 + r;
    const float inv = 1.0f / row_l[k];
    const int64_t row = out_row(p, b, h, i);
#pragma unroll
    for (int m = 0; m < NC; ++m) {
      const int d = lane + 32 * m;
      if (d < D) {
        const float v = acc[k][m] * inv;
        out[row + d] = v;
        if (p.out16) p.out16[row + d] = math::fp32_to_bf16(v);
      }
    }
    if (lane == 0) lse[bh * p.T + i] = row_m[k] + logf(row_l[k]);
  }
}

// ---------------------------------------------------------------------------------------
// Backward, dK and dV, one block per (key tile, b*G+g): the group's key and value tile is loaded
// once and its gradient summed over the group's heads (in head order, query tiles in order
// within a head). Shared: K [kTile][D], V [kTile][D], Qt [D][kPad], dOt [D][kPad], Di [kTile].
// Warp w owns keys c = w + kWarps*k; lane r is query row i0 + r.
template <int NC>
__global__ void __launch_bounds__(kThreads)
    backward_dkv_kernel(float* dqkv, AttentionOperand dout, AttentionOperand qkv, const float* out,
                        const float* lse, Params p) {
  LATTICE_DYNAMIC_SHARED(float, smem);
  const int D = int(p.D);
  float* Ks = smem;
  float* Vs = Ks + kTile * D;
  float* Qt = Vs + kTile * D;
  float* dOt = Qt + D * kPad;
  float* Di = dOt + D * kPad;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bg = blockIdx.y, b = bg / p.L.G, g = bg % p.L.G, R = p.L.R();
  const int64_t sk = p.L.kv_slot(g, 1);  // the group's key (value: sk + 1)
  const int64_t j0 = int64_t(blockIdx.x) * kTile;  // early key tiles see the most queries: first
  const int nk = tile_len(p.Tk - j0);

  for (int e = threadIdx.x; e < nk * D; e += kThreads) {
    const int c = e / D, d = e % D;
    Ks[c * D + d] = key_at(qkv, p, b, j0 + c, g, sk, 0, d);
    Vs[c * D + d] = key_at(qkv, p, b, j0 + c, g, sk, 1, d);
  }
  const IdRange k_ids = p.doc ? id_range(p.kdoc, p.Tk, b, j0, nk) : IdRange{0, 0};

  float dk[kSlots][NC], dv[kSlots][NC];
#pragma unroll
  for (int k = 0; k < kSlots; ++k)
#pragma unroll
    for (int m = 0; m < NC; ++m) dk[k][m] = dv[k][m] = 0.0f;

  for (int64_t h = g * R; h < (g + 1) * R; ++h) {
    const int64_t bh = b * p.H + h, sq = p.L.slot(h, 0);
    // Query tiles whose last row sees key j0 (without a context: from the diagonal tile on).
    for (int64_t i0 = p.kv ? 0 : j0; i0 < p.T; i0 += kTile) {
      const int nq = tile_len(p.T - i0);
      if (position(p, i0 + nq - 1) < j0) continue;                      // uniform
      if (first_key(p, i0) >= j0 + nk) continue;                        // before the window (uniform)
      if (p.doc && disjoint(k_ids, id_range(p.doc, p.T, b, i0, nq))) continue;  // uniform
      __syncthreads();  // the previous query tile is no longer read
      for (int e = threadIdx.x; e < nq * D; e += kThreads) {
        const int r = e / D, d = e % D;
        Qt[d * kPad + r] = qkv_at(qkv, p, qkv_row(p, b, i0 + r), sq, d);
        dOt[d * kPad + r] = operand_at(dout, out_row(p, b, h, i0 + r) + d);
      }
      // D_i = dO_i . O_i for the tile's rows, one warp per row.
      for (int r = warp; r < nq; r += kWarps) {
        const int64_t o = out_row(p, b, h, i0 + r);
        float acc = 0.0f;
        for (int d = lane; d < D; d += 32) acc += out[o + d] * operand_at(dout, o + d);
        acc = warp_sum(acc);
        if (lane == 0) Di[r] = acc;
      }
      __syncthreads();
      const bool row_live = lane < nq;
      const int64_t i = i0 + lane;
      const float lse_i = row_live ? lse[bh * p.T + i] : 0.0f;
      const float di = row_live ? Di[lane] : 0.0f;
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        const int c = warp + kWarps * k;
        if (c >= nk) continue;  // uniform
        const int64_t j = j0 + c;
        const bool live = row_live && visible(p, b, i, j);
        if (!__any_sync(kFull, live)) continue;
        float pr = 0.0f, pd = 0.0f, ds = 0.0f;
        if (live) {
          float s = 0.0f, dp = 0.0f;
          for (int d = 0; d < D; ++d) {
            s += Qt[d * kPad + lane] * Ks[c * D + d];
            dp += dOt[d * kPad + lane] * Vs[c * D + d];
          }
          pr = expf(s * p.scale - lse_i);
          pd = pr;
          if (p.dropout) {
            const float f = dropout_factor(p, b, h, i, j);
            pd = pr * f;
            dp *= f;
          }
          ds = pr * (dp - di);
        }
        float tv[NC], tk[NC];
#pragma unroll
        for (int m = 0; m < NC; ++m) tv[m] = tk[m] = 0.0f;
        for (int r = 0; r < nq; ++r) {
          const float a = __shfl_sync(kFull, pd, r), gs = __shfl_sync(kFull, ds, r);
#pragma unroll
          for (int m = 0; m < NC; ++m) {
            const int d = lane + 32 * m;
            if (d < D) {
              tv[m] += a * dOt[d * kPad + r];
              tk[m] += gs * Qt[d * kPad + r];
            }
          }
        }
#pragma unroll
        for (int m = 0; m < NC; ++m) {
          dv[k][m] += tv[m];
          dk[k][m] += p.scale * tk[m];
        }
      }
    }
  }

#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int c = warp + kWarps * k;
    if (c >= nk) continue;
    if (p.kv) {  // a context's dkv [B, Tk, G, 2, D]
      const int64_t row = ((b * p.Tk + j0 + c) * p.L.G + g) * 2 * D;
#pragma unroll
      for (int m = 0; m < NC; ++m) {
        const int d = lane + 32 * m;
        if (d < D) {
          p.dkv[row + d] = dk[k][m];
          p.dkv[row + D + d] = dv[k][m];
        }
      }
      continue;
    }
    const int64_t row = qkv_row(p, b, j0 + c) + sk * D;
#pragma unroll
    for (int m = 0; m < NC; ++m) {
      const int d = lane + 32 * m;
      if (d < D) {
        store_dqkv(dqkv, p, row + d, dk[k][m]);
        store_dqkv(dqkv, p, row + D + d, dv[k][m]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Backward, dQ. Shared: Q [kTile][D], dO [kTile][D], Kt [D][kPad], Vt [D][kPad].
// Warp w owns query rows r = w + kWarps*k; lane c is key j0 + c of the current tile.
template <int NC>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(float* dqkv, AttentionOperand dout, AttentionOperand qkv, const float* out,
                       const float* lse, Params p) {
  LATTICE_DYNAMIC_SHARED(float, smem);
  const int D = int(p.D);
  float* Qs = smem;
  float* dOs = Qs + kTile * D;
  float* Kt = dOs + kTile * D;
  float* Vt = Kt + D * kPad;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int64_t sq = p.L.slot(h, 0), sk = p.L.slot(h, 1);  // the head's query, its group's key (value: sk + 1)
  const int64_t g = h / p.L.R();
  const int64_t q_tiles = (p.T + kTile - 1) / kTile;
  const int64_t i0 = (q_tiles - 1 - int64_t(blockIdx.x)) * kTile;  // longest tiles first
  const int nq = tile_len(p.T - i0);
  const int64_t keys_end = position(p, i0 + nq - 1) + 1;
  const int64_t keys_begin = first_key(p, i0) / kTile * kTile;

  for (int e = threadIdx.x; e < nq * D; e += kThreads) {
    const int r = e / D, d = e % D;
    Qs[e] = qkv_at(qkv, p, qkv_row(p, b, i0 + r), sq, d);
    dOs[e] = operand_at(dout, out_row(p, b, h, i0 + r) + d);
  }
  const IdRange q_ids = p.doc ? id_range(p.doc, p.T, b, i0, nq) : IdRange{0, 0};
  __syncthreads();

  float dq[kSlots][NC], lse_r[kSlots], di_r[kSlots];
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int r = warp + kWarps * k;
#pragma unroll
    for (int m = 0; m < NC; ++m) dq[k][m] = 0.0f;
    lse_r[k] = di_r[k] = 0.0f;
    if (r >= nq) continue;
    const int64_t o = out_row(p, b, h, i0 + r);
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += out[o + d] * dOs[r * D + d];
    di_r[k] = warp_sum(acc);
    lse_r[k] = lse[bh * p.T + i0 + r];
  }

  for (int64_t j0 = keys_begin; j0 < keys_end; j0 += kTile) {
    const int nk = tile_len(keys_end - j0);
    if (p.doc && disjoint(q_ids, id_range(p.kdoc, p.Tk, b, j0, nk))) continue;  // uniform
    __syncthreads();  // the previous key tile is no longer read
    for (int e = threadIdx.x; e < nk * D; e += kThreads) {
      const int c = e / D, d = e % D;
      Kt[d * kPad + c] = key_at(qkv, p, b, j0 + c, g, sk, 0, d);
      Vt[d * kPad + c] = key_at(qkv, p, b, j0 + c, g, sk, 1, d);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int r = warp + kWarps * k;
      if (r >= nq) continue;  // uniform
      const int64_t i = i0 + r, j = j0 + lane;
      const bool live = lane < nk && visible(p, b, i, j);
      if (!__any_sync(kFull, live)) continue;
      float ds = 0.0f;
      if (live) {
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < D; ++d) {
          s += Qs[r * D + d] * Kt[d * kPad + lane];
          dp += dOs[r * D + d] * Vt[d * kPad + lane];
        }
        const float pr = expf(s * p.scale - lse_r[k]);
        if (p.dropout) dp *= dropout_factor(p, b, h, i, j);
        ds = pr * (dp - di_r[k]);
      }
      float t[NC];
#pragma unroll
      for (int m = 0; m < NC; ++m) t[m] = 0.0f;
      for (int c = 0; c < nk; ++c) {
        const float g = __shfl_sync(kFull, ds, c);
#pragma unroll
        for (int m = 0; m < NC; ++m) {
          const int d = lane + 32 * m;
          if (d < D) t[m] += g * Kt[d * kPad + c];
        }
      }
#pragma unroll
      for (int m = 0; m < NC; ++m) dq[k][m] += p.scale * t[m];
    }
  }

#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int r = warp + kWarps * k;
    if (r >= nq) continue;
    const int64_t row = qkv_row(p, b, i0 + r) + sq * D;
#pragma unroll
    for (int m = 0; m < NC; ++m) {
      const int d = lane + 32 * m;
      if (d < D) store_dqkv(dqkv, p, row + d, dq[k][m]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Host side.
unsigned tiles(int64_t T) { return unsigned((T + kTile - 1) / kTile); }

template <int NC>
void forward_nc(float* out, float* lse, const AttentionOperand& qkv, const Params& p) {
  const size_t bytes = size_t(2 * kTile * p.D + p.D * kPad) * sizeof(float);
  allow_shared(forward_kernel<NC>, bytes, "forward");
  launch(forward_kernel<NC>, dim3(tiles(p.T), unsigned(p.B * p.H)), kThreads, bytes,
      out, lse, qkv, p);
  LATTICE_CUDA_LAUNCHED("attention_forward");
}

template <int NC>
void backward_nc(float* dqkv, const AttentionOperand& dout, const AttentionOperand& qkv, const float* out,
                 const float* lse, const Params& p) {
  const dim3 grid(tiles(p.T), unsigned(p.B * p.H));
  const size_t dkv_bytes = size_t(2 * kTile * p.D + 2 * p.D * kPad + kTile) * sizeof(float);
  allow_shared(backward_dkv_kernel<NC>, dkv_bytes, "backward dK/dV");
  launch(backward_dkv_kernel<NC>, dim3(tiles(p.Tk), unsigned(p.B * p.L.G)), kThreads, dkv_bytes, dqkv, dout, qkv,
         out, lse, p);
  LATTICE_CUDA_LAUNCHED("attention_backward (dK, dV)");
  const size_t dq_bytes = size_t(2 * kTile * p.D + 2 * p.D * kPad) * sizeof(float);
  allow_shared(backward_dq_kernel<NC>, dq_bytes, "backward dQ");
  launch(backward_dq_kernel<NC>, grid, kThreads, dq_bytes, dqkv, dout, qkv, out, lse, p);
  LATTICE_CUDA_LAUNCHED("attention_backward (dQ)");
}

// ---------------------------------------------------------------------------------------
// The sinks' gradient (d_softmax_offset): block (b*H + h) sums -exp(sink[h] - lse_i) (dO_i . O_i) over
// its T rows (one warp per row, the warps' sums in a fixed order), into part [B*H]; then one thread
// per head adds its B parts in order to grad[h]. Deterministic, as the CPU's (which sums in double).
__global__ void __launch_bounds__(kThreads)
    softmax_offset_part_kernel(float* part, AttentionOperand dout, const float* out, const float* lse, Params p) {
  __shared__ float warp_part[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
  const float c = p.sink[h];
  float acc = 0.0f;  // lane 0's running sum of its warp's rows
  for (int64_t i = warp; i < p.T; i += kWarps) {
    const int64_t o = out_row(p, b, h, i);
    float di = 0.0f;
    for (int d = lane; d < p.D; d += 32) di += out[o + d] * operand_at(dout, o + d);
    di = warp_sum(di);
    acc += expf(c - lse[bh * p.T + i]) * di;
  }
  if (lane == 0) warp_part[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_part[w];
    part[bh] = -sum;
  }
}

__global__ void softmax_offset_sum_kernel(float* grad, const float* part, int64_t B, int64_t H) {
  const int64_t h = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float sum = 0.0f;
  for (int64_t b = 0; b < B; ++b) sum += part[b * H + h];
  grad[h] += sum;
}

// The parts' scratch [B*H], grown on demand and kept (the process's one device).
float* softmax_offset_parts(int64_t n) {
  static GrownScratch scratch;
  return scratch.at_least(n);
}

void softmax_offset_backward(float* grad, const AttentionOperand& dout, const float* out, const float* lse,
                             const AttentionShape& s) {
  const Params p = make_params(s, AttentionDropout{}, nullptr);
  float* part = softmax_offset_parts(s.B * s.H);
  launch(softmax_offset_part_kernel, unsigned(s.B * s.H), kThreads, 0, part, dout, out, lse, p);
  LATTICE_CUDA_LAUNCHED("attention_backward (softmax offset, per row)");
  launch(softmax_offset_sum_kernel, unsigned((s.H + 127) / 128), 128, 0, grad, part, s.B, s.H);
  LATTICE_CUDA_LAUNCHED("attention_backward (softmax offset)");
}

// Whether LATTICE_CUDA_ATTENTION=fp32 asks for the fp32 kernels whatever the math.
bool fp32_forced() {
  static const bool forced = [] {
    const char* v = std::getenv("LATTICE_CUDA_ATTENTION");
    if (!v || !*v) return false;
    const std::string s(v);
    LATTICE_CHECK(s == "fp32" || s == "auto")
        << "LATTICE_CUDA_ATTENTION=" << s << ": expected fp32 (the fp32 kernels always) or auto";
    return s == "fp32";
  }();
  return forced;
}

}  // namespace

void attention_forward(float* out, float* lse, const AttentionOperand& qkv, const AttentionShape& s,
                       const AttentionDropout& drop, const int32_t* document_ids, AttentionMath math,
                       uint16_t* out_bf16, const ContextKeys* context) {
  // Context parallelism runs the fp32 kernels (the tensor-core ones read keys from qkv only).
  if (!context && math != AttentionMath::fp32 && !fp32_forced() && attention_mma_supported(s, qkv.data(), out, out))
    return attention_forward_mma(out, lse, qkv, s, drop, document_ids, math, out_bf16);
  Params p = make_params(s, drop, document_ids, context);
  p.out16 = out_bf16;
  switch ((s.D + 31) / 32) {
    case 1: forward_nc<1>(out, lse, qkv, p); break;
    case 2: forward_nc<2>(out, lse, qkv, p); break;
    case 3: forward_nc<3>(out, lse, qkv, p); break;
    case 4: forward_nc<4>(out, lse, qkv, p); break;
    case 5: forward_nc<5>(out, lse, qkv, p); break;
    case 6: forward_nc<6>(out, lse, qkv, p); break;  // 192: multi-latent attention's Dn + Dr (DeepSeek-V3)
    case 7: forward_nc<7>(out, lse, qkv, p); break;
    default: forward_nc<8>(out, lse, qkv, p); break;
  }
}

void attention_backward(float* dqkv, const AttentionOperand& dout, const AttentionOperand& qkv, const float* out,
                        const float* lse, const AttentionShape& s, const AttentionDropout& drop,
                        const int32_t* document_ids, AttentionMath math, uint16_t* dqkv_bf16, float* dbias,
                        const ContextKeys* context, float* d_softmax_offset) {
  LATTICE_CHECK(!context || (context->dkv && !dqkv_bf16 && !dbias))
      << "attention (CUDA): a context-parallel backward writes dkv, and no bf16 cast or bias gradient of dqkv";
  LATTICE_CHECK(!s.gated || (!dqkv_bf16 && !dbias))
      << "attention (CUDA): with output gates, no bf16 cast or bias gradient of dqkv (its gate slots are not written)";
  if (d_softmax_offset && s.softmax_offset) softmax_offset_backward(d_softmax_offset, dout, out, lse, s);
  if (!context && math != AttentionMath::fp32 && !fp32_forced() &&
      attention_mma_supported(s, qkv.data(), dout.data(), dqkv))
    return attention_backward_mma(dqkv, dout, qkv, out, lse, s, drop, document_ids, math, dqkv_bf16, dbias);
  Params p = make_params(s, drop, document_ids, context);
  p.dqkv16 = dqkv_bf16;
  switch ((s.D + 31) / 32) {
    case 1: backward_nc<1>(dqkv, dout, qkv, out, lse, p); break;
    case 2: backward_nc<2>(dqkv, dout, qkv, out, lse, p); break;
    case 3: backward_nc<3>(dqkv, dout, qkv, out, lse, p); break;
    case 4: backward_nc<4>(dqkv, dout, qkv, out, lse, p); break;
    case 5: backward_nc<5>(dqkv, dout, qkv, out, lse, p); break;
    case 6: backward_nc<6>(dqkv, dout, qkv, out, lse, p); break;
    case 7: backward_nc<7>(dqkv, dout, qkv, out, lse, p); break;
    default: backward_nc<8>(dqkv, dout, qkv, out, lse, p); break;
  }
  if (dbias) bias_backward(dbias, dqkv, s.B * s.T, s.layout().width());
}

}  // namespace lattice::cuda
