#include "kernels/attention.h"

#include "core/device.h"
#include "kernels/cuda/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "blas/gemm.h"
#include "core/error.h"
#include "kernels/cast.h"
#include "kernels/cast_math.h"
#include "kernels/elementwise.h"
#include "kernels/cpu/row_sums.h"
#include "kernels/cpu/simd_math.h"

namespace lattice {

namespace {

// Query and key tile sizes: a 64 x 64 score tile (16 KB) and its partners stay in L1/L2.
constexpr int64_t kTile = 64;

// Where the queries sit and where the keys come from: the qkv rows themselves at positions
// 0 .. T-1, or with context parallelism (ContextKeys) the whole sequence's gathered keys and
// values at positions 0 .. Tk-1, the query rows at context.position(i).
// With a window, query row i sees keys first(i) .. position(i) only.
struct Keys {
  const ContextKeys* context;  // null: self-attention over qkv's rows
  int64_t T;                   // the query rows' sequence: T, or Tk
  const AttentionShape* s;
  int64_t position(int64_t i) const { return context ? context->position(i) : i; }
  int64_t first(int64_t i) const { return s->first_key(position(i)); }
};
Keys keys_of(const AttentionShape& s, const ContextKeys* context) {
  return {context, context ? context->Tk : s.T, &s};
}

// Strided views for one (b, h): head h's query in qkv [B,T,G,R+2,D], its group's key and value
// in the key source (qkv itself, or a context's kv [B,Tk,G,2,D]), its rows of out/dout [B,T,H,D].
struct HeadView {
  int64_t ld_qkv, ld_kv, ld_out;  // row (t) strides
  int64_t q_off, k_off, out_off;
  int64_t D;
  float* q(const float* qkv, int64_t t) const { return const_cast<float*>(qkv) + q_off + t * ld_qkv; }
  float* k(const float* kv, int64_t t) const { return const_cast<float*>(kv) + k_off + t * ld_kv; }
  float* v(const float* kv, int64_t t) const { return k(kv, t) + D; }
  float* o(const float* out, int64_t t) const { return const_cast<float*>(out) + out_off + t * ld_out; }
};

HeadView head_view(const AttentionShape& s, const Keys& keys, int64_t b, int64_t h) {
  const QkvLayout L = s.layout();
  const int64_t ld = L.width(), token0 = b * s.T * ld;
  HeadView v{ld, ld, s.H * s.D, token0 + L.slot(h, 0) * s.D, token0 + L.slot(h, 1) * s.D, (b * s.T * s.H + h) * s.D,
             s.D};
  if (keys.context) {
    v.ld_kv = 2 * L.G * s.D;
    v.k_off = b * keys.T * v.ld_kv + (h / L.R()) * 2 * s.D;
  }
  return v;
}

// Index of probability (b, h, i, 0) in the dropout stream: query row i at its position in
// the sequence of keys.T.
uint64_t dropout_row_index(const AttentionShape& s, const Keys& keys, const AttentionDropout& drop, int64_t b,
                           int64_t h, int64_t i) {
  const int64_t heads = drop.total_heads > 0 ? drop.total_heads : s.H;
  return uint64_t(((b * heads + drop.head_offset + h) * keys.T + keys.position(i)) * keys.T) + drop.first_index;
}

void check_args(const AttentionShape& s, const AttentionDropout& drop, const ContextKeys* context,
                const int32_t* document_ids) {
  LATTICE_CHECK(s.B > 0 && s.T > 0 && s.H > 0 && s.D > 0 && s.G >= 0 && (s.G == 0 || s.H % s.G == 0))
      << "attention: bad shape B=" << s.B << " T=" << s.T << " H=" << s.H << " D=" << s.D << " G=" << s.G;
  LATTICE_CHECK(drop.p >= 0.0f && drop.p < 1.0f)
      << "attention: dropout probability " << drop.p << " not in [0, 1)";
  LATTICE_CHECK(s.window >= -1) << "attention: window " << s.window << " (expected -1 or a size >= 0)";
  if (!context) return;
  LATTICE_CHECK(context->kv && !document_ids == !context->key_document_ids && context->split >= 0 &&
                context->split <= s.T &&
                context->shift[0] >= 0 && context->shift[1] >= context->shift[0] &&
                context->position(s.T - 1) < context->Tk)
      << "attention: bad context-parallel keys (Tk=" << context->Tk << " split=" << context->split << " shifts "
      << context->shift[0] << ", " << context->shift[1] << " for T=" << s.T << ", query document ids "
      << (document_ids ? "given" : "none") << ", key document ids " << (context->key_document_ids ? "given" : "none")
      << ")";
}

// Document masking: doc is [T] (this batch row's ids) or null. A query attends a key
// only when their ids are equal, so a key tile is skipped outright when its id range
// does not meet the query tile's (for ids that increase along the sequence, as
// document ids do, that skips every tile of earlier documents).
struct IdRange {
  int32_t lo, hi;
};
IdRange id_range(const int32_t* doc, int64_t t0, int64_t n) {
  IdRange r{doc[t0], doc[t0]};
  for (int64_t t = t0 + 1; t < t0 + n; ++t) {
    r.lo = std::min(r.lo, doc[t]);
    r.hi = std::max(r.hi, doc[t]);
  }
  return r;
}
bool disjoint(const IdRange& a, const IdRange& b) { return a.hi < b.lo || b.hi < a.lo; }

// The fp32 values of an operand: an fp32 one as it is; a bf16 one (with its bias, for qkv)
// widened into `buffer` (rows of `row` values; y + bias, as bias_add computes it). The CPU
// kernels multiply strided fp32 views, so a bf16 operand is widened once per call.
const float* fp32_values(const AttentionOperand& in, int64_t rows, int64_t row, std::vector<float>& buffer) {
  if (in.fp32) return in.fp32;
  LATTICE_CHECK(in.bf16) << "attention: an operand without data";
  buffer.resize(size_t(rows * row));
  const uint16_t* y = in.bf16;
  const float* bias = in.bias;
  float* w = buffer.data();
#pragma omp parallel for schedule(static) if (rows * row > 32768)
  for (int64_t r = 0; r < rows; ++r) cpu::widen_with_bias(w + r * row, y + r * row, bias, row);
  return w;
}
const float* fp32_qkv(const AttentionOperand& qkv, const AttentionShape& s) {
  thread_local std::vector<float> buffer;
  return fp32_values(qkv, s.B * s.T, s.layout().width(), buffer);
}
const float* fp32_dout(const AttentionOperand& dout, const AttentionShape& s) {
  LATTICE_CHECK(!dout.bias) << "attention: an output gradient with a bias";
  thread_local std::vector<float> buffer;
  return fp32_values(dout, s.B * s.T, s.H * s.D, buffer);
}

// Forward for one query tile [i0, i0+nq) of one head, over key tiles up to the
// diagonal, with the online softmax; scratch holds S (kTile^2), O (kTile*D) and the
// row statistics.
void forward_tile(float* out, float* lse_bh, const float* qkv, const float* kv, const AttentionShape& s,
                  const Keys& keys, const AttentionDropout& drop, const int32_t* doc, const int32_t* kdoc, int64_t b,
                  int64_t h, int64_t i0, int64_t nq, float* scratch) {
  const HeadView hv = head_view(s, keys, b, h);
  const int64_t D = s.D;
  const float scale = 1.0f / std::sqrt(float(D));
  const bool dropout = drop.p > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - drop.p) : 1.0f;
  float* S = scratch;                 // [kTile, kTile]
  float* O = S + kTile * kTile;       // [kTile, D]
  float* row_m = O + kTile * D;       // [kTile]
  float* row_l = row_m + kTile;       // [kTile]
  float* mask = row_l + kTile;        // [kTile]
  // The online softmax starts from the sink's term when the head has one: max = its logit, sum = 1.
  const float* sink = s.softmax_offset;
  for (int64_t r = 0; r < nq; ++r) {
    row_m[r] = sink ? sink[h] : -INFINITY;
    row_l[r] = sink ? 1.0f : 0.0f;
  }
  std::fill(O, O + nq * D, 0.0f);
  const int64_t keys_end = keys.position(i0 + nq - 1) + 1;  // the tile's last row sees the most keys
  const int64_t keys_begin = keys.first(i0) / kTile * kTile;  // and its first row the earliest
  const IdRange q_ids = doc ? id_range(doc, i0, nq) : IdRange{0, 0};
  for (int64_t j0 = keys_begin; j0 < keys_end; j0 += kTile) {
    const int64_t nk = std::min(kTile, keys_end - j0);
    if (doc && disjoint(q_ids, id_range(kdoc, j0, nk))) continue;
    gemm_f32(Trans::N, Trans::T, nq, nk, D, scale, hv.q(qkv, i0), hv.ld_qkv, hv.k(kv, j0),
             hv.ld_kv, 0.0f, S, kTile);
    for (int64_t r = 0; r < nq; ++r) {
      const int64_t i = i0 + r;
      float* s_r = S + r * kTile;
      const int64_t count = std::clamp<int64_t>(keys.position(i) - j0 + 1, 0, nk);  // causal: keys j <= i
      const int64_t before = std::clamp<int64_t>(keys.first(i) - j0, 0, count);  // keys before the window
      for (int64_t c = 0; c < before; ++c) s_r[c] = -INFINITY;
      if (doc)  // other documents' keys: -inf, so exp gives exactly 0
        for (int64_t c = 0; c < count; ++c) s_r[c] = kdoc[j0 + c] == doc[i] ? s_r[c] : -INFINITY;
      const float tile_max = cpu::row_max(s_r, count);  // vectorized (a running max is a scalar chain)
      const float mx = tile_max > row_m[r] ? tile_max : row_m[r];
      if (mx == -INFINITY) {  // no key of this row's document so far: nothing to add
        std::fill(s_r, s_r + nk, 0.0f);
        continue;
      }
      const float alpha = simd::exp(row_m[r] - mx);  // 0 on the row's first live tile (-inf)
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < count; ++c) {
        const float e = simd::exp(s_r[c] - mx);
        s_r[c] = e;
        sum += e;
      }
      for (int64_t c = count; c < nk; ++c) s_r[c] = 0.0f;
      row_l[r] = row_l[r] * alpha + sum;
      row_m[r] = mx;
      float* o_r = O + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o_r[d] *= alpha;
      if (dropout && count > 0) {
        simd::dropout_mask(mask, drop.stream, dropout_row_index(s, keys, drop, b, h, i) + uint64_t(j0),
                           count, drop.p, keep_scale);
#pragma omp simd
        for (int64_t c = 0; c < count; ++c) s_r[c] *= mask[c];
      }
    }
    gemm_f32(Trans::N, Trans::N, nq, D, nk, 1.0f, S, kTile, hv.v(kv, j0), hv.ld_kv, 1.0f, O, D);
  }
  for (int64_t r = 0; r < nq; ++r) {
    const float inv = 1.0f / row_l[r];
    float* dst = hv.o(out, i0 + r);
    const float* o_r = O + r * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) dst[d] = o_r[d] * inv;
    lse_bh[i0 + r] = row_m[r] + std::log(row_l[r]);
  }
}

