// Megatron-LM checkpoints (--ckpt-format torch) -> lattice: the pickle reader against bytes Python's pickle
// wrote; each rank file of checkpoints written by tests/fixtures/make_megatron_fixture.py (torch.save of
// Megatron-Core state dicts split as Megatron splits them, from the reference GPT fixtures) reassembled into
// exactly the reference's tensors (tensor parallelism 2 with pipeline parallelism 2, SwiGLU, the distributed
// optimizer's shared buffer; tensor parallelism 2 with Transformer Engine's names, grouped-query attention, qk
// norms, bf16); torch_dist's Adam state (moments, fp32 main parameters, step, scheduler, loss scaler); the converted
// checkpoint loaded back; and broken checkpoints refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/megatron_checkpoint.h"
#include "checkpoint/megatron_export.h"
#include "checkpoint/model_checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/torch_archive.h"
#include "checkpoint/torch_dcp.h"
#include "checkpoint/torch_pickle.h"
#include "core/error.h"
#include "hf_test_util.h"
#include "kernels/cast_math.h"

namespace fs = std::filesystem;

namespace lattice {
namespace {

using hf_test::fixture;
using hf_test::TempDir;

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(uint8_t(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// pickle.dumps({'a': [1, 2.5, 'x', None, True], 'b': (1 << 40, -3, -300000),
//               'c': collections.OrderedDict([('k', b'by')])}, protocol=2)
const char* kProtocol2 =
    "80027d71002858010000006171015d7102284b0147400400000000000058010000007871034e886558010000006271048a0600000000"
    "00014afdffffff4a206cfbff877105580100000063710663636f6c6c656374696f6e730a4f726465726564446963740a7107295271"
    "0858010000006b7109635f636f646563730a656e636f64650a710a58020000006279710b58060000006c6174696e31710c86710d52"
    "710e73752e";
// l = [1, 2]; pickle.dumps({'s': 'é', 'n': [False, 255, 65535, -1], 'same': (l, l)}, protocol=4)
const char* kProtocol4 =
    "80049534000000000000007d94288c0173948c02c3a9948c016e945d9428894bff4dffff4affffffff658c0473616d65945d94284b01"
    "4b026568068694752e";

TEST(TorchPickle, ReadsWhatPythonWrote) {
  const std::vector<uint8_t> p2 = from_hex(kProtocol2);
  const PyRef v = unpickle(p2.data(), p2.size(), "p2");
  ASSERT_TRUE(v->is(PyValue::Kind::dict));
  const PyRef a = v->get("a");
  ASSERT_TRUE(a && a->is(PyValue::Kind::list));
  ASSERT_EQ(a->items.size(), 5u);
  EXPECT_EQ(a->items[0]->integer, 1);
  EXPECT_EQ(a->items[1]->floating, 2.5);
  EXPECT_EQ(a->items[2]->text, "x");
  EXPECT_TRUE(a->items[3]->is(PyValue::Kind::none));
  EXPECT_TRUE(a->items[4]->boolean);
  const PyRef b = v->get("b");
  ASSERT_TRUE(b->is(PyValue::Kind::tuple));
  EXPECT_EQ(b->items[0]->integer, int64_t(1) << 40);
  EXPECT_EQ(b->items[1]->integer, -3);
  EXPECT_EQ(b->items[2]->integer, -300000);
  const PyRef c = v->get("c");  // OrderedDict: a dict; protocol 2's bytes: _codecs.encode
  ASSERT_TRUE(c->is(PyValue::Kind::dict));
  ASSERT_TRUE(c->get("k")->is(PyValue::Kind::bytes));
  EXPECT_EQ(c->get("k")->text, "by");

  const std::vector<uint8_t> p4 = from_hex(kProtocol4);
  const PyRef w = unpickle(p4.data(), p4.size(), "p4");
  EXPECT_EQ(w->get("s")->text, "\xc3\xa9");
  const PyRef n = w->get("n");
  ASSERT_EQ(n->items.size(), 4u);
  EXPECT_FALSE(n->items[0]->boolean);
  EXPECT_EQ(n->items[1]->integer, 255);
  EXPECT_EQ(n->items[2]->integer, 65535);
  EXPECT_EQ(n->items[3]->integer, -1);
  const PyRef same = w->get("same");  // one list, memoized: both entries are it
  ASSERT_EQ(same->items.size(), 2u);
  EXPECT_EQ(same->items[0].get(), same->items[1].get());
  EXPECT_EQ(same->items[0]->items.size(), 2u);
}

TEST(TorchPickle, MalformedInputIsAnErrorWithItsOffset) {
  std::vector<uint8_t> p2 = from_hex(kProtocol2);
  const std::vector<uint8_t> truncated(p2.begin(), p2.begin() + 40);
  EXPECT_NE(error_of([&] { unpickle(truncated.data(), truncated.size(), "cut.pkl"); }).find("cut.pkl: not a readable "
                                                                                           "pickle: truncated"),
            std::string::npos);
  std::vector<uint8_t> unknown = p2;
  unknown[2] = 0xff;
  const std::string e = error_of([&] { unpickle(unknown.data(), unknown.size(), "odd.pkl"); });
  EXPECT_NE(e.find("unknown pickle opcode 0xff at byte 2"), std::string::npos) << e;
  const std::vector<uint8_t> stop_early = {0x80, 0x02, 0x4e, 0x4e, 0x2e};  // two values, then STOP
  EXPECT_NE(error_of([&] { unpickle(stop_early.data(), stop_early.size(), "x"); }).find("STOP with 2 values"),
            std::string::npos);
  const std::vector<uint8_t> bad_get = {0x80, 0x02, 0x68, 0x07, 0x2e};  // BINGET of a memo never stored
  EXPECT_NE(error_of([&] { unpickle(bad_get.data(), bad_get.size(), "x"); }).find("memo entry 7 never stored"),
            std::string::npos);
}

std::string megatron_fixture(const std::string& name) { return fixture("megatron/" + name); }

std::string rank_file(const std::string& name, const std::string& rank) {
  return megatron_fixture(name) + "/iter_0000100/" + rank + "/model_optim_rng.pt";
}

// A copy of a fixture checkpoint to break.
std::string copy_of(const std::string& name, const TempDir& t) {
  const fs::path to = t.path / name;
  fs::copy(megatron_fixture(name), to, fs::copy_options::recursive);
  return to.string();
}

TEST(TorchArchive, TensorsAreReadFromTheirStorageAtTheirOffset) {
  // The distributed optimizer's buffer: every parameter a view into one storage.
  TorchArchive a(rank_file("gpt_tiny_swiglu_tp2_pp2", "mp_rank_01_000"));
  const PyRef model = a.root()->get("model");
  ASSERT_TRUE(model);
  const TorchTensor* wte = TorchArchive::tensor(model->get("embedding.word_embeddings.weight"));
  const TorchTensor* qkv = TorchArchive::tensor(model->get("decoder.layers.0.self_attention.linear_qkv.weight"));
  ASSERT_TRUE(wte && qkv);
  EXPECT_EQ(wte->storage, qkv->storage);
  EXPECT_NE(wte->offset, qkv->offset);
  EXPECT_EQ(wte->shape, (std::vector<int64_t>{64, 64}));  // rank 1's half of the 128 padded rows
  EXPECT_EQ(wte->dtype, "float32");
  std::vector<float> rows(size_t(wte->numel()));
  a.read_float(*wte, "embedding.word_embeddings.weight", rows.data());
  const SafetensorsFile ref = SafetensorsFile::read(fixture("gpt_tiny_swiglu.safetensors"));
  const SafeTensor& whole = ref.get("embedding.word_embeddings.weight");
  for (int64_t i = 0; i < wte->numel(); ++i) {
    float expect;
    std::memcpy(&expect, whole.bytes.data() + 4 * (64 * 64 + i), 4);
    ASSERT_EQ(rows[size_t(i)], expect) << i;
  }
  // The args: an argparse.Namespace with the saved flags (an enum, a torch dtype among them).
  const PyRef args = a.root()->get("args");
  EXPECT_EQ(args->qualified_name(), "argparse.Namespace");
  EXPECT_EQ(args->get("tensor_model_parallel_size")->integer, 2);
  const PyRef backend = args->get("attention_backend");  // an enum member: getattr(AttnBackend, 'auto')
  EXPECT_EQ(backend->qualified_name(), "__builtin__.getattr");
  ASSERT_EQ(backend->args->items.size(), 2u);
  EXPECT_EQ(backend->args->items[0]->qualified_name(), "megatron.core.transformer.enums.AttnBackend");
  EXPECT_EQ(backend->args->items[1]->text, "auto");
  EXPECT_EQ(args->get("params_dtype")->qualified_name(), "torch.float32");
}

// Every parameter of the converted model equals the reference fixture's (bf16: its value rounded to bf16).
void expect_reference_parameters(const MegatronSource& src, const std::string& reference, bool bf16) {
  const SafetensorsFile ref = SafetensorsFile::read(reference.find('/') == 0 ? reference : fixture(reference));
  const ParamBuffer reg = GPTModel::parameter_registry(src.source.config, TensorParallel{}, ModelPlacement{}, 0, 1);
  ASSERT_FALSE(reg.infos().empty());
  for (const ParamInfo& p : reg.infos()) {
    std::vector<float> got(size_t(p.numel));
    src.source.fill(p, got.data());
    const std::vector<float> want = hf::read_float_tensor(ref, p.name);
    ASSERT_EQ(want.size(), got.size()) << p.name;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], bf16 ? math::round_bf16(want[i]) : want[i]) << p.name << " element " << i;
  }
}

TEST(MegatronCheckpoint, TensorAndPipelineParallelRanksMakeTheReferenceModel) {
  const MegatronSource src = open_megatron_checkpoint(megatron_fixture("gpt_tiny_swiglu_tp2_pp2"));
  EXPECT_EQ(src.tp, 2);
  EXPECT_EQ(src.pp, 2);
  EXPECT_EQ(src.vp, 1);
  EXPECT_FALSE(src.transformer_engine);
  EXPECT_EQ(src.iteration, 100);
  const TransformerConfig& c = src.source.config;
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_TRUE(c.swiglu);
  EXPECT_FALSE(c.rope());
  EXPECT_EQ(c.padded_vocab_size, 128);
  EXPECT_EQ(src.seq_length, 16);
  EXPECT_EQ(src.tokenizer.type, "NullTokenizer");
  expect_reference_parameters(src, "gpt_tiny_swiglu.safetensors", false);
}

TEST(MegatronCheckpoint, TheLegacyModelsNames) {
  // --use-legacy-models (and Megatron-LM before Megatron-Core): nested language_model.{embedding, encoder,
  // output_layer} with query_key_value, dense, post_attention_layernorm, dense_h_to_4h, dense_4h_to_h, and a
  // tied model's last stage holding word_embeddings_for_head.
  const MegatronSource src = open_megatron_checkpoint(megatron_fixture("gpt_tiny_swiglu_tp2_pp2_legacy"));
  EXPECT_TRUE(src.legacy);
  EXPECT_FALSE(src.transformer_engine);
  expect_reference_parameters(src, "gpt_tiny_swiglu.safetensors", false);
}

TEST(MegatronCheckpoint, TransformerEngineNamesGroupedQueriesAndBf16) {
  // The model's own bf16 tensors (without the optimizer's fp32 main parameters, which the next tests read).
  const MegatronSource src =
      open_megatron_checkpoint(megatron_fixture("gpt_tiny_rope_gqa2_qknorm_tp2_te_bf16"), /*load_optim=*/false);
  EXPECT_EQ(src.tp, 2);
  EXPECT_EQ(src.pp, 1);
  EXPECT_TRUE(src.transformer_engine);
  const TransformerConfig& c = src.source.config;
  EXPECT_TRUE(c.rope());
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_TRUE(c.qk_layernorm);
  expect_reference_parameters(src, "gpt_tiny_rope_gqa2_qknorm.safetensors", true);
}

TEST(MegatronCheckpoint, ExpertParallelRanksAndGroupedExperts) {
  // Tensor parallelism 2 x expert parallelism 2 (mp_rank_TT_EEE), Transformer Engine's grouped experts
  // (mlp.experts.linear_fc1.weight<i>), gated shared experts, a dense first layer.
  const MegatronSource src =
      open_megatron_checkpoint(megatron_fixture("gpt_tiny_nobias_swiglu_moe4_shared_tp2_ep2_te_grouped"));
  EXPECT_EQ(src.tp, 2);
  EXPECT_EQ(src.pp, 1);
  EXPECT_EQ(src.ep, 2);
  const TransformerConfig& c = src.source.config;
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.moe_router_topk, 2);
  EXPECT_EQ(c.moe_layer_pattern, (std::vector<int>{0, 1}));
  EXPECT_TRUE(c.moe_shared_expert_gate);
  expect_reference_parameters(src, "gpt_tiny_nobias_swiglu_moe4_shared.safetensors", false);
}

TEST(MegatronCheckpoint, VirtualPipelineStagesPlaceEachChunksLayers) {
  // 4 layers over 2 stages x 2 virtual stages: stage r's model<v> holds layer 2v + r, numbered 0.
  const std::string dir = megatron_fixture("gpt_tiny_x2_pp2_vp2");
  const MegatronSource src = open_megatron_checkpoint(dir);
  EXPECT_EQ(src.pp, 2);
  EXPECT_EQ(src.vp, 2);
  EXPECT_EQ(src.source.config.num_layers, 4);
  expect_reference_parameters(src, dir + "/reference.safetensors", false);
}

TEST(MegatronCheckpoint, TorchDistCheckpointsAreReadWhole) {
  // --ckpt-format torch_dist: common.pt's args, .metadata's chunks (each tensor-parallel rank's part of every
  // layer's tensor, SwiGLU's gate and up chunks), the __R_0.distcp files of 2 x 2 ranks; Transformer Engine's
  // names; the optimizer's tensors and the extra state's bytes beside them.
  const MegatronSource src = open_megatron_checkpoint(megatron_fixture("gpt_tiny_swiglu_tp2_pp2_te_dist"));
  EXPECT_TRUE(src.torch_dist);
  EXPECT_TRUE(src.transformer_engine);
  EXPECT_EQ(src.tp, 2);
  EXPECT_EQ(src.pp, 2);
  EXPECT_EQ(src.iteration, 100);
  expect_reference_parameters(src, "gpt_tiny_swiglu.safetensors", false);
  // bf16 weights: without the optimizer's fp32 main parameters, the model's rounded values.
  const MegatronSource bf16 =
      open_megatron_checkpoint(megatron_fixture("gpt_tiny_rope_gqa2_qknorm_tp2_dist_bf16"), /*load_optim=*/false);
  EXPECT_FALSE(bf16.transformer_engine);
  EXPECT_FALSE(bf16.optimizer);
  EXPECT_EQ(bf16.optimizer_note, "not read (--no-load-optim)");
  expect_reference_parameters(bf16, "gpt_tiny_rope_gqa2_qknorm.safetensors", true);
  // A mixture of experts over 2 tensor- x 2 expert-parallel ranks, the experts whole (--expert-tensor-parallel-size
  // 1): the routed experts stacked after the layers (decoder.layers.mlp.experts.experts.<rest> [L, E, ...]), gated
  // shared experts, a dense first layer.
  const MegatronSource moe =
      open_megatron_checkpoint(megatron_fixture("gpt_tiny_nobias_swiglu_moe4_shared_tp2_ep2_dist"));
  EXPECT_EQ(moe.source.config.num_experts, 4);
  EXPECT_EQ(moe.ep, 2);
  expect_reference_parameters(moe, "gpt_tiny_nobias_swiglu_moe4_shared.safetensors", false);
  // Each layer's tensors their own (decoder.layers.<l>.<rest>: Megatron-Core's non_homogeneous_layers form).
  const MegatronSource own = open_megatron_checkpoint(megatron_fixture("gpt_tiny_tp2_dist_unstacked"));  // fp16: its main params
  expect_reference_parameters(own, "gpt_tiny.safetensors", false);
}

// The optimizer's state of a converted model: each parameter's Adam moments as the fixture made them from the
// reference (exp_avg = -p, exp_avg_sq = p * p) and its fp32 main parameter (the reference's exact values).
void expect_reference_optimizer(const MegatronSource& src, const std::string& reference) {
  ASSERT_TRUE(src.optimizer) << src.optimizer_note;
  const SafetensorsFile ref = SafetensorsFile::read(reference.find('/') == 0 ? reference : fixture(reference));
  const ParamBuffer reg = GPTModel::parameter_registry(src.source.config, TensorParallel{}, ModelPlacement{}, 0, 1);
  for (const ParamInfo& p : reg.infos()) {
    std::vector<float> m(size_t(p.numel)), v(size_t(p.numel));
    src.optimizer->exp_avg(p, m.data());
    src.optimizer->exp_avg_sq(p, v.data());
    const std::vector<float> w = hf::read_float_tensor(ref, p.name);
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(m[i], -w[i]) << p.name << " exp_avg element " << i;
      ASSERT_EQ(v[i], w[i] * w[i]) << p.name << " exp_avg_sq element " << i;
    }
  }
  expect_reference_parameters(src, reference, false);  // the fp32 main parameters, not the bf16/fp16 model's
  EXPECT_EQ(src.optimizer->step, 100);
  EXPECT_EQ(src.consumed_train_samples, 800);
  EXPECT_EQ(src.seed, 1234u);
  EXPECT_EQ(src.optimizer->opt_param_scheduler.at("num_steps"), 800);
  EXPECT_EQ(src.optimizer->opt_param_scheduler.at("lr_decay_style"), "cosine");
  EXPECT_EQ(src.optimizer->opt_param_scheduler.at("lr_decay_steps"), 1600);
}

