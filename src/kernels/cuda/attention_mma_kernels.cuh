// The tensor-core flash attention's kernels (attention_mma.cu has the design and the
// launches), templated on the operand format F, which provides
//   float F::round(float)                      the value rounded to the format
//   uint32_t F::pack(float lo, float hi)       two rounded values, lo in the low half
//   void F::mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
//                                              d += a b, mma.m16n8k16 fragments
// attention_mma.cu instantiates them with the PTX mma.sync (under the SIMT emulation,
// tests/simt/, with a software mma of the PTX ISA's fragment layout, so the indexing,
// masks, online softmax and dropout here are checked without a GPU).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace lattice::cuda::attention_mma_detail {

using namespace attention_detail;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Two 16-bit values at an even element offset of shared memory, as one register.
__device__ __forceinline__ uint32_t ld2(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The A fragment of rows r0..r0+15, columns k0..k0+15 of a row-major [rows][ld] tile.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* s, int ld, int r0, int k0, int g,
                                       int q) {
  a[0] = ld2(s + (r0 + g) * ld + k0 + 2 * q);
  a[1] = ld2(s + (r0 + g + 8) * ld + k0 + 2 * q);
  a[2] = ld2(s + (r0 + g) * ld + k0 + 8 + 2 * q);
  a[3] = ld2(s + (r0 + g + 8) * ld + k0 + 8 + 2 * q);
}
// The B fragment of columns n0..n0+7, k k0..k0+15, from a tile stored [n][ld] (each
// column's k values contiguous): B[k][n] = s[n0 + n][k0 + k].
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const uint16_t* s, int ld, int n0, int k0,
                                       int g, int q) {
  b0 = ld2(s + (n0 + g) * ld + k0 + 2 * q);
  b1 = ld2(s + (n0 + g) * ld + k0 + 8 + 2 * q);
}
// The A fragment over 16 columns 16kk.. made of the C fragments of n-tiles 2kk, 2kk+1.
template <typename F>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = F::pack(c0[0], c0[1]);
  a[1] = F::pack(c0[2], c0[3]);
  a[2] = F::pack(c1[0], c1[1]);
  a[3] = F::pack(c1[2], c1[3]);
}

// Elements d..d+3 of the row at offset off of src: fp32, or a packed qkv input's y + bias
// (the fp32 sums bias_add makes; bias_at: the bias of element d), as qkv_at reads them.
__device__ __forceinline__ float4 load4(const AttentionOperand& src, int64_t off, const float* bias_at) {
  if (src.fp32) return *reinterpret_cast<const float4*>(src.fp32 + off);
  const uint2 y = *reinterpret_cast<const uint2*>(src.bf16 + off);
  float4 v = make_float4(math::bf16_to_fp32(uint16_t(y.x & 0xffffu)), math::bf16_to_fp32(uint16_t(y.x >> 16)),
                         math::bf16_to_fp32(uint16_t(y.y & 0xffffu)), math::bf16_to_fp32(uint16_t(y.y >> 16)));
  if (bias_at) {
    v.x = __fadd_rn(v.x, bias_at[0]);
    v.y = __fadd_rn(v.y, bias_at[1]);
    v.z = __fadd_rn(v.z, bias_at[2]);
    v.w = __fadd_rn(v.w, bias_at[3]);
  }
  return v;
}

// The column sums of a backward block's 64 rows of one part (q, k or v) of dqkv, as the
// block holds them in C fragments: warp w rows 16w..16w+15, this lane rows g and g + 8 (those
// with valid[r]) and columns n*8 + 2q + {0, 1}, the stored value being factor * v[n][2r + j]
// (rounded on its own, as when stored). The lane's two rows, then the 8 lanes of each q
// (xor shuffles), then the 4 warps in order, into dst[0, ND * 8): one owner and a fixed order
// per sum. Every thread of the block calls it (it synchronizes); red is block shared memory.
template <int ND>
__device__ __forceinline__ void block_column_sums(float* dst, const float (&v)[ND][4], float factor,
                                                  const bool (&valid)[2], float (&red)[kWarps][ND * 8]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q = lane % 4;
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float top = valid[0] ? __fmul_rn(factor, v[n][j]) : 0.0f;
      const float bottom = valid[1] ? __fmul_rn(factor, v[n][2 + j]) : 0.0f;
      float s = __fadd_rn(top, bottom);
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 4));
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 8));
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 16));
      if (lane < 4) red[warp][n * 8 + 2 * q + j] = s;
    }
  __syncthreads();
  for (int d = threadIdx.x; d < ND * 8; d += kThreads) {
    float s = red[0][d];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s = __fadd_rn(s, red[w][d]);
    dst[d] = s;
  }
  __syncthreads();  // red may be written again
}

