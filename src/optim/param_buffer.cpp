#include "optim/param_buffer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/device.h"

#include "core/philox.h"

namespace lattice {

int ParamBuffer::add(const std::string& name, const Shape& shape, ParamInit init, float init_std,
                     int tp_split_dim) {
  return add_tp(name, shape, init, init_std, tp_split_dim, 0, 1);
}

int ParamBuffer::add_tp(const std::string& name, const Shape& global_shape, ParamInit init,
                        float init_std, int tp_split_dim, int tp_rank, int tp_size, int blocks) {
  LATTICE_CHECK(blocks == 1 || (blocks > 1 && tp_split_dim == 0 && !global_shape.empty() &&
                                global_shape[0] % blocks == 0))
      << "parameter " << name << ": " << blocks << " blocks of " << shape_str(global_shape) << " along dim "
      << tp_split_dim;
  if (blocks > 1)
    return add_tp_blocks(name, global_shape, init, init_std, tp_rank, tp_size,
                         std::vector<int64_t>(size_t(blocks), global_shape[0] / blocks));
  Shape shape = global_shape;
  std::vector<int64_t> offsets(global_shape.size(), 0);
  if (tp_split_dim >= 0 && tp_size > 1) {
    LATTICE_CHECK(tp_split_dim < int(shape.size()) && shape[size_t(tp_split_dim)] % tp_size == 0)
        << "parameter " << name << ": dim " << tp_split_dim << " of " << shape_str(global_shape)
        << " does not split into " << tp_size << " tensor-parallel parts";
    shape[size_t(tp_split_dim)] /= tp_size;
    offsets[size_t(tp_split_dim)] = shape[size_t(tp_split_dim)] * tp_rank;
  }
  return add_info(name, global_shape, shape, offsets, init, init_std, tp_split_dim, tp_size, {});
}

int ParamBuffer::add_tp_blocks(const std::string& name, const Shape& global_shape, ParamInit init, float init_std,
                               int tp_rank, int tp_size, const std::vector<int64_t>& block_rows) {
  int64_t rows = 0;
  bool even = true;
  for (int64_t r : block_rows) {
    rows += r;
    even = even && r % tp_size == 0;
  }
  LATTICE_CHECK(!global_shape.empty() && rows == global_shape[0] && !block_rows.empty())
      << "parameter " << name << ": blocks of " << rows << " rows for " << shape_str(global_shape);
  LATTICE_CHECK(even) << "parameter " << name << ": a block of " << shape_str(global_shape)
                      << " does not split into " << tp_size << " tensor-parallel parts";
  Shape shape = global_shape;
  std::vector<int64_t> offsets(global_shape.size(), 0);
  shape[0] /= tp_size;
  offsets[0] = block_rows[0] / tp_size * tp_rank;
  return add_info(name, global_shape, shape, offsets, init, init_std, 0, tp_size,
                  block_rows.size() > 1 ? block_rows : std::vector<int64_t>{});
}

int ParamBuffer::add_info(const std::string& name, const Shape& global_shape, const Shape& shape,
                          const std::vector<int64_t>& offsets, ParamInit init, float init_std, int tp_split_dim,
                          int tp_size, const std::vector<int64_t>& block_rows) {
  LATTICE_CHECK(params_.data() == nullptr) << "parameter " << name << " added after allocate()";
  LATTICE_CHECK(!index_.count(name)) << "parameter " << name << " registered twice";
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.numel = shape_numel(shape);
  // 64-byte aligned start for every parameter (16 floats).
  p.offset = (numel_ + 15) / 16 * 16;
  p.tp_split_dim = tp_split_dim;
  p.global_shape = global_shape;
  p.global_offsets = offsets;
  p.tp_duplicated = tp_split_dim < 0 && tp_size > 1;
  p.tp_blocks = block_rows.empty() ? 1 : int(block_rows.size());
  p.tp_block_rows = block_rows;
  p.weight_decay = shape.size() >= 2;
  p.init = init;
  p.init_std = init_std;
  numel_ = p.offset + p.numel;
  index_[name] = int(infos_.size());
  infos_.push_back(std::move(p));
  return int(infos_.size()) - 1;
}

void ParamBuffer::assign_offsets() {
  LATTICE_CHECK(params_.data() == nullptr) << "parameters placed after allocate()";
  int64_t end = 0;
  for (bool expert : {false, true}) {
    if (expert) expert_begin_ = end;
    for (ParamInfo& p : infos_)
      if (p.expert == expert) {
        p.offset = (end + 15) / 16 * 16;  // 64-byte aligned start for every parameter (16 floats)
        end = p.offset + p.numel;
      }
  }
  numel_ = end;
}

void ParamBuffer::allocate(bool with_grads) {
  assign_offsets();
  try {
    params_ = Storage(size_t(numel_) * sizeof(float));
    if (with_grads) grads_ = Storage(size_t(numel_) * sizeof(float));
    with_grads_ = with_grads;
  } catch (const OutOfMemory& e) {
    std::ostringstream what;
    what << (with_grads ? "the parameters and gradients (" : "the parameters (") << numel_ << " fp32 elements"
         << (with_grads ? " each)" : ")");
    throw e.with_context(what.str());
  }
}

void ParamBuffer::initialize(uint64_t seed) {
  // Drawn on the host, then one upload (on the CPU the buffer itself is the host copy).
  const bool on_cpu = current_device() == Device::cpu;
  std::vector<float> staging(on_cpu ? 0 : size_t(numel_));
  float* host = on_cpu ? params() : staging.data();
  for (size_t k = 0; k < infos_.size(); ++k) {
    const ParamInfo& p = infos_[k];
    float* w = host + p.offset;
    switch (p.init) {
      case ParamInit::zeros: std::memset(w, 0, p.numel * sizeof(float)); break;
      case ParamInit::ones:
        for (int64_t i = 0; i < p.numel; ++i) w[i] = 1.0f;
        break;
      case ParamInit::normal:
      case ParamInit::xavier_uniform: {
        PhiloxStream stream{seed, fnv1a32(p.name.c_str())};
        // Local element (row-major in each of the local boxes) -> global row-major index.
        LATTICE_CHECK(p.shape.size() <= 2) << "parameter " << p.name << ": init supports 1-D and 2-D tensors";
        const bool xavier = p.init == ParamInit::xavier_uniform;
        LATTICE_CHECK(!xavier || p.global_shape.size() == 2) << "parameter " << p.name << ": Xavier init needs a 2-D tensor";
        const double bound = xavier ? std::sqrt(6.0 / double(p.global_shape[0] + p.global_shape[1])) : 0.0;
        const int64_t g_inner = p.global_shape.empty() ? 1 : p.global_shape.back();
        for (const ParamBox& box : param_boxes(p, param_tp_rank(p))) {
          const int64_t inner = box.lengths.empty() ? 1 : box.lengths.back();
          const int64_t row0 = box.lengths.size() >= 2 ? box.offsets[0] : 0;
          const int64_t col0 = box.lengths.empty() ? 0 : box.offsets.back();
          const int64_t n = shape_numel(box.lengths);
          float* wb = w + box.local_offset;
          // In chunks; each chunk in runs of one row, whose global indices are consecutive.
          constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static)
          for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
            for (int64_t i = c0; i < std::min(n, c0 + kChunk);) {
              const int64_t run = std::min(std::min(n, c0 + kChunk) - i, inner - i % inner);
              const uint64_t g = uint64_t((row0 + i / inner) * g_inner + col0 + i % inner);
              if (xavier) {
                for (int64_t k = 0; k < run; ++k)
                  wb[i + k] = float(bound * (2.0 * double(stream.uniform(g + uint64_t(k))) - 1.0));
              } else {
                stream.fill_normal(wb + i, run, g, double(p.init_std));
              }
              i += run;
            }
          }
        }
        break;
      }
      case ParamInit::uniform:
      case ParamInit::log_uniform:
      case ParamInit::inverse_softplus_dt: {
        // Keyed as the normal draws: the element's global row-major index (a split along dim 0 only).
        PhiloxStream stream{seed, fnv1a32(p.name.c_str())};
        LATTICE_CHECK(p.tp_split_dim <= 0) << "parameter " << p.name << ": uniform init of a split other than dim 0";
        const int64_t inner = p.shape.empty() ? 1 : p.numel / p.shape[0];
        for (const ParamBox& box : param_boxes(p, param_tp_rank(p))) {
          const int64_t row0 = box.offsets.empty() ? 0 : box.offsets[0];
          const int64_t n = shape_numel(box.lengths);
          float* wb = w + box.local_offset;
          for (int64_t i = 0; i < n; ++i) {
            const double r = double(stream.uniform(uint64_t(row0 * inner + i)));
            if (p.init == ParamInit::inverse_softplus_dt) {
              const double lo = std::log(0.001), hi = std::log(0.1);
              const double dt = std::max(std::exp(lo + r * (hi - lo)), 1e-4);
              wb[i] = float(dt + std::log(-std::expm1(-dt)));
            } else {
              wb[i] = p.init == ParamInit::uniform ? float(p.init_std * (2.0 * r - 1.0))
                                                   : float(std::log(1.0 + r * (double(p.init_std) - 1.0)));
            }
          }
        }
        break;
      }
    }
  }
  if (!on_cpu) upload_params(staging.data());
}