TEST(MegatronCheckpoint, TorchDistAdamStateComesOver) {
  // The non-distributed optimizer of a bf16 run: exp_avg, exp_avg_sq and the fp32 main parameters (fp32_param)
  // named after their parameters' tensors, sharded as they are; Transformer Engine's FusedAdam's step in each
  // param group.
  const MegatronSource bf16 = open_megatron_checkpoint(megatron_fixture("gpt_tiny_rope_gqa2_qknorm_tp2_dist_bf16"));
  expect_reference_optimizer(bf16, "gpt_tiny_rope_gqa2_qknorm.safetensors");
  EXPECT_EQ(bf16.optimizer->form, "the non-distributed optimizer's named state (torch_dist)");
  EXPECT_FALSE(bf16.optimizer->grad_scaler);
  // A mixture of experts: the chained optimizer (dense, then the experts') with Megatron-Core's chained_<i>. prefix
  // before 0.14, its common.pt state a dict of both; torch.optim's per-parameter step saved once (common_step).
  const MegatronSource moe = open_megatron_checkpoint(megatron_fixture("gpt_tiny_nobias_swiglu_moe4_shared_tp2_ep2_dist"));
  expect_reference_optimizer(moe, "gpt_tiny_nobias_swiglu_moe4_shared.safetensors");
  // The distributed optimizer saved fully reshardable (its main parameters named param), per-layer tensors, fp16:
  // the loss scaler too.
  const MegatronSource fp16 = open_megatron_checkpoint(megatron_fixture("gpt_tiny_tp2_dist_unstacked"));
  expect_reference_optimizer(fp16, "gpt_tiny.safetensors");
  EXPECT_EQ(fp16.optimizer->form, "the distributed optimizer's fully reshardable state (torch_dist)");
  ASSERT_TRUE(fp16.optimizer->grad_scaler);
  EXPECT_EQ(fp16.optimizer->grad_scaler->scale, 32768.0);
  EXPECT_EQ(fp16.optimizer->grad_scaler->growth_tracker, 7);
  EXPECT_EQ(fp16.optimizer->grad_scaler->hysteresis_tracker, 2);
  // The distributed optimizer's fully_sharded_model_space form (Megatron-Core 0.8-0.13 with
  // --ckpt-fully-parallel-save): the named state, each data-parallel rank's flattened range of a tensor-parallel part
  // reformulated ([fragments..., fragment numel], .metadata's mcore_data naming the tensor's shape), SwiGLU's fc1 in
  // 2 x TP fragments, the main parameters as fp32_param.
  const MegatronSource flat = open_megatron_checkpoint(megatron_fixture("gpt_tiny_swiglu_tp2_pp2_te_dist_flat_bf16"));
  expect_reference_optimizer(flat, "gpt_tiny_swiglu.safetensors");
  EXPECT_EQ(flat.optimizer->form, "the distributed optimizer's flattened state (torch_dist, fully_sharded_model_space)");
  // What is not read is said: a mixture of experts' distributed-optimizer buffers.
  const MegatronSource buffers = open_megatron_checkpoint(megatron_fixture("gpt_tiny_nobias_moe4_mtp1_tp2_ep2_dist"));
  EXPECT_FALSE(buffers.optimizer);
  EXPECT_NE(buffers.optimizer_note.find("flat buffers (optimizer.distributed.*"), std::string::npos)
      << buffers.optimizer_note;
  // ... and how Megatron re-saves it in a form lattice reads.
  EXPECT_NE(buffers.optimizer_note.find("--ckpt-convert-format torch --ckpt-convert-save DIR"), std::string::npos)
      << buffers.optimizer_note;
}