// Two gradient values and their bf16 casts at an even element offset (the backward's
// optional bf16 dqkv).
__device__ __forceinline__ void store_bf16x2(uint16_t* dst, float2 v) {
  *reinterpret_cast<uint32_t*>(dst) = uint32_t(math::fp32_to_bf16(v.x)) | (uint32_t(math::fp32_to_bf16(v.y)) << 16);
}

// Rows t0..t0+rows-1 of one slot of qkv [B,T,G,R+2,D] (fp32 or packed; QkvLayout::slot), or
// when slot < 0 of head h of a [B,T,H,D] tensor (fp32 or bf16), into shared memory as 16-bit
// values: row-major dst[r * ld + d] and/or transposed dst_t[d * ld_t + r] (either may be
// null). Rows past T are zeros (a masked probability is 0, and 0 x garbage could be NaN).
template <typename F, int D>
__device__ void load_rows(uint16_t* dst, int ld, uint16_t* dst_t, int ld_t, const AttentionOperand& src, const Params& p,
                          int64_t b, int64_t h, int64_t t0, int rows, int64_t slot) {
  constexpr int V = D / 4;  // float4 per row
  const float* bias = slot >= 0 && !src.fp32 && src.bias ? src.bias + slot * D : nullptr;
  for (int e = threadIdx.x; e < rows * V; e += kThreads) {
    const int r = e / V, d = (e % V) * 4;
    const int64_t t = t0 + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < p.T) {
      const int64_t off = slot >= 0 ? qkv_row(p, b, t) + slot * D : out_row(p, b, h, t);
      v = load4(src, off + d, bias ? bias + d : nullptr);
    }
    const uint32_t lo = F::pack(v.x, v.y), hi = F::pack(v.z, v.w);
    if (dst) *reinterpret_cast<uint2*>(dst + r * ld + d) = make_uint2(lo, hi);
    if (dst_t) {
      dst_t[(d + 0) * ld_t + r] = uint16_t(lo & 0xffffu);
      dst_t[(d + 1) * ld_t + r] = uint16_t(lo >> 16);
      dst_t[(d + 2) * ld_t + r] = uint16_t(hi & 0xffffu);
      dst_t[(d + 3) * ld_t + r] = uint16_t(hi >> 16);
    }
  }
}

// Whether probability (i, j) exists: both inside the sequence, causal, in the window, same document.
__device__ __forceinline__ bool live(const Params& p, int64_t b, int64_t i, int64_t j) {
  return i < p.T && j < p.T && visible(p, b, i, j);
}

// Max and sum over the 4 lanes of a quad (the lanes holding one row of a C fragment).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ---------------------------------------------------------------------------------------
// Forward. Shared: Qs [64][D+8], Ks [64][D+8], Vt [D][64+8].
constexpr int kFwdRows = 64, kFwdKeys = 64;

template <int D>
constexpr size_t forward_smem() {
  return size_t(kFwdRows * (D + 8) + kFwdKeys * (D + 8) + D * (kFwdKeys + 8)) * sizeof(uint16_t);
}

