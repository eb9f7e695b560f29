// ParamBuffer: all parameters of a model chunk in one contiguous fp32 buffer and the
// gradients in a twin buffer with the same layout. Each parameter is registered with
// its Megatron-Core state-dict name, shape and the metadata later stages need.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/storage.h"
#include "core/tensor.h"

namespace lattice {

// normal: N(0, init_std^2); xavier_uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)) of the global
// 2-D shape [fan_out, fan_in] (torch's xavier_uniform_, --init-method-xavier-uniform). Both keyed by
// the parameter's name and each element's global index, so every layout draws the same values.
// uniform: U(-init_std, init_std) (a GDN layer's conv1d.weight: torch's Conv1d default, 1 / sqrt(fan_in));
// log_uniform: log U(1, init_std) (a GDN layer's A_log: Megatron's A_init_range (1, 16)). Any shape.
// inverse_softplus_dt: softplus^-1(dt), dt = exp(U(log 0.001, log 0.1)) at least 1e-4 (a Mamba layer's dt_bias:
// Megatron's dt_min, dt_max and dt_init_floor).
enum class ParamInit { normal, zeros, ones, xavier_uniform, uniform, log_uniform, inverse_softplus_dt };

struct ParamInfo {
  std::string name;        // Megatron-Core state-dict name, e.g. decoder.layers.0.mlp.linear_fc1.weight
  Shape shape;             // this rank's part
  int64_t offset = 0;      // elements from the buffer start
  int64_t numel = 0;
  int tp_split_dim = -1;   // dim tensor parallelism splits (0 column-parallel, 1 row-parallel), -1 none
  // The whole (global) tensor and where this rank's part sits in it: the box
  // [global_offsets, global_offsets + shape). Equal to shape and zeros without a split.
  Shape global_shape;
  std::vector<int64_t> global_offsets;
  // A full copy held by every tensor-parallel rank (norms, row-parallel biases, position
  // embeddings when TP > 1): counted once in the gradient norm.
  bool tp_duplicated = false;
  // Dim 0 holds tp_blocks equal blocks, each split over the tensor-parallel ranks (SwiGLU's
  // fc1, weight [2F, C] and bias [2F]: the gate's rows, then the up projection's, as Megatron
  // shards them). This rank's part is its share of every block, in block order, so it is
  // tp_blocks boxes of the global tensor (param_boxes); global_offsets is the first one's.
  int tp_blocks = 1;
  // The global rows of each block (tp_blocks of them; equal but for add_tp_blocks' tensors, such as a GDN
  // layer's in_proj: q, k, v, z, beta and the decay's rows); empty with one block.
  std::vector<int64_t> tp_block_rows;
  // The last pipeline stage's copy of the tied word embedding (the first stage holds the
  // original): counted once in the gradient norm and saved once, by the first stage.
  bool shared_embedding_copy = false;
  // A buffer kept with the parameters (saved, loaded and resharded as they are) that no gradient
  // trains (MoE's expert bias): its gradient stays zero, so the optimizer leaves it as it is, and
  // the norms and zero counts skip it (Megatron's buffers are no parameters).
  bool buffer = false;
  // A routed expert's weight under expert parallelism's rules (Megatron's allreduce=False): held by
  // one expert-parallel rank (its global expert number in the name), its gradient reduced over the
  // expert data-parallel group. Expert weights sit after every other parameter in the buffer, so
  // each kind forms its own gradient buckets.
  bool expert = false;
  bool weight_decay = true;  // false for biases and 1-D parameters
  ParamInit init = ParamInit::normal;
  float init_std = 0.0f;
};

// One box of a parameter's global tensor held by a tensor-parallel rank: the elements
// [local_offset, local_offset + prod(lengths)) of its local part (row-major) are the box
// [offsets, offsets + lengths) of the global tensor.
struct ParamBox {
  int64_t local_offset = 0;
  std::vector<int64_t> offsets, lengths;
};

// The boxes that tensor-parallel rank tp_rank holds of parameter p (any rank's info gives
// every rank's boxes: the parts are equal). One box, unless p.tp_blocks > 1.
std::vector<ParamBox> param_boxes(const ParamInfo& p, int tp_rank);
// The rank whose part p describes (its global_offsets).
int param_tp_rank(const ParamInfo& p);

class ParamBuffer {
 public:
  // Registers a parameter (before allocate()). Returns its index.
  int add(const std::string& name, const Shape& shape, ParamInit init, float init_std,
          int tp_split_dim = -1);
  // Registers this rank's part of a tensor-parallel parameter: the global tensor of
  // `global_shape` is cut into tp_size equal parts along tp_split_dim (-1: replicated)
  // and this rank holds part tp_rank.
  // blocks > 1 (split dim 0 only): the tensor is `blocks` blocks along dim 0, each cut into
  // tp_size parts, and this rank holds part tp_rank of each (ParamInfo::tp_blocks).
  int add_tp(const std::string& name, const Shape& global_shape, ParamInit init, float init_std,
             int tp_split_dim, int tp_rank, int tp_size, int blocks = 1);
  // The same with blocks of block_rows[k] global rows each along dim 0 (their sum: global_shape[0]), each
  // cut into tp_size parts.
  int add_tp_blocks(const std::string& name, const Shape& global_shape, ParamInit init, float init_std, int tp_rank,
                    int tp_size, const std::vector<int64_t>& block_rows);
  void mark_shared_embedding_copy(int index) { infos_[size_t(index)].shared_embedding_copy = true; }
  void mark_buffer(int index) { infos_[size_t(index)].buffer = true; }
  void mark_expert(int index) { infos_[size_t(index)].expert = true; }
  // Places the parameters: the others in registration order, then the experts' in theirs
  // (offsets are final only from here on; numel() includes the alignment padding).
  void assign_offsets();
  // assign_offsets(), then allocates the param and (with_grads) grad buffers (zeroed). Without the
  // gradients (a model loaded for inference: generate, convert) grads() is null.
  void allocate(bool with_grads = true);
  bool has_grads() const { return with_grads_; }
  // Sets every parameter to its initial value. The value of element g (row-major index
  // in the GLOBAL tensor) of parameter P is a function of (seed, P's name, g) only:
  // layout- and thread-count-invariant.
  void initialize(uint64_t seed);

