// Tensor-parallel parts in checkpoints (checkpoint/tensor_parts.h): the parts of every rank
// of one layout, saved as pieces, load as the boxes of any other layout; a duplicated tensor
// is stored once; the vocabulary rows reslice across paddings (rows both have read, the rest
// zero); any other shape mismatch is refused naming the tensor.
#include "checkpoint/tensor_parts.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ckpt_test_util.h"

namespace lattice {
namespace {

using ckpt_test::error_of;

constexpr const char* kFile = "model.safetensors";

// A model-like registry on rank r of P: a column-parallel [8, 4] vocabulary tensor (Vp rows),
// a row-parallel [4, 8] weight, a column-parallel bias [8] and a duplicated norm [4].
std::unique_ptr<ParamBuffer> make_buffer(int r, int P, int64_t Vp = 8) {
  auto b = std::make_unique<ParamBuffer>();
  b->add_tp("embedding.word_embeddings.weight", {Vp, 4}, ParamInit::normal, 1.0f, 0, r, P);
  b->add_tp("decoder.layers.0.mlp.linear_fc2.weight", {4, 8}, ParamInit::normal, 1.0f, 1, r, P);
  b->add_tp("decoder.layers.0.mlp.linear_fc1.bias", {8}, ParamInit::normal, 1.0f, 0, r, P);
  b->add_tp("decoder.final_layernorm.weight", {4}, ParamInit::normal, 1.0f, -1, r, P);
  b->allocate();
  b->initialize(5);  // element values depend on (name, global index) only
  return b;
}

// Saves every rank's parts of a P-way layout (each rank's buffer given with its rank).
void save_layout(const std::string& dir, int P, int64_t Vp = 8) {
  CheckpointWriter w;
  for (int r = 0; r < P; ++r) {
    auto b = make_buffer(r, P, Vp);
    add_parts(w, kFile, param_parts(b->infos(), b->params(), r));
    add_parts(w, "optimizer.safetensors", param_parts(b->infos(), b->params(), r, "optimizer.exp_avg."));
  }
  w.set_state(CheckpointState{});
  w.save(dir);
}

class CkptTensorParts : public ckpt_test::TempDirTest {};

TEST_F(CkptTensorParts, PartsAreBoxesAtTheRanksOffsetsAndDuplicatesComeOnce) {
  auto b = make_buffer(1, 2);
  const std::vector<TensorPart> parts = param_parts(b->infos(), b->params(), 1, "optimizer.exp_avg.");
  ASSERT_EQ(parts.size(), 3u);  // the duplicated norm is rank 0's to contribute
  EXPECT_EQ(parts[0].name, "optimizer.exp_avg.embedding.word_embeddings.weight");
  EXPECT_EQ(parts[0].global_shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(parts[0].offsets, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(parts[0].lengths, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(parts[1].offsets, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(parts[1].lengths, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(parts[2].offsets, (std::vector<int64_t>{4}));
  EXPECT_EQ(parts[1].data, b->params() + b->infos()[1].offset);
  EXPECT_EQ(param_parts(b->infos(), b->params(), 0).size(), 4u);
  // Rank r's boxes follow from any rank's infos.
  auto b0 = make_buffer(0, 2);
  const std::vector<TensorPart> from0 = param_parts(b0->infos(), b->params(), 1);
  ASSERT_EQ(from0.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(from0[k].offsets, parts[k].offsets);

  save_layout(path("ckpt"), 2);
  CheckpointReader r = CheckpointReader::open(path("ckpt"));
  EXPECT_EQ(r.tensor("decoder.final_layernorm.weight").pieces.size(), 1u);
  EXPECT_EQ(r.tensor("decoder.layers.0.mlp.linear_fc2.weight").pieces.size(), 2u);
  EXPECT_EQ(r.tensor("optimizer.exp_avg.embedding.word_embeddings.weight").shape, (std::vector<int64_t>{8, 4}));
}

TEST_F(CkptTensorParts, SavedAtOneLayoutLoadsAtAnother) {
  for (int saved : {1, 2, 4}) {
    const std::string dir = path("ckpt" + std::to_string(saved));
    save_layout(dir, saved);
    CheckpointReader r = CheckpointReader::open(dir);
    for (int P : {1, 2, 4}) {
      for (int rank = 0; rank < P; ++rank) {
        auto want = make_buffer(rank, P);
        auto got = make_buffer(rank, P);
        for (const ParamInfo& p : got->infos()) {
          std::vector<float> v(static_cast<size_t>(p.numel), -1.0f);
          read_param_part(r, p.name, p, v.data());
          EXPECT_EQ(v, std::vector<float>(want->params() + p.offset, want->params() + p.offset + p.numel))
              << p.name << " saved at " << saved << ", read by rank " << rank << " of " << P;
          read_param_part(r, "optimizer.exp_avg." + p.name, p, v.data());
          EXPECT_EQ(v, std::vector<float>(want->params() + p.offset, want->params() + p.offset + p.numel));
        }
      }
    }
  }
}

// SwiGLU's fc1 (ParamInfo::tp_blocks = 2): weight [8, 3] and bias [8], the gate's 4 rows
// then the up projection's 4, each block split over the P ranks.
std::unique_ptr<ParamBuffer> make_blocked(int r, int P) {
  auto b = std::make_unique<ParamBuffer>();
  b->add_tp("decoder.layers.0.mlp.linear_fc1.weight", {8, 3}, ParamInit::normal, 1.0f, 0, r, P, 2);
  b->add_tp("decoder.layers.0.mlp.linear_fc1.bias", {8}, ParamInit::normal, 1.0f, 0, r, P, 2);
  b->allocate();
  b->initialize(5);
  return b;
}

TEST_F(CkptTensorParts, BlockedTensorsHoldTheRanksShareOfEachBlockAndLoadAtAnyLayout) {
  auto whole = make_blocked(0, 1);
  const float* w1 = whole->params() + whole->infos()[0].offset;  // [8, 3]
  const float* b1 = whole->params() + whole->infos()[1].offset;  // [8]
  EXPECT_EQ(param_parts(whole->infos(), whole->params(), 0).size(), 2u);  // one box each on one rank
  // Rank 1 of 2 holds rows [2, 4) of the gate and [6, 8) of the up projection, in that order,
  // with the values the whole tensor has there (initialisation is layout-invariant).
  auto b = make_blocked(1, 2);
  const ParamInfo& wi = b->infos()[0];
  EXPECT_EQ(wi.shape, (Shape{4, 3}));
  EXPECT_EQ(param_tp_rank(wi), 1);
  const float* w = b->params() + wi.offset;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t c = 0; c < 3; ++c) {
      const int64_t g = i < 2 ? 2 + i : 6 + (i - 2);
      EXPECT_EQ(w[i * 3 + c], w1[g * 3 + c]) << "local row " << i;
    }
  const float* bias = b->params() + b->infos()[1].offset;
  EXPECT_EQ(std::vector<float>(bias, bias + 4), (std::vector<float>{b1[2], b1[3], b1[6], b1[7]}));
  const std::vector<TensorPart> parts = param_parts(b->infos(), b->params(), 1);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(parts[0].lengths, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(parts[1].offsets, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(parts[1].data, w + 6);
  EXPECT_EQ(parts[3].offsets, (std::vector<int64_t>{6}));
  EXPECT_EQ(parts[3].data, bias + 2);
  // Rank 1's boxes from rank 0's infos.
  auto b0 = make_blocked(0, 2);
  const std::vector<TensorPart> from0 = param_parts(b0->infos(), b->params(), 1);
  ASSERT_EQ(from0.size(), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(from0[k].offsets, parts[k].offsets);

  for (int saved : {1, 2, 4}) {
    const std::string dir = path("blocked" + std::to_string(saved));
    CheckpointWriter wr;
    for (int r = 0; r < saved; ++r) {
      auto s = make_blocked(r, saved);
      add_parts(wr, kFile, param_parts(s->infos(), s->params(), r));
    }
    wr.set_state(CheckpointState{});
    wr.save(dir);
    CheckpointReader rd = CheckpointReader::open(dir);
    EXPECT_EQ(rd.tensor("decoder.layers.0.mlp.linear_fc1.weight").pieces.size(), size_t(saved == 1 ? 1 : 2 * saved));
    for (int P : {1, 2, 4})
      for (int rank = 0; rank < P; ++rank) {
        auto want = make_blocked(rank, P);
        for (const ParamInfo& p : want->infos()) {
          std::vector<float> v(static_cast<size_t>(p.numel), -1.0f);
          read_param_part(rd, p.name, p, v.data());
          EXPECT_EQ(v, std::vector<float>(want->params() + p.offset, want->params() + p.offset + p.numel))
              << p.name << " saved at " << saved << ", read by rank " << rank << " of " << P;
        }
      }
  }
}

TEST_F(CkptTensorParts, VocabularyRowsResliceAcrossPaddings) {
  save_layout(path("ckpt"), 2, 8);  // 8 padded rows
  CheckpointReader r = CheckpointReader::open(path("ckpt"));
  auto saved = make_buffer(0, 1, 8);
  const float* rows8 = saved->params() + saved->infos()[0].offset;  // [8, 4]
  // 16 padded rows on 4 ranks: ranks 0 and 1 read rows 0..7, ranks 2 and 3 hold zeros.
  for (int rank = 0; rank < 4; ++rank) {
    auto b = make_buffer(rank, 4, 16);
    const ParamInfo& p = b->infos()[0];
    std::vector<float> v(static_cast<size_t>(p.numel), -1.0f);
    read_param_part(r, p.name, p, v.data());
    for (int64_t i = 0; i < p.numel; ++i) {
      const int64_t g = rank * p.numel + i;
      EXPECT_EQ(v[size_t(i)], g < 32 ? rows8[g] : 0.0f) << "rank " << rank << " element " << i;
    }
  }
  // 4 rows on one rank: the first 4 rows.
  auto small = make_buffer(0, 1, 4);
  const ParamInfo& p = small->infos()[0];
  std::vector<float> v(static_cast<size_t>(p.numel));
  read_param_part(r, "optimizer.exp_avg." + p.name, p, v.data());
  EXPECT_EQ(v, std::vector<float>(rows8, rows8 + 16));
}

TEST_F(CkptTensorParts, OtherShapeMismatchIsRefusedNamingTheTensor) {
  save_layout(path("ckpt"), 1);
  CheckpointReader r = CheckpointReader::open(path("ckpt"));
  ParamBuffer b;
  b.add("decoder.layers.0.mlp.linear_fc2.weight", {4, 16}, ParamInit::zeros, 0.0f, 1);
  b.add("embedding.word_embeddings.weight", {8, 5}, ParamInit::zeros, 0.0f, 0);
  b.allocate();
  for (const ParamInfo& p : b.infos()) {
    const std::string msg = error_of([&] { read_param_part(r, p.name, p, b.params() + p.offset); });
    EXPECT_NE(msg.find("tensor '" + p.name + "' has shape"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the model expects"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace lattice
