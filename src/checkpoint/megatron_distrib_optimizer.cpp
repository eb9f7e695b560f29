// Adam's state of Megatron-Core's distributed optimizer in a --ckpt-format torch checkpoint
// (megatron_distrib_optimizer.h).
#include "checkpoint/megatron_distrib_optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/tensor.h"

namespace lattice {

namespace {

const std::string& kHint = kNoLoadOptimHint;

PyRef present(const PyRef& v) { return v && !v->is(PyValue::Kind::none) ? v : nullptr; }

bool is_list(const PyRef& v) { return v && (v->is(PyValue::Kind::list) || v->is(PyValue::Kind::tuple)); }

// A dict's entry under the integer key `k`, or null.
PyRef int_key(const PyRef& d, int64_t k) {
  if (!d || !d->is(PyValue::Kind::dict)) return nullptr;
  for (const auto& [key, value] : d->entries)
    if (key->is(PyValue::Kind::integer) && key->integer == k) return value;
  return nullptr;
}

// A saved arg: its integer value, or nullopt when absent or None.
std::optional<int64_t> int_arg(const PyRef& ns, const std::string& name) {
  const PyRef v = ns ? present(ns->get(name)) : nullptr;
  if (v && v->is(PyValue::Kind::integer)) return v->integer;
  if (v && v->is(PyValue::Kind::boolean)) return int64_t(v->boolean);
  return std::nullopt;
}

// One parameter of the rank, in named_parameters order.
struct Param {
  int chunk;
  std::string key;
  const TorchTensor* tensor;
  bool expert;  // a routed expert's (the experts' optimizer)
};

// A contiguous view of `shape` at element `offset` of the flat tensor `flat`.
PyRef view_of(const PyRef& flat, int64_t offset, const std::vector<int64_t>& shape) {
  auto t = std::make_shared<TorchTensor>(*TorchArchive::tensor(flat));
  t->offset += offset;
  t->shape = shape;
  t->stride.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) t->stride[d - 1] = t->stride[d] * shape[d];
  auto v = std::make_shared<PyValue>(*flat);
  v->payload = t;
  return v;
}

// The dtype a torch.dtype global names ("bfloat16" for torch.bfloat16), or its description.
std::string dtype_name(const PyRef& g) {
  return g && g->is(PyValue::Kind::global) && g->text == "torch" ? g->name : g ? g->describe() : "nothing";
}

}  // namespace

bool megatron_shared_embedding(const std::string& key, bool first, bool last, int64_t P, bool tied, bool mtp) {
  const bool embedding = key == "embedding.word_embeddings.weight";
  return P > 1 && ((tied && first && embedding) || (tied && last && key == "output_layer.weight") ||
                   (mtp && last && !first && embedding));
}

MegatronBufferLayout megatron_buffer_layout(const std::vector<MegatronBufferParam>& params,
                                            std::optional<int64_t> bucket_size, bool pad_params) {
  auto round_up = [](int64_t x, int64_t d) { return (x + d - 1) / d * d; };
  MegatronBufferLayout out;
  out.bucket.assign(params.size(), 0);
  out.start.assign(params.size(), 0);
  int64_t start = 0, bucket_start = 0, end = 0;
  int members = 0;
  // A bucket ends at x (its numel_unpadded: x less its start); the next starts at x padded to Megatron's
  // lcm(DP, 128) (any multiple of 64 gives the same offsets within the buckets).
  auto close = [&](int64_t x) {
    out.bucket_numel.push_back(x - bucket_start);
    bucket_start = start = round_up(x, 128);
    members = 0;
  };
  for (size_t i = params.size(); i-- > 0;) {  // reverse named_parameters order
    const MegatronBufferParam& p = params[i];
    if (pad_params) start = round_up(start, 64);
    if (p.shared_embedding && members > 0) close(start);
    end = start + p.numel;
    out.bucket[i] = int(out.bucket_numel.size());
    out.start[i] = start - bucket_start;
    ++members;
    if ((bucket_size && end - bucket_start >= *bucket_size) || p.shared_embedding)
      close(end);
    else
      start = end;
  }
  if (members > 0) out.bucket_numel.push_back(end - bucket_start);
  return out;
}

int64_t MegatronBufferLayout::coalesced(size_t i) const {
  int64_t before = 0;
  for (int b = 0; b < bucket[i]; ++b) before += bucket_numel[size_t(b)];
  return before + start[i];
}

int64_t MegatronBufferLayout::total() const {
  int64_t n = 0;
  for (int64_t b : bucket_numel) n += b;
  return n;
}