// Backward for one group of heads (FlashAttention-2 order: key tiles outer, then the group's
// heads, then query tiles, so dK and dV of a key tile accumulate locally over every head that
// reads them while each head's dQ accumulates in place). Without grouping a group is one head.
// kv, dkv: the key source and its gradient (qkv and dqkv, or a context's kv and dkv).
void backward_group(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv, const float* out,
                    const float* lse, const AttentionShape& s, const Keys& keys, const AttentionDropout& drop,
                    const int32_t* doc, const int32_t* kdoc, int64_t b, int64_t g, float* scratch) {
  const int64_t T = s.T, D = s.D, R = s.layout().R();
  const float scale = 1.0f / std::sqrt(float(D));
  const bool dropout = drop.p > 0.0f;
  const float keep_scale = dropout ? 1.0f / (1.0f - drop.p) : 1.0f;
  float* P = scratch;                 // [kTile, kTile] probabilities
  float* dP = P + kTile * kTile;      // [kTile, kTile] dP, then dS
  float* Pd = dP + kTile * kTile;     // [kTile, kTile] dropped probabilities
  float* dK = Pd + kTile * kTile;     // [kTile, D]
  float* dV = dK + kTile * D;         // [kTile, D]
  float* mask = dV + kTile * D;       // [kTile]
  float* Di = mask + kTile;           // [R, T]

  for (int64_t r = 0; r < R; ++r) {
    const HeadView hv = head_view(s, keys, b, g * R + r);
    for (int64_t i = 0; i < T; ++i) {
      const float* o_i = hv.o(out, i);
      const float* do_i = hv.o(dout, i);
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t d = 0; d < D; ++d) acc += o_i[d] * do_i[d];
      Di[r * T + i] = acc;
      std::fill(hv.q(dqkv, i), hv.q(dqkv, i) + D, 0.0f);
    }
  }

  const HeadView kvv = head_view(s, keys, b, g * R);  // the group's key and value
  for (int64_t j0 = 0; j0 < keys.T; j0 += kTile) {
    const int64_t nk = std::min(kTile, keys.T - j0);
    std::fill(dK, dK + nk * D, 0.0f);
    std::fill(dV, dV + nk * D, 0.0f);
    const IdRange k_ids = doc ? id_range(kdoc, j0, nk) : IdRange{0, 0};
    for (int64_t r = 0; r < R; ++r) {
      const int64_t h = g * R + r;
      const HeadView hv = head_view(s, keys, b, h);
      const float* lse_bh = lse + (b * s.H + h) * T;
      // Query tiles whose last row sees key j0 (without a context: from the diagonal tile on).
      for (int64_t i0 = 0; i0 < T; i0 += kTile) {
        const int64_t nq = std::min(kTile, T - i0);
        if (keys.position(i0 + nq - 1) < j0) continue;
        if (keys.first(i0) >= j0 + nk) continue;  // the key tile ends before the first row's window
        if (doc && disjoint(k_ids, id_range(doc, i0, nq))) continue;
        gemm_f32(Trans::N, Trans::T, nq, nk, D, scale, hv.q(qkv, i0), hv.ld_qkv, kvv.k(kv, j0),
                 hv.ld_kv, 0.0f, P, kTile);
        gemm_f32(Trans::N, Trans::T, nq, nk, D, 1.0f, hv.o(dout, i0), hv.ld_out, kvv.v(kv, j0),
                 hv.ld_kv, 0.0f, dP, kTile);
        for (int64_t q = 0; q < nq; ++q) {
          const int64_t i = i0 + q;
          const int64_t count = std::clamp<int64_t>(keys.position(i) - j0 + 1, 0, nk);
          const int64_t before = std::clamp<int64_t>(keys.first(i) - j0, 0, count);
          float* p_r = P + q * kTile;
          float* dp_r = dP + q * kTile;
          float* pd_r = Pd + q * kTile;
          const float l = lse_bh[i], di = Di[r * T + i];
#pragma omp simd
          for (int64_t c = 0; c < count; ++c) p_r[c] = simd::exp(p_r[c] - l);
          for (int64_t c = 0; c < before; ++c) p_r[c] = 0.0f;
          if (doc)
            for (int64_t c = 0; c < count; ++c) p_r[c] = kdoc[j0 + c] == doc[i] ? p_r[c] : 0.0f;
          for (int64_t c = count; c < nk; ++c) p_r[c] = 0.0f;
          if (dropout) {
            if (count > 0)
              simd::dropout_mask(mask, drop.stream,
                                 dropout_row_index(s, keys, drop, b, h, i) + uint64_t(j0), count, drop.p,
                                 keep_scale);
#pragma omp simd
            for (int64_t c = 0; c < count; ++c) {
              pd_r[c] = p_r[c] * mask[c];
              dp_r[c] *= mask[c];
            }
            for (int64_t c = count; c < nk; ++c) pd_r[c] = 0.0f;
          }
#pragma omp simd
          for (int64_t c = 0; c < nk; ++c) dp_r[c] = p_r[c] * (dp_r[c] - di);  // dS
        }
        gemm_f32(Trans::T, Trans::N, nk, D, nq, 1.0f, dropout ? Pd : P, kTile, hv.o(dout, i0),
                 hv.ld_out, 1.0f, dV, D);
        gemm_f32(Trans::N, Trans::N, nq, D, nk, scale, dP, kTile, kvv.k(kv, j0), hv.ld_kv, 1.0f,
                 hv.q(dqkv, i0), hv.ld_qkv);
        gemm_f32(Trans::T, Trans::N, nk, D, nq, scale, dP, kTile, hv.q(qkv, i0), hv.ld_qkv, 1.0f,
                 dK, D);
      }
    }
    for (int64_t c = 0; c < nk; ++c) {
      std::copy(dK + c * D, dK + (c + 1) * D, kvv.k(dkv, j0 + c));
      std::copy(dV + c * D, dV + (c + 1) * D, kvv.v(dkv, j0 + c));
    }
  }
}

