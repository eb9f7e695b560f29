#include "model/context_parallel.h"

#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "dist/comm.h"

namespace lattice {

ContextKeys ContextSplit::keys(const float* kv, float* dkv) const {
  ContextKeys k;
  k.kv = kv;
  k.dkv = dkv;
  k.Tk = T;
  k.split = chunk();
  k.shift[0] = chunk_index(0) * chunk();
  k.shift[1] = chunk_index(1) * chunk() - chunk();
  return k;
}

int ContextParallel::rank() const { return comm ? comm->rank() : 0; }
int ContextParallel::size() const { return comm ? comm->size() : 1; }

namespace {

void check_split(const ContextParallel& cp, const ContextSplit& s) {
  LATTICE_CHECK(cp.on() && s.size == cp.size() && s.T % (2 * s.size) == 0)
      << "context parallelism: bad split of T=" << s.T << " over " << s.size << " ranks";
}

// Copies between a qkv [B*Tl, G, R+2, D] and its keys and values [B*Tl, G, 2, D] (one strided
// copy per group: a group's key and value are adjacent in both). to_kv: qkv -> kv, else back.
void copy_keys(float* kv, float* qkv, const QkvLayout& L, int64_t rows, bool to_kv) {
  const size_t kv_pitch = size_t(2 * L.G * L.D) * sizeof(float), qkv_pitch = size_t(L.width()) * sizeof(float);
  const size_t width = size_t(2 * L.D) * sizeof(float);
  for (int64_t g = 0; g < L.G; ++g) {
    float* k = kv + g * 2 * L.D;
    float* q = qkv + L.kv_slot(g, 1) * L.D;
    if (to_kv)
      copy_rows_on_device(k, kv_pitch, q, qkv_pitch, width, size_t(rows));
    else
      copy_rows_on_device(q, qkv_pitch, k, kv_pitch, width, size_t(rows));
  }
}

// Between the group's rank-major rows [P, B, Tl, W] (each rank's share, as collectives lay it
// out) and the sequences' natural order [B, T, W]: one copy per (rank, sequence, half).
void reorder(float* dst, const float* src, const ContextSplit& s, int64_t B, int64_t W, bool to_natural) {
  const int64_t c = s.chunk(), Tl = s.rows();
  const size_t bytes = size_t(c * W) * sizeof(float);
  for (int r = 0; r < s.size; ++r) {
    const ContextSplit rs{r, s.size, s.T};
    for (int64_t b = 0; b < B; ++b)
      for (int half = 0; half < 2; ++half) {
        const int64_t ranked = ((r * B + b) * Tl + half * c) * W;
        const int64_t natural = (b * s.T + rs.chunk_index(half) * c) * W;
        if (to_natural)
          copy_on_device(dst + natural, src + ranked, bytes);
        else
          copy_on_device(dst + ranked, src + natural, bytes);
      }
  }
}

}  // namespace

void gather_context_keys(const ContextParallel& cp, const ContextSplit& s, float* kv, float* staging, const float* qkv,
                         const QkvLayout& L, int64_t B) {
  check_split(cp, s);
  const int64_t W = 2 * L.G * L.D, part = B * s.rows() * W;
  copy_keys(staging + cp.rank() * part, const_cast<float*>(qkv), L, B * s.rows(), true);  // read only
  cp.comm->all_gather(staging, std::vector<int64_t>(size_t(s.size), part));
  reorder(kv, staging, s, B, W, true);
}

void gather_context_rows(const ContextParallel& cp, const ContextSplit& s, float* full, float* staging,
                         const float* local, int64_t B, int64_t W) {
  check_split(cp, s);
  const int64_t part = B * s.rows() * W;
  copy_on_device(staging + cp.rank() * part, local, size_t(part) * sizeof(float));
  cp.comm->all_gather(staging, std::vector<int64_t>(size_t(s.size), part));
  reorder(full, staging, s, B, W, true);
}

void context_local_rows(const ContextSplit& s, float* local, const float* full, int64_t B, int64_t W) {
  const int64_t c = s.chunk(), Tl = s.rows();
  for (int64_t b = 0; b < B; ++b)
    for (int half = 0; half < 2; ++half)
      copy_on_device(local + (b * Tl + half * c) * W, full + (b * s.T + s.chunk_index(half) * c) * W,
                     size_t(c * W) * sizeof(float));
}

std::vector<std::vector<ColumnBlock>> equal_column_shares(int64_t P, int64_t w) {
  std::vector<std::vector<ColumnBlock>> c;
  for (int64_t r = 0; r < P; ++r) c.push_back({{r * w, 0, w}});
  return c;
}

void context_rows_to_columns(const ContextParallel& cp, const ContextSplit& s, float* full, float* send, float* recv,
                             const float* local, int64_t B, int64_t W,
                             const std::vector<std::vector<ColumnBlock>>& columns, int64_t Wc) {
  check_split(cp, s);
  LATTICE_CHECK(int(columns.size()) == s.size) << "context parallelism: " << columns.size() << " ranks' columns for "
                                               << s.size << " ranks";
  const int64_t rows = B * s.rows(), part = rows * Wc;
  for (int r = 0; r < s.size; ++r)
    for (const ColumnBlock& c : columns[size_t(r)])
      copy_rows_on_device(send + r * part + c.to, size_t(Wc) * sizeof(float), local + c.from, size_t(W) * sizeof(float),
                          size_t(c.width) * sizeof(float), size_t(rows));
  const std::vector<int64_t> counts(size_t(s.size), part);
  cp.comm->all_to_all(send, counts, recv, counts);
  reorder(full, recv, s, B, Wc, true);
}

void context_columns_to_rows(const ContextParallel& cp, const ContextSplit& s, float* local, float* send, float* recv,
                             const float* full, int64_t B, int64_t W,
                             const std::vector<std::vector<ColumnBlock>>& columns, int64_t Wc) {
  check_split(cp, s);
  LATTICE_CHECK(int(columns.size()) == s.size) << "context parallelism: " << columns.size() << " ranks' columns for "
                                               << s.size << " ranks";
  const int64_t rows = B * s.rows(), part = rows * Wc;
  reorder(send, full, s, B, Wc, false);
  const std::vector<int64_t> counts(size_t(s.size), part);
  cp.comm->all_to_all(send, counts, recv, counts);
  for (int r = 0; r < s.size; ++r)
    for (const ColumnBlock& c : columns[size_t(r)])
      copy_rows_on_device(local + c.from, size_t(W) * sizeof(float), recv + r * part + c.to, size_t(Wc) * sizeof(float),
                          size_t(c.width) * sizeof(float), size_t(rows));
}

void scatter_context_key_grads(const ContextParallel& cp, const ContextSplit& s, float* dqkv, const float* dkv,
                               float* staging, float* recv, const QkvLayout& L, int64_t B) {
  check_split(cp, s);
  const int64_t W = 2 * L.G * L.D, part = B * s.rows() * W;
  reorder(staging, dkv, s, B, W, false);
  cp.comm->reduce_scatter(staging, recv, std::vector<int64_t>(size_t(s.size), part));
  copy_keys(recv, dqkv, L, B * s.rows(), false);
}

}  // namespace lattice
