#include "pipeline/pipeline_runner.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "core/storage.h"
#include "core/timer.h"
#include "dist/comm.h"

namespace lattice {

struct PipelineRunner::SendBuffer {
  DeviceArray<float> data;  // device memory, like the model's gradient it copies
  std::unique_ptr<CommRequest> request;
};

namespace {

// Message tags: activations of micro-batch m entering virtual stage s, and the gradient
// leaving virtual stage s (towards s - 1), S virtual stages in all.
int forward_tag(int64_t m, int s, int S) { return int(2 * (m * S + s)); }
int backward_tag(int64_t m, int s, int S) { return int(2 * (m * S + s) + 1); }

}  // namespace

PipelineRunner::PipelineRunner(GPTModel& model, const PipelineLayout& layout, Comm* pp, Comm* embedding)
    : model_(model), layout_(layout), pp_(pp && pp->size() > 1 ? pp : nullptr), embedding_(embedding) {
  stage_ = pp_ ? pp_->rank() : 0;
  LATTICE_CHECK((pp_ ? pp_->size() : 1) == layout_.stages)
      << "pipeline group of " << (pp_ ? pp_->size() : 1) << " ranks for " << layout_.stages << " stages";
  LATTICE_CHECK(model_.num_chunks() == layout_.virtual_stages)
      << "model holds " << model_.num_chunks() << " chunks, the layout " << layout_.virtual_stages;
  const size_t n = size_t(model_.num_chunks() * model_.placement().slots);
  batches_.resize(n);
  activation_sends_.resize(n);
}

PipelineRunner::~PipelineRunner() { wait_sends(); }

void PipelineRunner::wait_sends() {
  for (auto& r : activation_sends_)
    if (r) r->wait(), r.reset();
  for (auto& b : grad_sends_)
    if (b->request) b->request->wait(), b->request.reset();
}

float* PipelineRunner::grad_send_buffer(size_t n) {
  for (auto& b : grad_sends_)
    if (!b->request || b->request->test()) {
      b->request.reset();
      b->data.resize(n);
      return b->data.data();
    }
  grad_sends_.push_back(std::make_unique<SendBuffer>());
  grad_sends_.back()->data.resize(n);
  return grad_sends_.back()->data.data();
}

PipelineRunner::Losses PipelineRunner::train(const Fetch& fetch, const std::function<MicroBatchKey(int64_t)>& key_of, int64_t M,
                             int64_t B, int64_t T, float grad_scale,
                             const std::function<void(bool)>& before_backward) {
  const int P = layout_.stages, S = P * layout_.virtual_stages, r = stage_;
  const int slots = model_.placement().slots;
  const std::vector<PipelineOp> ops = pipeline_schedule(layout_, M, r);
  LATTICE_CHECK(max_in_flight(ops) <= slots)
      << "the schedule keeps " << max_in_flight(ops) << " micro-batches in flight, the model has " << slots
      << " activation slots";
  const int64_t rows = model_.activation_elements(B, T);
  size_t last_backward = 0;
  for (size_t i = 0; i < ops.size(); ++i)
    if (!ops[i].forward) last_backward = i;

  std::vector<std::vector<int>> free_slots(static_cast<size_t>(model_.num_chunks()));
  for (auto& f : free_slots)
    for (int s = slots - 1; s >= 0; --s) f.push_back(s);
  std::vector<std::vector<int>> slot_of(static_cast<size_t>(model_.num_chunks()),
                                        std::vector<int>(static_cast<size_t>(M), -1));
  std::vector<int> live(static_cast<size_t>(model_.num_chunks()), 0);
  peak_ = 0;
  compute_seconds_ = 0;
  Timer total;
  Losses loss;
  loss.micro_batch_sums.assign(size_t(M), 0.0);
  auto context = [&](const char* what, int64_t m, int peer) {
    if (pp_)
      pp_->set_wait_context("stage " + std::to_string(r) + ", micro-batch " + std::to_string(m) + ": " + what +
                            " stage " + std::to_string(peer));
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipelineOp& op = ops[i];
    const int c = op.chunk, s = c * P + r;
    const int64_t m = op.micro_batch;
    if (op.forward) {
      const int slot = free_slots[size_t(c)].back();
      free_slots[size_t(c)].pop_back();
      slot_of[size_t(c)][size_t(m)] = slot;
      peak_ = std::max(peak_, ++live[size_t(c)]);
      const size_t k = size_t(c * slots + slot);
      if (activation_sends_[k]) activation_sends_[k]->wait(), activation_sends_[k].reset();
      fetch(m, &batches_[k]);
      if (s > 0) {
        context("forward activations from", m, (s - 1) % P);
        pp_->recv(model_.input_buffer(c, slot), rows, (s - 1) % P, forward_tag(m, s, S));
      }
      Timer compute;
      const MicroBatch& mb = batches_[k];
      const LossSum l = model_.forward_step(c, slot, mb.tokens.data(), mb.loss_mask_or_null(), B, T, grad_scale,
                                            key_of(m), mb.segments_or_null());
      compute_seconds_ += compute.seconds();
      if (s == S - 1) {
        loss.sum_of_means += l.count > 0 ? l.sum / l.count : 0.0;
        loss.tokens.sum += l.sum;
        loss.tokens.count += l.count;
        loss.micro_batch_sums[size_t(m)] = l.sum;
      } else {
        context("sending forward activations to", m, (s + 1) % P);
        activation_sends_[k] = pp_->isend(model_.output(c, slot), rows, (s + 1) % P, forward_tag(m, s + 1, S));
      }
    } else {
      const int slot = slot_of[size_t(c)][size_t(m)];
      LATTICE_CHECK(slot >= 0) << "backward of micro-batch " << m << " before its forward";
      if (s < S - 1) {
        context("backward gradients from", m, (s + 1) % P);
        pp_->recv(model_.output_grad_buffer(), rows, (s + 1) % P, backward_tag(m, s + 1, S));
      }
      if (before_backward) before_backward(i == last_backward);
      Timer compute;
      model_.backward_step(c, slot, B, T, key_of(m));
      compute_seconds_ += compute.seconds();
      if (s > 0) {
        float* buf = grad_send_buffer(size_t(rows));
        copy_on_device(buf, model_.input_grad(), size_t(rows) * sizeof(float));
        context("sending backward gradients to", m, (s - 1) % P);
        for (auto& b : grad_sends_)
          if (b->data.data() == buf) b->request = pp_->isend(buf, rows, (s - 1) % P, backward_tag(m, s, S));
      }
      free_slots[size_t(c)].push_back(slot);
      --live[size_t(c)];
    }
  }
  wait_sends();
  // What follows on this group (the loss, the gradient norm) still names the stage.
  if (pp_) pp_->set_wait_context("stage " + std::to_string(r) + ": after the schedule's last micro-batch");
  total_seconds_ = total.seconds();
  return loss;
}

LossSum PipelineRunner::evaluate(const Fetch& fetch, int64_t M, int64_t B, int64_t T) {
  const int P = layout_.stages, V = layout_.virtual_stages, S = P * V, r = stage_;
  const int64_t rows = model_.activation_elements(B, T);
  const int slots = model_.placement().slots;
  LossSum total;
  MicroBatchKey key;
  key.training = false;
  for (int64_t m = 0; m < M; ++m)
    for (int c = 0; c < V; ++c) {
      const int s = c * P + r;
      const size_t k = size_t(c * slots);
      if (activation_sends_[k]) activation_sends_[k]->wait(), activation_sends_[k].reset();
      fetch(m, &batches_[k]);
      if (s > 0) {
        if (pp_)
          pp_->set_wait_context("evaluation, stage " + std::to_string(r) + ", micro-batch " + std::to_string(m) +
                                ": forward activations from stage " + std::to_string((s - 1) % P));
        pp_->recv(model_.input_buffer(c, 0), rows, (s - 1) % P, forward_tag(m, s, S));
      }
      const MicroBatch& mb = batches_[k];
      const LossSum l = model_.forward_step(c, 0, mb.tokens.data(), mb.loss_mask_or_null(), B, T, 1.0f, key,
                                            mb.segments_or_null());
      if (s == S - 1) {
        total.sum += l.sum;
        total.count += l.count;
      } else {
        activation_sends_[k] = pp_->isend(model_.output(c, 0), rows, (s + 1) % P, forward_tag(m, s + 1, S));
      }
    }
  wait_sends();
  if (pp_) {
    pp_->set_wait_context("stage " + std::to_string(r) + ": the evaluation loss from the last stage");
    double v[2] = {total.sum, total.count};
    pp_->all_reduce(v, 2, ReduceOp::sum);
    total.sum = v[0];
    total.count = v[1];
  }
  return total;
}

void PipelineRunner::finish_shared_embedding_grads() {
  const int k = model_.shared_embedding();
  if (k < 0) return;
  LATTICE_CHECK(embedding_) << "a shared word embedding needs the embedding group";
  const ParamInfo& p = model_.params().infos()[size_t(k)];
  embedding_->set_wait_context("stage " + std::to_string(stage_) + ", after the last micro-batch: tied word-embedding "
                               "gradients with stage " + std::to_string(stage_ == 0 ? layout_.stages - 1 : 0));
  embedding_->all_reduce(model_.params().grad(k), p.numel, ReduceOp::sum);
  embedding_->set_wait_context("");
  model_.report_grad_ready(k);
}

double PipelineRunner::from_last_stage(double value) {
  from_last_stage(&value, 1);
  return value;
}

void PipelineRunner::from_last_stage(double* values, int n) {
  if (!pp_) return;
  if (stage_ != layout_.stages - 1) std::fill(values, values + n, 0.0);
  const std::string before = pp_->wait_context();
  pp_->set_wait_context("stage " + std::to_string(stage_) + ": the loss from the last stage");
  pp_->all_reduce(values, n, ReduceOp::sum);
  pp_->set_wait_context(before);
}

}  // namespace lattice