  int64_t numel() const { return numel_; }
  // The parameters' elements: numel() without the alignment padding (the count a model's size is quoted by).
  int64_t parameter_elements() const {
    int64_t n = 0;
    for (const ParamInfo& p : infos_) n += p.numel;
    return n;
  }
  // The first element of the expert weights (numel() without any).
  int64_t expert_begin() const { return expert_begin_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(const std::string& name) const;
  bool has(const std::string& name) const { return index_.count(name) != 0; }

  // Device pointers (core/device.h): for kernels and collectives. Host code moves data
  // with the copies below.
  float* params() const { return params_.as<float>(); }
  float* grads() const { return grads_.as<float>(); }
  float* param(int index) const { return params() + infos_[index].offset; }
  float* grad(int index) const { return grads() + infos_[index].offset; }
  Tensor param_tensor(const std::string& name) const;
  Tensor grad_tensor(const std::string& name) const;

  void zero_grad();

  // Host copies of the whole buffers (numel() floats; `out` is resized) or of one
  // parameter's elements (info.numel floats), for initialisation, checkpoints and tests.
  void download_params(std::vector<float>& out) const;
  void upload_params(const float* in);
  void download_grads(std::vector<float>& out) const;
  void upload_grads(const float* in);
  void read_param(int index, float* out) const;
  void write_param(int index, const float* in);
  void read_grad(int index, float* out) const;
  void write_grad(int index, const float* in);

 private:
  int add_info(const std::string& name, const Shape& global_shape, const Shape& shape,
               const std::vector<int64_t>& offsets, ParamInit init, float init_std, int tp_split_dim, int tp_size,
               const std::vector<int64_t>& block_rows);
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> index_;
  int64_t numel_ = 0, expert_begin_ = 0;
  Storage params_, grads_;
  bool with_grads_ = false;  // allocate()'s
};

}  // namespace lattice