// The sinks' gradient (attention_backward's d_softmax_offset): per (b, h) the sum over the rows in
// order, then over b in order, so the result does not depend on the threads.
void softmax_offset_backward(float* grad, const float* dout, const float* out, const float* lse,
                             const AttentionShape& s) {
  std::vector<double> part(size_t(s.B * s.H));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    const float c = s.softmax_offset[h];
    double acc = 0.0;
    for (int64_t i = 0; i < s.T; ++i) {
      const float* o = out + ((b * s.T + i) * s.H + h) * s.D;
      const float* g = dout + ((b * s.T + i) * s.H + h) * s.D;
      float di = 0.0f;
      for (int64_t d = 0; d < s.D; ++d) di += o[d] * g[d];
      acc += double(std::exp(c - lse[bh * s.T + i])) * double(di);
    }
    part[size_t(bh)] = acc;
  }
  for (int64_t h = 0; h < s.H; ++h) {
    double sum = 0.0;
    for (int64_t b = 0; b < s.B; ++b) sum += part[size_t(b * s.H + h)];
    grad[h] -= float(sum);
  }
}

}  // namespace

// Tasks are (b, h, query tile), longest first (a causal query tile's cost grows with
// its index); each task writes its own rows, so the result is independent of the
// schedule and thread count.
void attention_forward(float* out, float* lse, const AttentionOperand& qkv_in, const AttentionShape& s,
                       const AttentionDropout& drop, const int32_t* document_ids, AttentionMath math,
                       uint16_t* out_bf16, const ContextKeys* context) {
  LATTICE_KERNEL_ENTRY(cuda::attention_forward(out, lse, qkv_in, s, drop, document_ids, math, out_bf16, context));
  check_args(s, drop, context, document_ids);
  const float* qkv = fp32_qkv(qkv_in, s);
  const float* kv = context ? context->kv : qkv;
  const Keys keys = keys_of(s, context);
  const int32_t* key_ids = context ? context->key_document_ids : document_ids;  // [B, keys.T]
  const int64_t q_tiles = (s.T + kTile - 1) / kTile;
  const int64_t tasks = s.B * s.H * q_tiles;
  const size_t scratch_size = size_t(kTile * kTile + kTile * s.D + 3 * kTile);
#pragma omp parallel
  {
    thread_local std::vector<float> scratch;  // kept from call to call: no page faults once grown
    if (scratch.size() < scratch_size) scratch.resize(scratch_size);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t qt = q_tiles - 1 - task / (s.B * s.H);
      const int64_t bh = task % (s.B * s.H);
      const int64_t b = bh / s.H, h = bh % s.H;
      const int64_t i0 = qt * kTile;
      forward_tile(out, lse + bh * s.T, qkv, kv, s, keys, drop, document_ids ? document_ids + b * s.T : nullptr,
                   key_ids ? key_ids + b * keys.T : nullptr, b, h, i0, std::min(kTile, s.T - i0), scratch.data());
    }
  }
  if (out_bf16) cast_fp32_to_bf16(out_bf16, out, s.B * s.T * s.H * s.D);
}