template <typename F, int D>
__global__ void __launch_bounds__(kThreads) mma_forward_kernel(float* out, float* lse, AttentionOperand qkv, Params p) {
  constexpr int LD = D + 8, LDV = kFwdKeys + 8, KD = D / 16, ND = D / 8, NS = kFwdKeys / 8;
  LATTICE_DYNAMIC_SHARED(unsigned char, smem_raw);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* Ks = Qs + kFwdRows * LD;
  uint16_t* Vt = Ks + kFwdKeys * LD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int64_t sq = p.L.slot(h, 0), sk = p.L.slot(h, 1);  // the head's query, its group's key (value: sk + 1)
  const int64_t q_tiles = (p.T + kFwdRows - 1) / kFwdRows;
  const int64_t i0 = (q_tiles - 1 - int64_t(blockIdx.x)) * kFwdRows;  // longest tiles first
  const int64_t i1 = i0 + kFwdRows < p.T ? i0 + kFwdRows : p.T;
  const int r0 = warp * 16;
  const int64_t row[2] = {i0 + r0 + g, i0 + r0 + g + 8};  // this lane's two query rows

  load_rows<F, D>(Qs, LD, nullptr, 0, qkv, p, b, h, i0, kFwdRows, sq);
  __syncthreads();
  uint32_t qf[KD][4];
#pragma unroll
  for (int kc = 0; kc < KD; ++kc) load_a(qf[kc], Qs, LD, r0, kc * 16, g, q);

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of the row's scores, log2 domain
  float l[2] = {0.0f, 0.0f};            // this lane's part of the row's sum of exp2(s - m)
  if (p.sink) {  // the sink's term to start from: its logit the max, exp2(0) = 1 in one lane of the quad
    m[0] = m[1] = p.sink[h] * kLog2e;
    l[0] = l[1] = q == 0 ? 1.0f : 0.0f;
  }
  const float scale2 = p.scale * kLog2e;

  // From the key tile of the first row's window (the tiles before it are wholly masked).
  for (int64_t j0 = first_key(p, i0) / kFwdKeys * kFwdKeys; j0 < i1; j0 += kFwdKeys) {
    __syncthreads();  // the previous tile is no longer read
    load_rows<F, D>(Ks, LD, nullptr, 0, qkv, p, b, h, j0, kFwdKeys, sk);
    load_rows<F, D>(nullptr, 0, Vt, LDV, qkv, p, b, h, j0, kFwdKeys, sk + 1);
    __syncthreads();
    if (j0 > i0 + r0 + 15) continue;  // every key after every row of this warp (uniform)

    float s[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < KD; ++kc) {
        uint32_t b0, b1;
        load_b(b0, b1, Ks, LD, n * 8, kc * 16, g, q);
        F::mma(s[n], qf[kc], b0, b1);
      }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = j0 + n * 8 + 2 * q + (e & 1);
        s[n][e] = live(p, b, row[e >> 1], j) ? s[n][e] * scale2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      base[r] = mx[r] == -INFINITY ? 0.0f : mx[r];  // no live key so far: exp2(-inf - 0) = 0
      const float alpha = exp2f(m[r] - base[r]);    // 0 on the row's first live tile
      m[r] = mx[r];
      l[r] *= alpha;
#pragma unroll
      for (int n = 0; n < ND; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pr = exp2f(s[n][e] - base[e >> 1]);
        l[e >> 1] += pr;
        if (p.dropout && pr != 0.0f) pr *= dropout_factor(p, b, h, row[e >> 1], j0 + n * 8 + 2 * q + (e & 1));
        s[n][e] = pr;
      }
#pragma unroll
    for (int kk = 0; kk < kFwdKeys / 16; ++kk) {
      uint32_t a[4];
      c_to_a<F>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < ND; ++n) {
        uint32_t b0, b1;
        load_b(b0, b1, Vt, LDV, n * 8, kk * 16, g, q);
        F::mma(o[n], a, b0, b1);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(l[r]);
    if (row[r] >= p.T) continue;
    const float inv = 1.0f / sum;
    const int64_t off = out_row(p, b, h, row[r]);
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      const float2 o2 = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      *reinterpret_cast<float2*>(out + off + n * 8 + 2 * q) = o2;
      if (p.out16) store_bf16x2(p.out16 + off + n * 8 + 2 * q, o2);
    }
    if (q == 0) lse[bh * p.T + row[r]] = (m[r] + log2f(sum)) * kLn2;
  }
}

// ---------------------------------------------------------------------------------------
// D_i = dO_i . O_i for every row (b, h, i), into di [B*H, T], with dO rounded to the
// format as everywhere else; one warp per row.
template <typename F>
__global__ void __launch_bounds__(kThreads) row_dot_kernel(float* di, AttentionOperand dout, const float* out, Params p) {
  const int64_t rows = p.B * p.H * p.T;
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t bh = r / p.T, t = r % p.T, b = bh / p.H, h = bh % p.H;
  const int64_t o = out_row(p, b, h, t);
  float acc = 0.0f;
  for (int d = lane; d < p.D; d += 32) acc += out[o + d] * F::round(operand_at(dout, o + d));
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  if (lane == 0) di[r] = acc;
}