int param_tp_rank(const ParamInfo& p) {
  if (p.tp_split_dim < 0 || p.shape == p.global_shape) return 0;
  const size_t d = size_t(p.tp_split_dim);
  const int64_t first = p.tp_block_rows.empty() ? p.shape[d] : p.tp_block_rows[0] * p.shape[d] / p.global_shape[d];
  return int(p.global_offsets[d] / first);
}

std::vector<ParamBox> param_boxes(const ParamInfo& p, int tp_rank) {
  const bool split = p.tp_split_dim >= 0 && p.shape != p.global_shape;
  std::vector<ParamBox> boxes;
  ParamBox box;
  box.lengths = p.shape;
  box.offsets.assign(p.shape.size(), 0);
  if (!split) return {box};  // the whole tensor (blocks and all)
  const size_t d = size_t(p.tp_split_dim);
  if (p.tp_block_rows.empty()) {
    box.offsets[d] = int64_t(tp_rank) * p.shape[d];
    return {box};
  }
  // Block k: this rank's share of its rows, at the block's start plus the rank's part (blocks are along
  // dim 0: contiguous in the local part).
  const int64_t parts = p.global_shape[d] / p.shape[d], row_elems = p.numel / p.shape[d];
  int64_t global_row = 0, local_row = 0;
  for (int64_t rows : p.tp_block_rows) {
    box.lengths[d] = rows / parts;
    box.offsets[d] = global_row + int64_t(tp_rank) * box.lengths[d];
    box.local_offset = local_row * row_elems;
    boxes.push_back(box);
    global_row += rows;
    local_row += box.lengths[d];
  }
  return boxes;
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

void ParamBuffer::zero_grad() { zero_on_device(grads(), size_t(numel_) * sizeof(float)); }

void ParamBuffer::download_params(std::vector<float>& out) const {
  out.resize(size_t(numel_));
  copy_to_host(out.data(), params(), size_t(numel_) * sizeof(float));
}
void ParamBuffer::upload_params(const float* in) { copy_to_device(params(), in, size_t(numel_) * sizeof(float)); }
void ParamBuffer::download_grads(std::vector<float>& out) const {
  out.resize(size_t(numel_));
  copy_to_host(out.data(), grads(), size_t(numel_) * sizeof(float));
}
void ParamBuffer::upload_grads(const float* in) { copy_to_device(grads(), in, size_t(numel_) * sizeof(float)); }
void ParamBuffer::read_param(int index, float* out) const {
  copy_to_host(out, param(index), size_t(infos_[size_t(index)].numel) * sizeof(float));
}
void ParamBuffer::write_param(int index, const float* in) {
  copy_to_device(param(index), in, size_t(infos_[size_t(index)].numel) * sizeof(float));
}
void ParamBuffer::read_grad(int index, float* out) const {
  copy_to_host(out, grad(index), size_t(infos_[size_t(index)].numel) * sizeof(float));
}
void ParamBuffer::write_grad(int index, const float* in) {
  copy_to_device(grad(index), in, size_t(infos_[size_t(index)].numel) * sizeof(float));
}

}  // namespace lattice