TEST(MegatronCheckpoint, TorchFormatAdamStateComesOverByItsNumbering) {
  // --ckpt-format torch numbers the state: each rank's state dict order and its saved param groups give every
  // parameter its number. A bf16 run's Float16OptimizerWithFloat16Params (the fp32 main parameters group by group,
  // checked against the model's rounded copies), Transformer Engine's fused norms (1-D: no weight decay), FusedAdam's
  // per-group step.
  const MegatronSource bf16 = open_megatron_checkpoint(megatron_fixture("gpt_tiny_rope_gqa2_qknorm_tp2_te_bf16"));
  expect_reference_optimizer(bf16, "gpt_tiny_rope_gqa2_qknorm.safetensors");
  EXPECT_EQ(bf16.optimizer->form, "the optimizer's numbered state (--ckpt-format torch)");
  // A mixture of experts over 2 tensor- x 2 expert-parallel ranks: the chained optimizer's list (the dense
  // parameters', then the routed experts'), grouped experts, torch.optim's per-parameter steps.
  const MegatronSource moe =
      open_megatron_checkpoint(megatron_fixture("gpt_tiny_nobias_swiglu_moe4_shared_tp2_ep2_te_grouped"));
  expect_reference_optimizer(moe, "gpt_tiny_nobias_swiglu_moe4_shared.safetensors");
  // Saved without an optimizer state (--no-save-optim): said.
  const MegatronSource none = open_megatron_checkpoint(megatron_fixture("gpt_tiny_swiglu_tp2_pp2"));
  EXPECT_FALSE(none.optimizer);
  EXPECT_NE(none.optimizer_note.find("none saved"), std::string::npos) << none.optimizer_note;
  // Two parameters of one shape numbered the other's way round: their main parameters do not round to the
  // model's values, which the read of the weights refuses by name.
  const MegatronSource swapped = open_megatron_checkpoint(megatron_fixture("gpt_tiny_optim_order"));
  ASSERT_TRUE(swapped.optimizer);
  std::string e;
  const ParamBuffer reg = GPTModel::parameter_registry(swapped.source.config, TensorParallel{}, ModelPlacement{}, 0, 1);
  for (const ParamInfo& p : reg.infos()) {
    std::vector<float> v(size_t(p.numel));
    if (e.empty()) e = error_of([&] { swapped.source.fill(p, v.data()); });
  }
  EXPECT_NE(e.find("does not round to the model's"), std::string::npos) << e;
  EXPECT_NE(e.find("--no-load-optim"), std::string::npos) << e;
}

