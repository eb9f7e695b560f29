#include "optim/param_buffer.h"

#include <cstring>

#include "core/philox.h"

namespace lattice {

int ParamBuffer::add(const std::string& name, const Shape& shape, ParamInit init, float init_std,
                     int tp_split_dim) {
  LATTICE_CHECK(params_.data() == nullptr) << "parameter " << name << " added after allocate()";
  LATTICE_CHECK(!index_.count(name)) << "parameter " << name << " registered twice";
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.numel = shape_numel(shape);
  // 64-byte aligned start for every parameter (16 floats).
  p.offset = (numel_ + 15) / 16 * 16;
  p.tp_split_dim = tp_split_dim;
  p.weight_decay = shape.size() >= 2;
  p.init = init;
  p.init_std = init_std;
  numel_ = p.offset + p.numel;
  index_[name] = int(infos_.size());
  infos_.push_back(std::move(p));
  return int(infos_.size()) - 1;
}

void ParamBuffer::allocate() {
  params_ = Storage(size_t(numel_) * sizeof(float));
  grads_ = Storage(size_t(numel_) * sizeof(float));
}

void ParamBuffer::initialize(uint64_t seed) {
  for (size_t k = 0; k < infos_.size(); ++k) {
    const ParamInfo& p = infos_[k];
    float* w = param(int(k));
    switch (p.init) {
      case ParamInit::zeros: std::memset(w, 0, p.numel * sizeof(float)); break;
      case ParamInit::ones:
        for (int64_t i = 0; i < p.numel; ++i) w[i] = 1.0f;
        break;
      case ParamInit::normal: {
        PhiloxStream stream{seed, fnv1a32(p.name.c_str())};
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < p.numel; ++i) w[i] = float(p.init_std * stream.normal(uint64_t(i)));
        break;
      }
    }
  }
}

const ParamInfo& ParamBuffer::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) LATTICE_FAIL() << "no parameter named " << name;
  return infos_[it->second];
}

Tensor ParamBuffer::param_tensor(const std::string& name) const {
  const ParamInfo& p = info(name);
  return Tensor(params() + p.offset, p.shape);
}

Tensor ParamBuffer::grad_tensor(const std::string& name) const {
  const ParamInfo& p = info(name);
  return Tensor(grads() + p.offset, p.shape);
}

void ParamBuffer::zero_grad() { std::memset(grads(), 0, size_t(numel_) * sizeof(float)); }

}  // namespace lattice