std::optional<int64_t> megatron_overlap_bucket_size(const PyRef& args) {
  if (!int_arg(args, "overlap_grad_reduce").value_or(0) ||
      int_arg(args, "overlap_param_gather_with_optimizer_step").value_or(0))
    return std::nullopt;
  const int64_t dp_cp =
      int_arg(args, "data_parallel_size").value_or(1) * int_arg(args, "context_parallel_size").value_or(1);
  return int_arg(args, "ddp_bucket_size").value_or(std::max<int64_t>(40000000, 1000000 * dp_cp));
}

std::optional<MegatronRankOptimizer> read_megatron_distrib_optimizer(const MegatronRankFile& f,
                                                                     const std::string& distrib_optim, int stage,
                                                                     std::string& note) {
  const TorchArchive& rank = *f.archive;
  const PyRef root = rank.root();
  const PyRef ns = root->get("args");
  if (note = megatron_non_adam_note(ns); !note.empty()) return std::nullopt;
  if (int_arg(ns, "ddp_num_buckets")) {
    note = "the distributed optimizer's buckets were sized by --ddp-num-buckets, whose layout lattice does not "
           "rebuild";
    return std::nullopt;
  }
  const PyRef saved = present(root->get("optimizer"));
  if (!saved) {
    note = "none saved (--no-save-optim)";
    return std::nullopt;
  }
  MegatronRankOptimizer out;
  out.archive = std::make_shared<TorchArchive>(distrib_optim);
  const TorchArchive& archive = *out.archive;
  const std::string& path = archive.path();

  // The param groups' step and fp16's loss scaler, from the rank file's 'optimizer' (a chained optimizer's list).
  for (const PyRef& e : is_list(saved) ? saved->items : std::vector<PyRef>{saved}) {
    const PyRef inner = e && e->is(PyValue::Kind::dict) ? present(e->get("optimizer")) : nullptr;
    const PyRef groups = inner && inner->is(PyValue::Kind::dict) ? inner->get("param_groups") : nullptr;
    if (is_list(groups))
      for (size_t g = 0; g < groups->items.size(); ++g)
        if (const auto s = rank.number(present(groups->items[g]->get("step")),
                                       "optimizer.param_groups[" + std::to_string(g) + "].step"))
          out.steps.push_back(*s);
    if (const PyRef gs = e && e->is(PyValue::Kind::dict) ? present(e->get("grad_scaler")) : nullptr;
        gs && gs->is(PyValue::Kind::dict) && !out.grad_scaler)
      out.grad_scaler = megatron_grad_scaler(*gs, rank, "optimizer.grad_scaler");
  }

  // The optimizers' saved states: one, or a chained optimizer's (dense, then the routed experts').
  const PyRef state = archive.root();
  std::vector<PyRef> optimizers = is_list(state) ? state->items : std::vector<PyRef>{state};
  for (const PyRef& o : optimizers) {
    if (!present(o)) continue;
    const PyRef c = o->is(PyValue::Kind::dict) ? o->get("buckets_coalesced") : nullptr;
    if (!c || !c->is(PyValue::Kind::boolean) || !c->boolean) {
      note = "distrib_optim.pt is in a layout before Megatron-Core's coalesced buckets ('buckets_coalesced'), which "
             "lattice does not read";
      return std::nullopt;
    }
  }

  // The rank's parameters, in named_parameters order (model chunks in turn).
  std::vector<Param> params;
  bool any_expert = false;
  for (size_t ch = 0; ch < f.order.size(); ++ch)
    for (const std::string& key : f.order[ch]) {
      if (key.ends_with(".expert_bias") || key.ends_with(".local_tokens_per_expert")) continue;  // buffers
      const TorchTensor* t = TorchArchive::tensor(f.chunks[ch].at(key));
      if (!t) continue;
      const bool expert = key.find(".mlp.experts.") != std::string::npos;
      any_expert = any_expert || expert;
      params.push_back(Param{int(ch), key, t, expert});
    }
  if (any_expert && optimizers.size() != 2)
    LATTICE_FAIL() << path << ": a mixture of experts' distributed optimizer saves a list of two states (the dense "
                   << "parameters', the routed experts'); this file holds " << optimizers.size() << kHint;

  // What of the args decides the layout.
  const int64_t P = int_arg(ns, "pipeline_model_parallel_size").value_or(1);
  const int vp = int(f.order.size());
  const bool tied = !int_arg(ns, "untie_embeddings_and_output_weights").value_or(0);
  const bool mtp = int_arg(ns, "mtp_num_layers").value_or(0) > 0;
  const std::optional<int64_t> overlap_bucket_size = megatron_overlap_bucket_size(ns);  // the first chunk's

  out.chunks.resize(f.order.size());
  for (size_t which = 0; which < optimizers.size(); ++which) {
    const bool experts = optimizers.size() == 2 && which == 1;
    const PyRef& o = optimizers[which];
    const std::string at = is_list(state) ? "[" + std::to_string(which) + "]" : "";
    if (!present(o)) continue;  // not this rank's to save (it is not the first of that data-parallel group)
    int64_t gbuf = 0;
    for (int ch = 0; ch < vp; ++ch) {
      const bool first = stage == 0 && ch == 0, last = stage == P - 1 && ch == vp - 1;
      const std::optional<int64_t> bucket_size = first ? overlap_bucket_size : std::nullopt;
      // The buffers of this chunk: one per parameter dtype, in the order the dtypes first appear.
      std::vector<std::string> dtypes;
      for (const Param& p : params)
        if (p.chunk == ch && p.expert == experts &&
            std::find(dtypes.begin(), dtypes.end(), p.tensor->dtype) == dtypes.end())
          dtypes.push_back(p.tensor->dtype);
      for (const std::string& dtype : dtypes) {
        std::vector<const Param*> members;
        std::vector<MegatronBufferParam> sizes;
        for (const Param& p : params) {
          if (p.chunk != ch || p.expert != experts || p.tensor->dtype != dtype) continue;
          members.push_back(&p);
          sizes.push_back({p.tensor->numel(), megatron_shared_embedding(p.key, first, last, P, tied, mtp)});
        }
        const std::string name = "distrib_optim" + at + "[" + std::to_string(gbuf) + "]";
        const PyRef entry = int_key(o, gbuf++);
        if (!entry || !entry->is(PyValue::Kind::dict) || entry->entries.size() != 1)
          LATTICE_FAIL() << path << ": no " << name << " (the buffer of model chunk " << ch << "'s " << dtype
                          << (experts ? " routed experts'" : "") << " parameters)" << kHint;
        const auto& [key, buffer] = entry->entries.front();
        const std::string saved_dtype = is_list(key) && !key->items.empty() ? dtype_name(key->items[0]) : "";
        if (saved_dtype != dtype)
          LATTICE_FAIL() << path << ": " << name << " holds a buffer of " << key->describe() << " parameters, where "
                          << "the rank's model chunk " << ch << " has " << dtype << " ones" << kHint;
        const auto saved = archive.number(present(buffer->get("numel_unpadded")), name + ".numel_unpadded");
        MegatronBufferLayout layout = megatron_buffer_layout(sizes, bucket_size, true);
        const int64_t padded = layout.total();
        if (saved && *saved != double(padded))  // Megatron-Core before 0.8: no padding before a parameter
          layout = megatron_buffer_layout(sizes, bucket_size, false);
        const int64_t total = layout.total();
        if (!saved || *saved != double(total))
          LATTICE_FAIL() << path << ": " << name << " holds "
                          << (!saved ? "no" : std::abs(*saved) < 1e15 ? std::to_string(int64_t(*saved))
                                                                      : std::to_string(*saved))
                          << " values (numel_unpadded), where the " << members.size() << " parameters of the rank's "
                          << "model chunk " << ch << " laid out as Megatron-Core's data-parallel buffer lays them "
                          << "take " << padded << " (" << total << " without the padding before each)" << kHint;
        PyRef flat[3];
        const char* slots[3] = {"param", "exp_avg", "exp_avg_sq"};
        for (int s = 0; s < 3; ++s) {
          flat[s] = present(buffer->get(slots[s]));
          const TorchTensor* t = TorchArchive::tensor(flat[s]);
          if (!t || t->dtype != "float32" || t->shape != std::vector<int64_t>{total})
            LATTICE_FAIL() << path << ": " << name << "." << slots[s] << " is "
                            << (t ? t->dtype + " " + shape_str(t->shape) : flat[s] ? flat[s]->describe() : "missing")
                            << ", not float32 [" << total << "]" << kHint;
        }
        for (size_t i = 0; i < members.size(); ++i) {
          const Param& p = *members[i];
          const int64_t at = layout.coalesced(i);
          out.chunks[size_t(ch)][p.key] = MegatronParamState{view_of(flat[1], at, p.tensor->shape),
                                                             view_of(flat[2], at, p.tensor->shape),
                                                             view_of(flat[0], at, p.tensor->shape)};
        }
      }
    }
    if (int_key(o, gbuf))
      LATTICE_FAIL() << path << ": distrib_optim" << at << " holds buffer " << gbuf << ", which none of the rank's "
                      << "parameters fill" << kHint;
  }
  return out;
}

}  // namespace lattice