// Flips a bit of the byte in the middle of `file` (a tensor's stored values, in these fixtures).
void flip_middle_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(fs::file_size(file) / 2));
  const char c = char(f.get());
  f.seekp(std::streamoff(fs::file_size(file) / 2));
  f.put(char(c ^ 0x40));
}

// Opens DIR and reads every value it converts (weights and Adam's moments): what convert does before writing.
void convert_all(const std::string& dir) {
  const MegatronSource src = open_megatron_checkpoint(dir);
  const ParamBuffer reg = GPTModel::parameter_registry(src.source.config, TensorParallel{}, ModelPlacement{}, 0, 1);
  for (const ParamInfo& p : reg.infos()) {
    std::vector<float> v(size_t(p.numel));
    src.source.fill(p, v.data());
    if (src.optimizer) {
      src.optimizer->exp_avg(p, v.data());
      src.optimizer->exp_avg_sq(p, v.data());
    }
  }
}

// Every fp32 main parameter read through `src`'s fill (the weights); the first error, or "".
std::string error_filling(const MegatronSource& src) {
  std::string e;
  const ParamBuffer reg = GPTModel::parameter_registry(src.source.config, TensorParallel{}, ModelPlacement{}, 0, 1);
  for (const ParamInfo& p : reg.infos()) {
    std::vector<float> v(size_t(p.numel));
    if (e.empty()) e = error_of([&] { src.source.fill(p, v.data()); });
  }
  return e;
}