// ---------------------------------------------------------------------------------------
// Backward dK, dV. Shared: Ks, Vs [64][D+8]; per query tile Qs, dOs [32][D+8],
// Qt, dOt [D][32+8], lse and D_i [32].
constexpr int kKvKeys = 64, kKvRows = 32;

template <int D>
constexpr size_t dkv_smem() {
  return size_t(2 * kKvKeys * (D + 8) + 2 * kKvRows * (D + 8) + 2 * D * (kKvRows + 8)) * sizeof(uint16_t) +
         2 * kKvRows * sizeof(float);
}

template <typename F, int D>
__global__ void __launch_bounds__(kThreads)
    mma_backward_dkv_kernel(float* dqkv, AttentionOperand dout, AttentionOperand qkv, const float* lse, const float* di,
                            Params p) {
  constexpr int LD = D + 8, LDT = kKvRows + 8, KD = D / 16, ND = D / 8, NQ = kKvRows / 8;
  LATTICE_DYNAMIC_SHARED(unsigned char, smem_raw);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* Vs = Ks + kKvKeys * LD;
  uint16_t* Qs = Vs + kKvKeys * LD;
  uint16_t* dOs = Qs + kKvRows * LD;
  uint16_t* Qt = dOs + kKvRows * LD;
  uint16_t* dOt = Qt + D * LDT;
  float* lse_s = reinterpret_cast<float*>(dOt + D * LDT);
  float* di_s = lse_s + kKvRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int64_t bg = blockIdx.y, b = bg / p.L.G, group = bg % p.L.G, R = p.L.R();
  const int64_t sk = p.L.kv_slot(group, 1);  // the group's key (value: sk + 1)
  const int64_t j0 = int64_t(blockIdx.x) * kKvKeys;  // early key tiles see the most queries: first
  const int c0 = warp * 16;
  const int64_t key[2] = {j0 + c0 + g, j0 + c0 + g + 8};  // this lane's two keys (rows of S^T)

  load_rows<F, D>(Ks, LD, nullptr, 0, qkv, p, b, 0, j0, kKvKeys, sk);
  load_rows<F, D>(Vs, LD, nullptr, 0, qkv, p, b, 0, j0, kKvKeys, sk + 1);

  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  const float scale2 = p.scale * kLog2e;

  for (int64_t h = group * R; h < (group + 1) * R; ++h) {
    const int64_t bh = b * p.H + h, sq = p.L.slot(h, 0);
    for (int64_t i0 = j0; i0 < p.T; i0 += kKvRows) {
      if (first_key(p, i0) >= j0 + kKvKeys) break;  // this and later query tiles start past the keys (uniform)
      __syncthreads();  // the previous query tile is no longer read
      load_rows<F, D>(Qs, LD, Qt, LDT, qkv, p, b, h, i0, kKvRows, sq);
      load_rows<F, D>(dOs, LD, dOt, LDT, dout, p, b, h, i0, kKvRows, -1);
      for (int r = threadIdx.x; r < kKvRows; r += kThreads) {
        const bool in = i0 + r < p.T;
        lse_s[r] = in ? lse[bh * p.T + i0 + r] * kLog2e : 0.0f;
        di_s[r] = in ? di[bh * p.T + i0 + r] : 0.0f;
      }
      __syncthreads();
      if (j0 + c0 > i0 + kKvRows - 1) continue;  // every query before every key of this warp (uniform)

      float st[NQ][4], dpt[NQ][4];  // S^T and dP^T: rows = this warp's keys, columns = queries
#pragma unroll
      for (int n = 0; n < NQ; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < KD; ++kc) {
        uint32_t ak[4], av[4];
        load_a(ak, Ks, LD, c0, kc * 16, g, q);
        load_a(av, Vs, LD, c0, kc * 16, g, q);
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
          uint32_t b0, b1;
          load_b(b0, b1, Qs, LD, n * 8, kc * 16, g, q);
          F::mma(st[n], ak, b0, b1);
          load_b(b0, b1, dOs, LD, n * 8, kc * 16, g, q);
          F::mma(dpt[n], av, b0, b1);
        }
      }
      // st <- P^T with dropout (for dV), dpt <- dS^T.
#pragma unroll
      for (int n = 0; n < NQ; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + 2 * q + (e & 1);  // query column in the tile
          const int64_t i = i0 + c, j = key[e >> 1];
          float pr = 0.0f, dp = dpt[n][e];
          if (live(p, b, i, j)) pr = exp2f(st[n][e] * scale2 - lse_s[c]);
          float pd = pr;
          if (p.dropout && pr != 0.0f) {
            const float f = dropout_factor(p, b, h, i, j);
            pd = pr * f;
            dp *= f;
          }
          st[n][e] = pd;
          dpt[n][e] = pr * (dp - di_s[c]);
        }
#pragma unroll
      for (int kk = 0; kk < kKvRows / 16; ++kk) {
        uint32_t ap[4], ads[4];
        c_to_a<F>(ap, st[2 * kk], st[2 * kk + 1]);
        c_to_a<F>(ads, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < ND; ++n) {
          uint32_t b0, b1;
          load_b(b0, b1, dOt, LDT, n * 8, kk * 16, g, q);
          F::mma(dv[n], ap, b0, b1);
          load_b(b0, b1, Qt, LDT, n * 8, kk * 16, g, q);
          F::mma(dk[n], ads, b0, b1);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= p.T) continue;
    const int64_t row = qkv_row(p, b, key[r]) + sk * D;
    float* dst = dqkv + row;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      const int d = n * 8 + 2 * q;
      const float2 k2 = make_float2(p.scale * dk[n][2 * r], p.scale * dk[n][2 * r + 1]);
      const float2 v2 = make_float2(dv[n][2 * r], dv[n][2 * r + 1]);
      if (!p.dbias_partial) {
        *reinterpret_cast<float2*>(dst + d) = k2;
        *reinterpret_cast<float2*>(dst + D + d) = v2;
      }
      if (p.dqkv16) {
        store_bf16x2(p.dqkv16 + row + d, k2);
        store_bf16x2(p.dqkv16 + row + D + d, v2);
      }
    }
  }
  if (p.dbias_partial) {  // the bias gradient's share of this tile's keys, for k and v
    __shared__ float red[kWarps][D];
    const bool valid[2] = {key[0] < p.T, key[1] < p.T};
    const int64_t tile = b * ((p.T + kKvKeys - 1) / kKvKeys) + int64_t(blockIdx.x);
    float* dst = p.dbias_partial + tile * p.L.width() + sk * D;
    block_column_sums<ND>(dst, dk, p.scale, valid, red);
    block_column_sums<ND>(dst + D, dv, 1.0f, valid, red);
  }
}