// Tasks are (b, group): a group's key and value gradients are summed over its heads inside
// one task, in a fixed order, so again the result does not depend on the schedule.
void attention_backward(float* dqkv, const AttentionOperand& dout_in, const AttentionOperand& qkv_in,
                        const float* out, const float* lse, const AttentionShape& s, const AttentionDropout& drop,
                        const int32_t* document_ids, AttentionMath math, uint16_t* dqkv_bf16, float* dbias,
                        const ContextKeys* context, float* d_softmax_offset) {
  LATTICE_KERNEL_ENTRY(cuda::attention_backward(dqkv, dout_in, qkv_in, out, lse, s, drop, document_ids, math,
                                                dqkv_bf16, dbias, context, d_softmax_offset));
  check_args(s, drop, context, document_ids);
  LATTICE_CHECK(!context || (context->dkv && !dqkv_bf16 && !dbias))
      << "attention: a context-parallel backward writes dkv, and no bf16 cast or bias gradient of dqkv";
  LATTICE_CHECK(!s.gated || (!dqkv_bf16 && !dbias))
      << "attention: with output gates, no bf16 cast or bias gradient of dqkv (its gate slots are not written)";
  const float* qkv = fp32_qkv(qkv_in, s);
  const float* kv = context ? context->kv : qkv;
  float* dkv = context ? context->dkv : dqkv;
  const Keys keys = keys_of(s, context);
  const int32_t* key_ids = context ? context->key_document_ids : document_ids;  // [B, keys.T]
  const float* dout = fp32_dout(dout_in, s);
  const QkvLayout L = s.layout();
  const int64_t groups = s.B * L.G;
  const size_t scratch_size = size_t(3 * kTile * kTile + 2 * kTile * s.D + kTile + L.R() * s.T);
#pragma omp parallel
  {
    thread_local std::vector<float> scratch;  // kept from call to call: no page faults once grown
    if (scratch.size() < scratch_size) scratch.resize(scratch_size);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < groups; ++bg) {
      const int64_t b = bg / L.G;
      backward_group(dqkv, dkv, dout, qkv, kv, out, lse, s, keys, drop,
                     document_ids ? document_ids + b * s.T : nullptr, key_ids ? key_ids + b * keys.T : nullptr, b,
                     bg % L.G, scratch.data());
    }
  }
  if (dqkv_bf16) cast_fp32_to_bf16(dqkv_bf16, dqkv, s.B * s.T * L.width());
  if (dbias) bias_backward(dbias, dqkv, s.B * s.T, L.width());
  if (d_softmax_offset && s.softmax_offset) softmax_offset_backward(d_softmax_offset, dout, out, lse, s);
}

}  // namespace lattice