TEST(MegatronCheckpoint, DistributedOptimizerStateComesOverFromItsBuffers) {
  // --use-distributed-optimizer with --ckpt-format torch: each rank directory's distrib_optim.pt, the buckets of its
  // data-parallel buffers coalesced, laid out as Megatron-Core's _ParamAndGradBuffer lays them. A bf16 model of
  // 4 layers over 2 tensor- x 2 pipeline-parallel ranks x 2 virtual stages (a buffer per model chunk), buckets of
  // 6432 elements on the first stage's first chunk (--overlap-grad-reduce --ddp-bucket-size; one closes after a
  // k_layernorm bias of 16, so the next bucket's first parameter follows it unpadded), the tied word embedding and
  // its last-stage copy in buckets of their own, each parameter at a multiple of 64 elements (the qk norms' 16
  // leave gaps). Neither the buckets, nor the padding, nor their absence alone give these offsets.
  const std::string dir = megatron_fixture("gpt_tiny_rope_gqa2_qknorm_x2_tp2_pp2_vp2_distopt_bf16");
  const MegatronSource src = open_megatron_checkpoint(dir);
  EXPECT_EQ(src.vp, 2);
  expect_reference_optimizer(src, dir + "/reference.safetensors");
  EXPECT_EQ(src.optimizer->form, "the distributed optimizer's distrib_optim.pt (--ckpt-format torch)");
  // A mixture of experts over 2 tensor- x 2 expert-parallel ranks: the chained optimizer's list (the dense buffer's
  // state on expert-parallel rank 0 alone, None on rank 1; the routed experts' on each), grouped experts, fp32.
  expect_reference_optimizer(
      open_megatron_checkpoint(megatron_fixture("gpt_tiny_nobias_swiglu_moe4_shared_tp2_ep2_te_distopt")),
      "gpt_tiny_nobias_swiglu_moe4_shared.safetensors");
  // Megatron-Core before 0.8: no padding before a parameter (the qk norms' 16 elements follow each other).
  expect_reference_optimizer(open_megatron_checkpoint(megatron_fixture("gpt_tiny_rope_gqa2_qknorm_distopt_older")),
                             "gpt_tiny_rope_gqa2_qknorm.safetensors");

  TempDir t("megatron_distopt");
  const std::string copy = copy_of("gpt_tiny_rope_gqa2_qknorm_x2_tp2_pp2_vp2_distopt_bf16", t);
  const fs::path iter = fs::path(copy) / "iter_0000100";
  // Another tensor-parallel rank's file (the same sizes, other values): its main parameters do not round to the
  // model's, refused as the weights are read.
  fs::copy_file(iter / "mp_rank_01_000/distrib_optim.pt", iter / "mp_rank_00_000/distrib_optim.pt",
                fs::copy_options::overwrite_existing);
  std::string e = error_filling(open_megatron_checkpoint(copy));
  EXPECT_NE(e.find("does not round to the model's"), std::string::npos) << e;
  // Another stage's file: its buffers' sizes are not the rank's parameters' laid out, refused on opening.
  fs::copy_file(iter / "mp_rank_00_001/distrib_optim.pt", iter / "mp_rank_00_000/distrib_optim.pt",
                fs::copy_options::overwrite_existing);
  e = error_of([&] { open_megatron_checkpoint(copy); });
  EXPECT_NE(e.find("mp_rank_00_000/distrib_optim.pt: distrib_optim[0] holds 23360 values (numel_unpadded), where the "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--no-load-optim"), std::string::npos) << e;
  // A byte of a buffer's values flipped: each parameter reads a view into the buffer's record, which is checked
  // whole against its CRC-32 once (read through a window), so the damage is found whichever parameter it hits.
  fs::copy_file(megatron_fixture("gpt_tiny_rope_gqa2_qknorm_x2_tp2_pp2_vp2_distopt_bf16") +
                    "/iter_0000100/mp_rank_00_000/distrib_optim.pt",
                iter / "mp_rank_00_000/distrib_optim.pt", fs::copy_options::overwrite_existing);
  flip_middle_byte(iter / "mp_rank_00_000/distrib_optim.pt");
  e = error_of([&] { convert_all(copy); });
  EXPECT_NE(e.find("mp_rank_00_000/distrib_optim.pt: storage "), std::string::npos) << e;
  EXPECT_NE(e.find("is truncated or corrupt (its CRC-32)"), std::string::npos) << e;
  // One rank's file missing: refused by name before any is read; --no-load-optim converts the weights (the bf16
  // model's).
  fs::remove(iter / "mp_rank_01_001/distrib_optim.pt");
  e = error_of([&] { open_megatron_checkpoint(copy); });
  EXPECT_NE(e.find("mp_rank_01_001/distrib_optim.pt is missing"), std::string::npos) << e;
  const MegatronSource weights = open_megatron_checkpoint(copy, false);
  EXPECT_FALSE(weights.optimizer);
  expect_reference_parameters(weights, dir + "/reference.safetensors", true);
}

TEST(MegatronCheckpoint, DistributedOptimizerBuffersInTorchDist) {
  // --use-distributed-optimizer with torch_dist (Megatron-Core's defaults): each model-parallel rank's buckets as
  // 1-D tensors (dp_reshardable), laid out from Megatron-Core's named_parameters order (no rank's state dict is
  // saved). bf16, 2 tensor- x 2 pipeline-parallel ranks, Transformer Engine's names and fused norms, qk norms,
  // buckets of 4160 elements on the first stage, the tied word embedding and its last-stage copy in buckets of their
  // own; the gaps' garbage (NaN) never read.
  const std::string dir = megatron_fixture("gpt_tiny_rope_gqa2_qknorm_tp2_pp2_te_dist_distopt_bf16");
  const MegatronSource src = open_megatron_checkpoint(dir);
  EXPECT_TRUE(src.torch_dist);
  expect_reference_optimizer(src, "gpt_tiny_rope_gqa2_qknorm.safetensors");
  EXPECT_EQ(src.optimizer->form, "the distributed optimizer's dp_reshardable buckets (torch_dist)");
  // A range of a bucket read across its chunks (a parameter each, split where the data-parallel ranks' shards meet):
  // the same values as the whole bucket's, where a chunk begins before or ends after the range too.
  const DcpCheckpoint dcp(dir + "/iter_0000100");
  const std::string bucket =
      "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_1.param";
  ASSERT_TRUE(dcp.tensors().count(bucket));
  const int64_t n = dcp.tensors().at(bucket).size[0];
  ASSERT_GT(n, 100);
  std::vector<float> all(static_cast<size_t>(n)), part(static_cast<size_t>(n - 70));
  dcp.read_float_range(bucket, 0, n, all.data());
  dcp.read_float_range(bucket, 33, n - 70, part.data());
  for (int64_t i = 0; i < n - 70; ++i)
    if (!std::isnan(all[size_t(33 + i)])) ASSERT_EQ(part[size_t(i)], all[size_t(33 + i)]) << i;
  EXPECT_NE(error_of([&] { dcp.read_float_range(bucket, n - 4, 8, part.data()); }).find("has no elements"),
            std::string::npos);
  // A bucket's values damaged: every value is in a chunk of its own record, CRC-checked.
  TempDir t("megatron_dist_buffers");
  const std::string copy = copy_of("gpt_tiny_rope_gqa2_qknorm_tp2_pp2_te_dist_distopt_bf16", t);
  flip_middle_byte(fs::path(copy) / "iter_0000100/__1_0.distcp");
  const std::string e = error_of([&] { convert_all(copy); });
  EXPECT_NE(e.find("__1_0.distcp"), std::string::npos) << e;
}

TEST(MegatronCheckpoint, ConvertedAdamStateIsATrainingCheckpoint) {
  // The training checkpoint made of it: at the run's iteration, with its data position, step, scheduler and
  // moments; loading it into a model and Adam gives back every value.
  const MegatronSource src = open_megatron_checkpoint(megatron_fixture("gpt_tiny_rope_gqa2_qknorm_tp2_dist_bf16"));
  ASSERT_TRUE(src.optimizer);
  TempDir out("megatron_convert_optim");
  CheckpointState s;
  s.iteration = src.iteration;
  s.consumed_train_samples = src.consumed_train_samples;
  s.optimizer = OptimizerState{"adam", src.optimizer->step};
  s.opt_param_scheduler = src.optimizer->opt_param_scheduler;
  s.rng = RngState{src.seed};
  const std::string dir = out.str() + "/ckpt";
  save_streamed_checkpoint(dir, s, src.source.config, src.source.fill,
                           {{kOptimizerFile, "optimizer.exp_avg.", src.optimizer->exp_avg},
                            {kOptimizerFile, "optimizer.exp_avg_sq.", src.optimizer->exp_avg_sq}});
  const CheckpointReader r = CheckpointReader::open(dir);
  EXPECT_EQ(r.state().iteration, 100);
  EXPECT_EQ(r.state().consumed_train_samples, 800);
  ASSERT_TRUE(r.state().optimizer);
  EXPECT_EQ(r.state().optimizer->step, 100);
  const SafetensorsFile ref = SafetensorsFile::read(fixture("gpt_tiny_rope_gqa2_qknorm.safetensors"));
  const SafetensorsFile optim = SafetensorsFile::read(r.iter_dir() + "/optimizer.safetensors");
  const SafetensorsFile model = SafetensorsFile::read(r.iter_dir() + "/model.safetensors");
  for (const std::string& name : ref.names()) {
    if (name.rfind("decoder.", 0) != 0 && name.rfind("embedding.", 0) != 0 && name.rfind("output_layer.", 0) != 0)
      continue;
    const std::vector<float> w = hf::read_float_tensor(ref, name);
    EXPECT_EQ(hf::read_float_tensor(model, name), w) << name;
    const std::vector<float> m = hf::read_float_tensor(optim, "optimizer.exp_avg." + name);
    ASSERT_EQ(m.size(), w.size()) << name;
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(m[i], -w[i]) << name << " element " << i;
  }
}

TEST(MegatronCheckpoint, IncompleteAdamStateIsRefusedByName) {
  // One tensor's exp_avg_sq missing for layer 1 (the stacked tensor holds layer 0's alone): refused, naming it.
  const std::string e =
      error_of([&] { open_megatron_checkpoint(megatron_fixture("gpt_tiny_dist_optim_missing")); });
  EXPECT_NE(e.find("optimizer.state.exp_avg_sq.decoder.layers.mlp.linear_fc2.weight at layer 1: its chunks hold 0 "
                   "of its 16384 values"),
            std::string::npos)
      << e;
  // --no-load-optim: the weights alone.
  const MegatronSource weights = open_megatron_checkpoint(megatron_fixture("gpt_tiny_dist_optim_missing"), false);
  EXPECT_FALSE(weights.optimizer);
  expect_reference_parameters(weights, "gpt_tiny.safetensors", false);
}

TEST(MegatronCheckpoint, MultiTokenPredictionDepths) {
  // --mtp-num-layers: the prediction depths on the last stage (mtp.layers.<k>.enorm, hnorm, eh_proj split by rows as
  // the column-parallel layer it is, final_layernorm, and transformer_layer.<rest> with Transformer Engine's fused
  // norms), and that stage's copy of the word embeddings (the first stage's). 2 tensor- x 2 pipeline-parallel ranks.
  const MegatronSource torch_format =
      open_megatron_checkpoint(megatron_fixture("gpt_tiny_untied_rope_rmsnorm_mtp1_tp2_pp2_te"));
  EXPECT_EQ(torch_format.source.config.mtp_num_layers, 1);
  expect_reference_parameters(torch_format, "gpt_tiny_untied_rope_rmsnorm_mtp1.safetensors", false);
  // torch_dist: each depth's tensors its own (not stacked), its routed experts stacked [E, ...]
  // (mtp.layers.<k>.transformer_layer.mlp.experts.experts.<rest>); 2 tensor- x 2 expert-parallel ranks.
  const MegatronSource dist = open_megatron_checkpoint(megatron_fixture("gpt_tiny_nobias_moe4_mtp1_tp2_ep2_dist"));
  EXPECT_EQ(dist.source.config.mtp_num_layers, 1);
  EXPECT_EQ(dist.source.config.num_experts, 4);
  expect_reference_parameters(dist, "gpt_tiny_nobias_moe4_mtp1.safetensors", false);
}

TEST(MegatronCheckpoint, CorruptedBytesAreAnErrorNeverACrash) {
  // Random bytes of a rank file, a distrib_optim.pt, a .distcp, .metadata or common.pt overwritten, or the file cut
  // short: reading it whole either succeeds (the bytes were values) or is a lattice::Error; no other exception, no
  // crash.
  std::mt19937 rng(2026);
  int errors = 0, runs = 0;
  for (const char* name : {"gpt_tiny_rope_gqa2_qknorm_tp2_te_bf16", "gpt_tiny_rope_gqa2_qknorm_tp2_dist_bf16",
                           "gpt_tiny_swiglu_tp2_pp2", "gpt_tiny_nobias_swiglu_moe4_shared_tp2_ep2_te_distopt",
                           "gpt_tiny_rope_gqa2_qknorm_tp2_pp2_te_dist_distopt_bf16",
                           "gpt_tiny_swiglu_tp2_pp2_te_dist_flat_bf16"}) {
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(megatron_fixture(name)))
      if (e.is_regular_file() && e.path().filename() != "latest_checkpointed_iteration.txt")
        files.push_back(fs::relative(e.path(), megatron_fixture(name)));
    std::sort(files.begin(), files.end());
    for (int k = 0; k < 24; ++k, ++runs) {
      TempDir t("megatron_corrupt");
      const std::string dir = copy_of(name, t);
      const fs::path victim = fs::path(dir) / files[rng() % files.size()];
      const uintmax_t size = fs::file_size(victim);
      if (k % 6 == 5) {
        fs::resize_file(victim, rng() % size);
      } else {
        std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
        for (int b = 0; b < 1 + int(rng() % 8); ++b) {
          f.seekp(std::streamoff(rng() % size));
          f.put(char(rng() & 0xff));
        }
      }
      SCOPED_TRACE(victim.string());
      try {
        convert_all(dir);
      } catch (const Error&) {
        ++errors;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not a lattice::Error: " << e.what();
      }
    }
  }
  EXPECT_GT(errors, runs / 2);  // most damage is found (not a byte of a field no reader looks at)
  // A byte of a tensor's stored values: the record's CRC-32 (the zip's central directory) says so.
  TempDir t("megatron_crc");
  const std::string dir = copy_of("gpt_tiny_swiglu_tp2_pp2", t);
  flip_middle_byte(dir + "/iter_0000100/mp_rank_00_000/model_optim_rng.pt");
  const std::string e = error_of([&] { convert_all(dir); });
  EXPECT_NE(e.find("model_optim_rng.pt: storage model_optim_rng/data/"), std::string::npos) << e;
  EXPECT_NE(e.find("is truncated or corrupt (its CRC-32)"), std::string::npos) << e;
}

TEST(MegatronCheckpoint, BrokenTorchDistCheckpointsAreRefusedByName) {
  // A chunk missing: the tensor's values are not all there.
  auto refused = [](const std::string& dir) { return error_of([&] { open_megatron_checkpoint(dir); }); };
  std::string e = refused(megatron_fixture("gpt_tiny_dist_gap"));
  EXPECT_NE(e.find("decoder.layers.self_attention.linear_proj.weight at layer 1: its chunks hold 2048 of its 4096 "
                   "values"),
            std::string::npos)
      << e;
  TempDir t("megatron_dist_broken");
  const std::string dir = copy_of("gpt_tiny_swiglu_tp2_pp2_te_dist", t);
  const std::string iter = dir + "/iter_0000100";
  fs::remove(iter + "/common.pt");
  e = refused(dir);
  EXPECT_NE(e.find("a torch_dist checkpoint (.metadata) without common.pt"), std::string::npos) << e;
  fs::copy(megatron_fixture("gpt_tiny_swiglu_tp2_pp2_te_dist") + "/iter_0000100/common.pt", iter + "/common.pt");
  std::ofstream(iter + "/metadata.json") << R"({"sharded_backend": "zarr"})";
  e = refused(dir);
  EXPECT_NE(e.find("sharded_backend 'zarr', which lattice does not read"), std::string::npos) << e;
  fs::copy(megatron_fixture("gpt_tiny_swiglu_tp2_pp2_te_dist") + "/iter_0000100/metadata.json", iter + "/metadata.json",
           fs::copy_options::overwrite_existing);
  // A .distcp file cut short: the chunks past its end are not there.
  fs::resize_file(iter + "/__3_0.distcp", 100);
  e = refused(dir);
  EXPECT_NE(e.find("__3_0.distcp: truncated: "), std::string::npos) << e;
  // A chunk's bytes that are not a torch.save (found when read).
  fs::copy(megatron_fixture("gpt_tiny_swiglu_tp2_pp2_te_dist") + "/iter_0000100/__3_0.distcp", iter + "/__3_0.distcp",
           fs::copy_options::overwrite_existing);
  {  // the first chunk's zip end-of-central-directory record broken
    std::fstream f(iter + "/__3_0.distcp", std::ios::in | std::ios::out | std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t eocd = bytes.find(std::string("PK\x05\x06", 4));
    ASSERT_NE(eocd, std::string::npos);
    f.seekp(std::streamoff(eocd));
    f.write("junk", 4);
  }
  const MegatronSource bad = open_megatron_checkpoint(dir);
  e.clear();
  const ParamBuffer bad_reg = GPTModel::parameter_registry(bad.source.config, TensorParallel{}, ModelPlacement{}, 0, 1);
  for (const ParamInfo& p : bad_reg.infos()) {
    std::vector<float> v(size_t(p.numel));
    const std::string got = error_of([&] { bad.source.fill(p, v.data()); });
    if (!got.empty() && e.empty()) e = got;
  }
  EXPECT_NE(e.find("__3_0.distcp: "), std::string::npos) << e;
  EXPECT_NE(e.find("not a torch.save file"), std::string::npos) << e;
  // The metadata cut short.
  fs::resize_file(iter + "/.metadata", 50);
  e = refused(dir);
  EXPECT_NE(e.find(".metadata: not a readable pickle: truncated"), std::string::npos) << e;
}

TEST(MegatronCheckpoint, ConvertedCheckpointLoads) {
  const MegatronSource src = open_megatron_checkpoint(megatron_fixture("gpt_tiny_swiglu_tp2_pp2"));
  TempDir out("megatron_convert");
  save_model_checkpoint(out.str() + "/ckpt", 0, src.source.config, src.source.fill, "{}");
  const LoadedModel lm = load_model_checkpoint(out.str() + "/ckpt");
  const SafetensorsFile ref = SafetensorsFile::read(fixture("gpt_tiny_swiglu.safetensors"));
  const ParamBuffer& params = lm.model->params();
  ASSERT_EQ(params.infos().size(), 28u);
  for (size_t k = 0; k < params.infos().size(); ++k) {
    const ParamInfo& p = params.infos()[k];
    const std::vector<float> want = hf::read_float_tensor(ref, p.name);
    std::vector<float> got(size_t(p.numel));
    params.read_param(int(k), got.data());
    ASSERT_EQ(got, want) << p.name;
  }
}

TEST(MegatronCheckpoint, BrokenCheckpointsAreRefusedByName) {
  auto refused = [](const std::string& dir) { return error_of([&] { open_megatron_checkpoint(dir); }); };
  TempDir t("megatron_broken");
  {  // a rank file missing
    const std::string dir = copy_of("gpt_tiny_swiglu_tp2_pp2", t);
    fs::remove_all(dir + "/iter_0000100/mp_rank_01_001");
    const std::string e = refused(dir);
    EXPECT_NE(e.find("mp_rank_01_001/model_optim_rng.pt is missing (the args say 2 tensor- and 2 pipeline-parallel"),
              std::string::npos)
        << e;
    fs::remove_all(dir);
  }
  {  // a rank file truncated
    const std::string dir = copy_of("gpt_tiny_swiglu_tp2_pp2", t);
    const std::string file = dir + "/iter_0000100/mp_rank_00_001/model_optim_rng.pt";
    fs::resize_file(file, fs::file_size(file) / 2);
    const std::string e = refused(dir);
    EXPECT_NE(e.find(file + ": not a torch.save file"), std::string::npos) << e;
    fs::remove_all(dir);
  }
  {  // the tracker names an iteration that is not there
    const std::string dir = copy_of("gpt_tiny_swiglu_tp2_pp2", t);
    std::ofstream(dir + "/latest_checkpointed_iteration.txt") << "200";
    EXPECT_NE(refused(dir).find("iter_0000200, which is missing"), std::string::npos);
    std::ofstream(dir + "/latest_checkpointed_iteration.txt") << "twelve";
    EXPECT_NE(refused(dir).find("holds 'twelve', not an iteration number"), std::string::npos);
    fs::remove_all(dir);
  }
  {  // torch_dist, and no checkpoint at all
    const fs::path dist = t.path / "dist" / "iter_0000001";
    fs::create_directories(dist);
    std::ofstream(dist / ".metadata") << "x";
    EXPECT_NE(refused(dist.string()).find("a torch_dist checkpoint (.metadata) without common.pt"), std::string::npos);
    EXPECT_NE(refused(t.path.string()).find("not a Megatron checkpoint saved with --ckpt-format torch"),
              std::string::npos);
  }
  {  // a tensor of the wrong shape; a tensor the model has no place for
    std::string e = refused(megatron_fixture("gpt_tiny_transposed"));
    EXPECT_NE(e.find("mp_rank_00/model_optim_rng.pt: tensor decoder.layers.0.mlp.linear_fc1.weight has shape [64, "
                     "256], expected [256, 64]"),
              std::string::npos)
        << e;
    e = refused(megatron_fixture("gpt_tiny_extra"));
    EXPECT_NE(e.find("tensor decoder.layers.0.self_attention.linear_qkv.scale is not a parameter of the model"),
              std::string::npos)
        << e;
  }
}

// Each rank file's model tensors (the state dict's keys and values) as two torch.save files hold them.
void expect_same_rank_files(const std::string& got_path, const std::string& want_path) {
  const TorchArchive got(got_path), want(want_path);
  const PyRef gm = got.root()->get("model"), wm = want.root()->get("model");
  ASSERT_TRUE(gm && wm) << got_path;
  std::vector<std::string> got_keys, want_keys;
  for (const auto& [k, v] : gm->entries) got_keys.push_back(k->text);
  for (const auto& [k, v] : wm->entries) want_keys.push_back(k->text);
  std::sort(got_keys.begin(), got_keys.end());
  std::sort(want_keys.begin(), want_keys.end());
  ASSERT_EQ(got_keys, want_keys) << got_path;
  for (const std::string& key : want_keys) {
    // Transformer Engine's extra state: a pickled None, as a uint8 tensor or a BytesIO.
    if (key.size() > 12 && key.compare(key.size() - 12, 12, "_extra_state") == 0) continue;
    const TorchTensor* g = TorchArchive::tensor(gm->get(key));
    const TorchTensor* w = TorchArchive::tensor(wm->get(key));
    ASSERT_TRUE(g && w) << key;
    ASSERT_EQ(g->shape, w->shape) << key;
    std::vector<float> gv(size_t(g->numel())), wv(size_t(w->numel()));
    got.read_float(*g, key, gv.data());
    want.read_float(*w, key, wv.data());
    ASSERT_EQ(gv, wv) << key;
  }
}

// The arguments convert --from-megatron records that --to-megatron reads: the vocabulary's padding.
std::string divisible_args(const MegatronSource& src) {
  return nlohmann::json{{"make-vocab-size-divisible-by", src.source.config.make_vocab_size_divisible_by}}.dump();
}

TEST(MegatronExport, WritesTheRankFilesMegatronWouldSave) {
  // The Python-made checkpoints, converted in and written out under the same layout and layer spec: every rank
  // file holds the same tensors (and Transformer Engine's _extra_state entries).
  struct Case {
    std::string fixture;
    int tp, pp;
    bool te;
    std::vector<std::string> ranks;
  };
  const Case cases[] = {{"gpt_tiny_swiglu_tp2_pp2",
                         2,
                         2,
                         false,
                         {"mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"}},
                        {"gpt_tiny_rope_gqa2_qknorm_tp2_te_bf16", 2, 1, true, {"mp_rank_00", "mp_rank_01"}}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.fixture);
    const MegatronSource src = open_megatron_checkpoint(megatron_fixture(k.fixture), /*load_optim=*/false);
    TempDir out("megatron_export");
    save_model_checkpoint(out.str() + "/ckpt", 0, src.source.config, src.source.fill, divisible_args(src));
    const LoadedModel lm = open_model_checkpoint(out.str() + "/ckpt");
    const std::string release = save_megatron_checkpoint(out.str() + "/mcore", lm, {k.tp, k.pp, 1, k.te});
    std::ifstream tracker(out.str() + "/mcore/latest_checkpointed_iteration.txt");
    std::string text;
    tracker >> text;
    EXPECT_EQ(text, "release");
    for (const std::string& rank : k.ranks)
      expect_same_rank_files(release + "/" + rank + "/model_optim_rng.pt", rank_file(k.fixture, rank));
    // Read back: the same model, every value.
    const MegatronSource back = open_megatron_checkpoint(out.str() + "/mcore");
    EXPECT_EQ(back.tp, k.tp);
    EXPECT_EQ(back.transformer_engine, k.te);
    const ParamBuffer reg = GPTModel::parameter_registry(src.source.config, TensorParallel{}, ModelPlacement{}, 0, 1);
    for (const ParamInfo& p : reg.infos()) {
      std::vector<float> want(size_t(p.numel)), got(size_t(p.numel));
      src.source.fill(p, want.data());
      back.source.fill(p, got.data());
      ASSERT_EQ(got, want) << p.name;
    }
  }
}

TEST(MegatronExport, ExpertParallelRanksRoundTrip) {
  const MegatronSource src =
      open_megatron_checkpoint(megatron_fixture("gpt_tiny_nobias_swiglu_moe4_shared_tp2_ep2_te_grouped"));
  TempDir out("megatron_export_moe");
  save_model_checkpoint(out.str() + "/ckpt", 0, src.source.config, src.source.fill, "{}");
  const LoadedModel lm = open_model_checkpoint(out.str() + "/ckpt");
  // Another layout: one tensor-parallel rank, 4 expert-parallel ones (mp_rank_00_EEE), the local spec.
  const std::string release = save_megatron_checkpoint(out.str() + "/mcore", lm, {1, 1, 4, false});
  EXPECT_TRUE(fs::exists(release + "/mp_rank_00_003/model_optim_rng.pt"));
  const MegatronSource back = open_megatron_checkpoint(out.str() + "/mcore");
  EXPECT_EQ(back.ep, 4);
  expect_reference_parameters(back, "gpt_tiny_nobias_swiglu_moe4_shared.safetensors", false);
}

TEST(MegatronExport, ModelsAndLayoutsItCannotWriteAreRefusedBeforeWriting) {
  const MegatronSource src = open_megatron_checkpoint(megatron_fixture("gpt_tiny_swiglu_tp2_pp2"));
  TempDir out("megatron_export_bad");
  const std::string ckpt = out.str() + "/ckpt";
  save_model_checkpoint(ckpt, 0, src.source.config, src.source.fill, "{}");
  const LoadedModel lm = open_model_checkpoint(ckpt);
  auto refused = [&](const MegatronExportOptions& o, const std::string& dir) {
    return error_of([&] { save_megatron_checkpoint(out.str() + "/" + dir, lm, o); });
  };
  std::string e = refused({3, 1, 1, true}, "tp3");  // 4 heads over 3 ranks
  EXPECT_NE(e.find("cannot be written as Megatron-LM's"), std::string::npos) << e;
  EXPECT_NE(e.find("--tensor-model-parallel-size"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(out.str() + "/tp3"));
  e = refused({1, 1, 2, true}, "ep2");  // no experts
  EXPECT_NE(e.find("--target-expert-parallel-size 2 must divide the model's 0 experts"), std::string::npos) << e;
  // An earlier run cut short left its staging directory: written anew, then published.
  fs::create_directories(out.str() + "/once/release.tmp/mp_rank_07");
  save_megatron_checkpoint(out.str() + "/once", lm, {});
  EXPECT_FALSE(fs::exists(out.str() + "/once/release.tmp"));
  EXPECT_FALSE(fs::exists(out.str() + "/once/release/mp_rank_07"));
  EXPECT_TRUE(fs::exists(out.str() + "/once/release/mp_rank_00/model_optim_rng.pt"));
  e = refused({}, "once");
  EXPECT_NE(e.find("already holds a checkpoint"), std::string::npos) << e;
  // A model the args cannot describe: LongRoPE.
  LoadedModel longrope = open_model_checkpoint(ckpt);
  longrope.config.position_embedding_type = "rope";
  longrope.config.longrope_short_factor.assign(size_t(longrope.config.kv_channels / 2), 1.5f);
  longrope.config.longrope_long_factor.assign(size_t(longrope.config.kv_channels / 2), 2.0f);
  e = error_of([&] { save_megatron_checkpoint(out.str() + "/longrope", longrope, {}); });
  EXPECT_NE(e.find("longrope"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(out.str() + "/longrope"));
}

}  // namespace
}  // namespace lattice