// ---------------------------------------------------------------------------------------
// Backward dQ. Shared: Qs, dOs [64][D+8]; per key tile Ks, Vs [32][D+8], Kt [D][32+8].
constexpr int kDqRows = 64, kDqKeys = 32;

template <int D>
constexpr size_t dq_smem() {
  return size_t(2 * kDqRows * (D + 8) + 2 * kDqKeys * (D + 8) + D * (kDqKeys + 8)) * sizeof(uint16_t);
}

template <typename F, int D>
__global__ void __launch_bounds__(kThreads)
    mma_backward_dq_kernel(float* dqkv, AttentionOperand dout, AttentionOperand qkv, const float* lse, const float* di,
                           Params p) {
  constexpr int LD = D + 8, LDT = kDqKeys + 8, KD = D / 16, ND = D / 8, NK = kDqKeys / 8;
  LATTICE_DYNAMIC_SHARED(unsigned char, smem_raw);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* dOs = Qs + kDqRows * LD;
  uint16_t* Ks = dOs + kDqRows * LD;
  uint16_t* Vs = Ks + kDqKeys * LD;
  uint16_t* Kt = Vs + kDqKeys * LD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int64_t bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int64_t sq = p.L.slot(h, 0), sk = p.L.slot(h, 1);  // the head's query, its group's key (value: sk + 1)
  const int64_t q_tiles = (p.T + kDqRows - 1) / kDqRows;
  const int64_t i0 = (q_tiles - 1 - int64_t(blockIdx.x)) * kDqRows;  // longest tiles first
  const int64_t i1 = i0 + kDqRows < p.T ? i0 + kDqRows : p.T;
  const int r0 = warp * 16;
  const int64_t row[2] = {i0 + r0 + g, i0 + r0 + g + 8};
  float lse_r[2], di_r[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool in = row[r] < p.T;
    lse_r[r] = in ? lse[bh * p.T + row[r]] * kLog2e : 0.0f;
    di_r[r] = in ? di[bh * p.T + row[r]] : 0.0f;
  }

  load_rows<F, D>(Qs, LD, nullptr, 0, qkv, p, b, h, i0, kDqRows, sq);
  load_rows<F, D>(dOs, LD, nullptr, 0, dout, p, b, h, i0, kDqRows, -1);

  float dq[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  const float scale2 = p.scale * kLog2e;

  for (int64_t j0 = first_key(p, i0) / kDqKeys * kDqKeys; j0 < i1; j0 += kDqKeys) {
    __syncthreads();  // the previous key tile is no longer read (and Qs, dOs are in)
    load_rows<F, D>(Ks, LD, Kt, LDT, qkv, p, b, h, j0, kDqKeys, sk);
    load_rows<F, D>(Vs, LD, nullptr, 0, qkv, p, b, h, j0, kDqKeys, sk + 1);
    __syncthreads();
    if (j0 > i0 + r0 + 15) continue;  // every key after every row of this warp (uniform)

    float s[NK][4], dp[NK][4];
#pragma unroll
    for (int n = 0; n < NK; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < KD; ++kc) {
      uint32_t aq[4], ao[4];
      load_a(aq, Qs, LD, r0, kc * 16, g, q);
      load_a(ao, dOs, LD, r0, kc * 16, g, q);
#pragma unroll
      for (int n = 0; n < NK; ++n) {
        uint32_t b0, b1;
        load_b(b0, b1, Ks, LD, n * 8, kc * 16, g, q);
        F::mma(s[n], aq, b0, b1);
        load_b(b0, b1, Vs, LD, n * 8, kc * 16, g, q);
        F::mma(dp[n], ao, b0, b1);
      }
    }
    // s <- dS
#pragma unroll
    for (int n = 0; n < NK; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = row[e >> 1], j = j0 + n * 8 + 2 * q + (e & 1);
        float pr = 0.0f, g_p = dp[n][e];
        if (live(p, b, i, j)) pr = exp2f(s[n][e] * scale2 - lse_r[e >> 1]);
        if (p.dropout && pr != 0.0f) g_p *= dropout_factor(p, b, h, i, j);
        s[n][e] = pr * (g_p - di_r[e >> 1]);
      }
#pragma unroll
    for (int kk = 0; kk < kDqKeys / 16; ++kk) {
      uint32_t a[4];
      c_to_a<F>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < ND; ++n) {
        uint32_t b0, b1;
        load_b(b0, b1, Kt, LDT, n * 8, kk * 16, g, q);
        F::mma(dq[n], a, b0, b1);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.T) continue;
    const int64_t off = qkv_row(p, b, row[r]) + sq * D;
    float* dst = dqkv + off;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      const float2 q2 = make_float2(p.scale * dq[n][2 * r], p.scale * dq[n][2 * r + 1]);
      if (!p.dbias_partial) *reinterpret_cast<float2*>(dst + n * 8 + 2 * q) = q2;
      if (p.dqkv16) store_bf16x2(p.dqkv16 + off + n * 8 + 2 * q, q2);
    }
  }
  if (p.dbias_partial) {  // the bias gradient's share of this tile's rows, for q
    static_assert(kDqRows == kKvKeys, "both backward kernels' tiles index the same partial rows");
    __shared__ float red[kWarps][D];
    const bool valid[2] = {row[0] < p.T, row[1] < p.T};
    const int64_t tile = b * q_tiles + i0 / kDqRows;
    block_column_sums<ND>(p.dbias_partial + tile * p.L.width() + sq * D, dq, p.scale, valid, red);
  }
}

}  // namespace lattice::cuda::attention_mma_detail
