// Context parallelism (Megatron's --context-parallel-size P, its load-balanced split): every
// sequence of T tokens is cut into 2P chunks of T/(2P) tokens, and rank r of the
// context-parallel group holds chunks r and 2P-1-r of each sequence of the micro-batch (its
// T/P rows per sequence: chunk r's, then the other's), so every rank gets the same share of
// the causal attention's work. Everything but the core attention is per token and runs on
// the rank's rows; the attention's keys and values are all-gathered over the group into the
// whole sequence (Megatron's all_gather kind, kernels/attention.h ContextKeys), and their
// gradients reduce-scattered back to the ranks that hold the tokens.
//
// Shapes: B micro-batch, T sequence, Tl = T/P rows per sequence here, c = T/(2P) chunk,
// kv [B, T, G, 2, D] (G key/value heads of this tensor-parallel rank, D head dim).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/qkv_layout.h"

namespace lattice {

class Comm;

// One rank's share of a sequence of T tokens.
struct ContextSplit {
  int rank = 0, size = 1;
  int64_t T = 0;

  int64_t chunk() const { return T / (2 * size); }
  int64_t rows() const { return T / size; }  // Tl
  // The chunk of the sequence that half h (0: rows [0, c), 1: rows [c, 2c)) of a sequence's rows is.
  int64_t chunk_index(int half) const { return half == 0 ? rank : 2 * size - 1 - rank; }
  // Position in the sequence of local row i (< Tl).
  int64_t position(int64_t i) const {
    const int64_t c = chunk();
    return i < c ? chunk_index(0) * c + i : chunk_index(1) * c + i - c;
  }
  // The attention's description of the split (kv, dkv: the gathered keys and values, [B, T, G, 2, D]).
  ContextKeys keys(const float* kv, float* dkv) const;
};

struct ContextParallel {
  Comm* comm = nullptr;  // the context-parallel group; null: one rank

  int rank() const;
  int size() const;
  bool on() const { return size() > 1; }
  ContextSplit split(int64_t T) const { return {rank(), size(), T}; }
};

// Forward: kv [B, T, G, 2, D] gets the keys and values of every token of the micro-batch's
// sequences, from this rank's qkv [B, Tl, G, R+2, D] (fp32) and the other ranks'. staging:
// [B * T * G * 2 * D] scratch. Collective over the group.
void gather_context_keys(const ContextParallel& cp, const ContextSplit& s, float* kv, float* staging, const float* qkv,
                         const QkvLayout& L, int64_t B);

// Rows [B, Tl, W] of every rank (local: this rank's) gathered into the sequences' natural order full
// [B, T, W]. staging: [P * B * Tl * W] scratch. Collective over the group.
void gather_context_rows(const ContextParallel& cp, const ContextSplit& s, float* full, float* staging,
                         const float* local, int64_t B, int64_t W);
// This rank's rows [B, Tl, W] of full [B, T, W] (natural order).
void context_local_rows(const ContextSplit& s, float* local, const float* full, int64_t B, int64_t W);

// Columns [from, from + width) of a row of one layout, at `to` in a row of another.
struct ColumnBlock {
  int64_t from = 0, to = 0, width = 0;
};
// Every rank's equal share of a row of P w columns: rank r's the columns [r w, (r + 1) w), at 0 in its row.
std::vector<std::vector<ColumnBlock>> equal_column_shares(int64_t P, int64_t w);

// From the rows to the columns (Megatron's all-to-all from a sequence split to a head split): every rank's
// rows [B, Tl, W] (local: this rank's), rank r's columns columns[r] of them (Wc wide, laid out as the blocks
// say) sent to rank r, so that this rank gets its columns of every row of the sequences, full [B, T, Wc] in
// natural order. send, recv: [B * T * Wc] scratch. Collective over the group.
void context_rows_to_columns(const ContextParallel& cp, const ContextSplit& s, float* full, float* send, float* recv,
                             const float* local, int64_t B, int64_t W,
                             const std::vector<std::vector<ColumnBlock>>& columns, int64_t Wc);
// The inverse: this rank's columns of every row, full [B, T, Wc], to the ranks that hold the rows; local
// [B, Tl, W] gets columns[r] from rank r (its other columns left as they are). Collective over the group.
void context_columns_to_rows(const ContextParallel& cp, const ContextSplit& s, float* local, float* send, float* recv,
                             const float* full, int64_t B, int64_t W,
                             const std::vector<std::vector<ColumnBlock>>& columns, int64_t Wc);

// Backward: the key and value gradients dkv [B, T, G, 2, D] of every rank summed, this rank's
// tokens' written into the key and value slots of dqkv [B, Tl, G, R+2, D]. staging: [B * T * G
// * 2 * D] and recv [B * Tl * G * 2 * D] scratch. Collective over the group.
void scatter_context_key_grads(const ContextParallel& cp, const ContextSplit& s, float* dqkv, const float* dkv,
                               float* staging, float* recv, const QkvLayout& L, int64_t B);

}  // namespace lattice
