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

enum class ParamInit { normal, zeros, ones };

struct ParamInfo {
  std::string name;        // Megatron-Core state-dict name, e.g. decoder.layers.0.mlp.linear_fc1.weight
  Shape shape;
  int64_t offset = 0;      // elements from the buffer start
  int64_t numel = 0;
  int tp_split_dim = -1;   // dim tensor parallelism splits (0 column-parallel, 1 row-parallel), -1 none
  bool weight_decay = true;  // false for biases and 1-D parameters
  ParamInit init = ParamInit::normal;
  float init_std = 0.0f;
};

class ParamBuffer {
 public:
  // Registers a parameter (before allocate()). Returns its index.
  int add(const std::string& name, const Shape& shape, ParamInit init, float init_std,
          int tp_split_dim = -1);
  // Allocates the param and grad buffers (zeroed).
  void allocate();
  // Sets every parameter to its initial value. Value of element i of parameter P is
  // a function of (seed, P's name, i) only: layout- and thread-count-invariant.
  void initialize(uint64_t seed);

  int64_t numel() const { return numel_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(const std::string& name) const;
  bool has(const std::string& name) const { return index_.count(name) != 0; }

  float* params() const { return params_.as<float>(); }
  float* grads() const { return grads_.as<float>(); }
  float* param(int index) const { return params() + infos_[index].offset; }
  float* grad(int index) const { return grads() + infos_[index].offset; }
  Tensor param_tensor(const std::string& name) const;
  Tensor grad_tensor(const std::string& name) const;

  void zero_grad();

 private:
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> index_;
  int64_t numel_ = 0;
  Storage params_, grads_;
};

}  // namespace lattice
