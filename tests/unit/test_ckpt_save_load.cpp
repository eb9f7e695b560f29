// Checkpoint directories: round trip of tensors and state, loading a different slicing
// than the one saved (the basis of resharding), atomic publication, pruning, and
// corrupted checkpoints (flipped byte, truncated file, missing file, bad index).
#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <iterator>
#include <numeric>
#include <vector>

#include "ckpt_test_util.h"

namespace lattice {
namespace {

using ckpt_test::error_of;
using ckpt_test::read_bytes;
using ckpt_test::write_bytes;
using json = nlohmann::json;
namespace fs = std::filesystem;

std::vector<float> iota_f(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

CheckpointState sample_state(int64_t iteration) {
  CheckpointState s;
  s.iteration = iteration;
  s.consumed_train_samples = iteration * 8;
  s.num_floating_point_operations_so_far = 1.25e15 * double(iteration);
  s.model_config = {{"num_layers", 2}};
  s.args = {{"lr", 0.001}, {"seed", 1234}, {"save", "somewhere"}};
  s.optimizer = OptimizerState{"adam", iteration};
  s.opt_param_scheduler = json{{"num_steps", iteration * 8}, {"max_lr", 0.001}};
  s.rng = RngState{1234};
  return s;
}

// Saves a checkpoint with a [3, 4] tensor w and a [5] tensor b in model.safetensors and
// one optimizer tensor in optimizer.safetensors.
std::string save_sample(const std::string& dir, int64_t iteration, int64_t keep_last_n = 0, float base = 0) {
  CheckpointWriter w;
  std::vector<float> wv = iota_f(12, base), bv = iota_f(5, base + 100), ov = iota_f(12, base + 200);
  w.add_tensor("model.safetensors", "w", "F32", {3, 4}, wv.data());
  w.add_tensor("model.safetensors", "b", "F32", {5}, bv.data());
  w.add_tensor("optimizer.safetensors", "optimizer.exp_avg.w", "F32", {3, 4}, ov.data());
  w.set_state(sample_state(iteration));
  return w.save(dir, keep_last_n);
}

class CkptSaveLoad : public ckpt_test::TempDirTest {};

TEST_F(CkptSaveLoad, RoundTripOfTensorsAndState) {
  const std::string iter_dir = save_sample(path("ckpt"), 7);
  EXPECT_EQ(iter_dir, path("ckpt/iter_0000007"));
  EXPECT_EQ(read_bytes(path("ckpt/latest_checkpointed_iteration.txt")), "7\n");
  for (const char* f : {"checkpoint.json", "model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(fs::exists(path("ckpt/iter_0000007/") + f)) << f;
  // Nothing but the checkpoint is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(path("ckpt")), fs::directory_iterator()), 2);

  for (const std::string& where : {path("ckpt"), iter_dir}) {
    CheckpointReader r = CheckpointReader::open(where);
    EXPECT_EQ(r.iter_dir(), iter_dir);
    const CheckpointState& s = r.state();
    EXPECT_EQ(s.iteration, 7);
    EXPECT_EQ(s.consumed_train_samples, 56);
    EXPECT_EQ(s.num_floating_point_operations_so_far, 8.75e15);
    EXPECT_EQ(s.args, sample_state(7).args);
    EXPECT_EQ(s.model_config, sample_state(7).model_config);
    ASSERT_TRUE(s.optimizer && s.rng && s.opt_param_scheduler);
    EXPECT_EQ(s.optimizer->name, "adam");
    EXPECT_EQ(s.optimizer->step, 7);
    EXPECT_EQ(s.rng->seed, 1234u);
    EXPECT_EQ(*s.opt_param_scheduler, *sample_state(7).opt_param_scheduler);
    std::vector<float> w(12), b(5), o(12);
    r.read_tensor("w", "F32", {3, 4}, w.data());
    r.read_tensor("b", "F32", {5}, b.data());
    r.read_tensor("optimizer.exp_avg.w", "F32", {3, 4}, o.data());
    EXPECT_EQ(w, iota_f(12, 0));
    EXPECT_EQ(b, iota_f(5, 100));
    EXPECT_EQ(o, iota_f(12, 200));
    EXPECT_NE(error_of([&] { r.read_tensor("w", "F32", {4, 3}, w.data()); }).find("has shape [3, 4], the model expects [4, 3]"),
              std::string::npos);
    EXPECT_NE(error_of([&] { r.read_tensor("w", "BF16", {3, 4}, w.data()); }).find("dtype F32"), std::string::npos);
    EXPECT_NE(error_of([&] { r.read_tensor("nope", "F32", {1}, w.data()); }).find("no tensor 'nope'"),
              std::string::npos);
  }
}

// A borrowed piece is written from the caller's buffer as it is at save() (no copy: what a model's
// parameters cost a checkpoint), a copied one as it was when added; both read back, checksummed alike.
TEST_F(CkptSaveLoad, BorrowedPiecesAreWrittenFromTheCallersBuffer) {
  std::vector<float> live(12, 0.0f), copied = iota_f(12, 50);
  CheckpointWriter w;
  w.add_piece("model.safetensors", "w", "F32", {3, 4}, {0, 0}, {3, 4}, live.data(), /*borrow=*/true);
  w.add_piece("model.safetensors", "c", "F32", {3, 4}, {0, 0}, {3, 4}, copied.data());
  std::iota(live.begin(), live.end(), 1.0f);  // in place: the borrowed buffer itself
  std::fill(copied.begin(), copied.end(), -1.0f);
  w.set_state(sample_state(3));
  w.save(path("ckpt"));
  CheckpointReader r = CheckpointReader::open(path("ckpt"));
  std::vector<float> got(12);
  r.read_tensor("w", "F32", {3, 4}, got.data());
  EXPECT_EQ(got, iota_f(12, 1));
  r.read_tensor("c", "F32", {3, 4}, got.data());
  EXPECT_EQ(got, iota_f(12, 50));
}

TEST_F(CkptSaveLoad, OptionalStateStaysAbsent) {
  CheckpointWriter w;
  float x = 1;
  w.add_tensor("model.safetensors", "x", "F32", {}, &x);
  CheckpointState s;
  s.iteration = 3;
  w.set_state(s);
  w.save(path("ckpt"));
  CheckpointReader r = CheckpointReader::open(path("ckpt"));
  EXPECT_FALSE(r.state().optimizer);
  EXPECT_FALSE(r.state().rng);
  EXPECT_FALSE(r.state().opt_param_scheduler);
  float y = 0;
  r.read_tensor("x", "F32", {}, &y);
  EXPECT_EQ(y, 1.0f);
}

// Saves a [6, 10] tensor as three row blocks (three "ranks", three files) and a
// [4, 6, 5] tensor as a 2 x 2 grid of blocks, then reads other slicings back: whole
// tensors, column halves (another tensor-parallel split), and arbitrary boxes.
TEST_F(CkptSaveLoad, PiecesSavedSeparatelyLoadUnderAnotherSlicing) {
  const std::vector<float> a = iota_f(60, 0);   // [6, 10], a[r][c] = 10 r + c
  const std::vector<float> t = iota_f(120, 0);  // [4, 6, 5]
  CheckpointWriter w;
  for (int rank = 0; rank < 3; ++rank)
    w.add_piece("model_rank" + std::to_string(rank) + ".safetensors", "a", "F32", {6, 10}, {2 * rank, 0}, {2, 10},
                a.data() + 20 * rank);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      std::vector<float> block;  // t[2i:2i+2, 3j:3j+3, :]
      for (int x = 2 * i; x < 2 * i + 2; ++x)
        for (int y = 3 * j; y < 3 * j + 3; ++y)
          for (int z = 0; z < 5; ++z) block.push_back(t[size_t(x * 30 + y * 5 + z)]);
      w.add_piece("model_rank" + std::to_string(2 * i + j) + ".safetensors", "t", "F32", {4, 6, 5}, {2 * i, 3 * j, 0},
                  {2, 3, 5}, block.data());
    }
  EXPECT_NE(error_of([&] { w.add_piece("x.safetensors", "a", "F32", {6, 11}, {0, 0}, {1, 1}, a.data()); })
                .find("after F32 [6, 10]"),
            std::string::npos);
  CheckpointState s;
  s.iteration = 1;
  w.set_state(s);
  w.save(path("ckpt"));

  CheckpointReader r = CheckpointReader::open(path("ckpt"));
  ASSERT_EQ(r.tensor("a").pieces.size(), 3u);
  std::vector<float> whole(60);
  r.read_tensor("a", "F32", {6, 10}, whole.data());
  EXPECT_EQ(whole, a);
  for (int half = 0; half < 2; ++half) {  // column halves: [6, 5] at column 5 half
    std::vector<float> got(30), want;
    r.read_slice("a", "F32", {0, 5 * half}, {6, 5}, got.data());
    for (int row = 0; row < 6; ++row)
      for (int c = 5 * half; c < 5 * half + 5; ++c) want.push_back(a[size_t(row * 10 + c)]);
    EXPECT_EQ(got, want) << "half " << half;
  }
  std::vector<float> box(3 * 4), want_box;  // rows 1..3 (across two pieces), columns 2..5
  r.read_slice("a", "F32", {1, 2}, {3, 4}, box.data());
  for (int row = 1; row < 4; ++row)
    for (int c = 2; c < 6; ++c) want_box.push_back(a[size_t(row * 10 + c)]);
  EXPECT_EQ(box, want_box);

  std::vector<float> t_whole(120);
  r.read_tensor("t", "F32", {4, 6, 5}, t_whole.data());
  EXPECT_EQ(t_whole, t);
  std::vector<float> t_box(3 * 2 * 2), want_t;  // [1:4, 2:4, 3:5] crosses all four blocks
  r.read_slice("t", "F32", {1, 2, 3}, {3, 2, 2}, t_box.data());
  for (int x = 1; x < 4; ++x)
    for (int y = 2; y < 4; ++y)
      for (int z = 3; z < 5; ++z) want_t.push_back(t[size_t(x * 30 + y * 5 + z)]);
  EXPECT_EQ(t_box, want_t);
  EXPECT_NE(error_of([&] { r.read_slice("a", "F32", {5, 0}, {2, 10}, box.data()); }).find("outside its shape"),
            std::string::npos);
}

// Data-parallel shards of a flat buffer cut tensors at arbitrary elements: ranges saved
// by four "ranks" (two sharing a file) come back as any box.
TEST_F(CkptSaveLoad, FlatRangeShardsLoadAsBoxes) {
  const std::vector<float> t = iota_f(3 * 4 * 5, 0);  // [3, 4, 5]
  const int64_t cuts[] = {0, 7, 8, 33, 60};
  CheckpointWriter w;
  for (int k = 0; k < 4; ++k)
    w.add_flat_range("optimizer_dp" + std::to_string(k / 2) + ".safetensors", "t", "F32", {3, 4, 5}, cuts[k],
                     cuts[k + 1], t.data() + cuts[k]);
  CheckpointState s;
  s.iteration = 1;
  w.set_state(s);
  w.save(path("ckpt"));
  CheckpointReader r = CheckpointReader::open(path("ckpt"));
  EXPECT_GT(r.tensor("t").pieces.size(), 4u);
  std::vector<float> whole(60);
  r.read_tensor("t", "F32", {3, 4, 5}, whole.data());
  EXPECT_EQ(whole, t);
  std::vector<float> box(2 * 3 * 2), want;
  r.read_slice("t", "F32", {1, 1, 2}, {2, 3, 2}, box.data());
  for (int x = 1; x < 3; ++x)
    for (int y = 1; y < 4; ++y)
      for (int z = 2; z < 4; ++z) want.push_back(t[size_t(x * 20 + y * 5 + z)]);
  EXPECT_EQ(box, want);
}

TEST_F(CkptSaveLoad, ResavingAnIterationReplacesItWhole) {
  save_sample(path("ckpt"), 4, 0, 0);
  save_sample(path("ckpt"), 4, 0, 1000);
  CheckpointReader r = CheckpointReader::open(path("ckpt"));
  std::vector<float> w(12);
  r.read_tensor("w", "F32", {3, 4}, w.data());
  EXPECT_EQ(w, iota_f(12, 1000));
  for (const auto& e : fs::directory_iterator(path("ckpt")))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST_F(CkptSaveLoad, KeepLastNPrunesTheOldest) {
  for (int it : {1, 2, 3, 4, 5}) save_sample(path("ckpt"), it, 2);
  EXPECT_FALSE(fs::exists(path("ckpt/iter_0000003")));
  EXPECT_TRUE(fs::exists(path("ckpt/iter_0000004")));
  EXPECT_TRUE(fs::exists(path("ckpt/iter_0000005")));
  EXPECT_EQ(CheckpointReader::open(path("ckpt")).state().iteration, 5);
  save_sample(path("ckpt"), 6, 1);
  EXPECT_FALSE(fs::exists(path("ckpt/iter_0000005")));
  EXPECT_TRUE(fs::exists(path("ckpt/iter_0000006")));
}

// A save that died before publishing leaves a staging directory: it never hides the
// previous checkpoint and the next save clears it.
TEST_F(CkptSaveLoad, LeftoversOfACrashedSaveAreIgnoredThenCleared) {
  save_sample(path("ckpt"), 2);
  fs::create_directories(path("ckpt/.tmp.iter_0000003"));
  write_bytes(path("ckpt/.tmp.iter_0000003/model.safetensors"), "partial");
  EXPECT_EQ(CheckpointReader::open(path("ckpt")).state().iteration, 2);
  save_sample(path("ckpt"), 3);
  EXPECT_FALSE(fs::exists(path("ckpt/.tmp.iter_0000003/model.safetensors")));
  EXPECT_EQ(CheckpointReader::open(path("ckpt")).state().iteration, 3);
}

// A save that fails part way (here the file-size limit, RLIMIT_FSIZE, stops its second
// file as a full disk would) names the file, removes everything it staged, and leaves the
// published checkpoints and the tracker as they were.
TEST_F(CkptSaveLoad, AFailedSaveRemovesWhatItStaged) {
  save_sample(path("ckpt"), 2);
  CheckpointWriter w;
  std::vector<float> small = iota_f(12, 0), big = iota_f(size_t(1) << 16, 0);  // 256 KB
  w.add_tensor("model.safetensors", "w", "F32", {3, 4}, small.data());
  w.add_tensor("optimizer.safetensors", "optimizer.exp_avg.w", "F32", {int64_t(big.size())}, big.data());
  w.set_state(sample_state(3));
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit limited = saved;
  limited.rlim_cur = 64 << 10;
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string err = error_of([&] { w.save(path("ckpt")); });
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(err.find("optimizer.safetensors"), std::string::npos) << err;
  for (const auto& e : fs::directory_iterator(path("ckpt")))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << e.path() << " left behind";
  EXPECT_FALSE(fs::exists(path("ckpt/iter_0000003")));
  EXPECT_EQ(CheckpointReader::open(path("ckpt")).state().iteration, 2);
}

// Each corruption gives one line naming the damaged file, and reading never writes.
TEST_F(CkptSaveLoad, CorruptionIsDetectedAndNamesTheFile) {
  save_sample(path("ckpt"), 5);
  const std::string it = path("ckpt/iter_0000005/");
  const std::string model = it + "model.safetensors", index = it + "checkpoint.json";
  const std::string good_model = read_bytes(model), good_index = read_bytes(index);
  auto load_all = [&] {
    CheckpointReader r = CheckpointReader::open(path("ckpt"));
    std::vector<float> w(12), o(12);
    r.read_tensor("w", "F32", {3, 4}, w.data());
    r.read_tensor("optimizer.exp_avg.w", "F32", {3, 4}, o.data());
  };
  auto expect_error = [&](const std::string& file, const std::string& needle) {
    std::string msg = error_of(load_all);
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << needle << " not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  ASSERT_EQ(error_of(load_all), "");

  // Every single flipped byte of the model file (its header, its data) is caught.
  for (size_t pos = 0; pos < good_model.size(); pos += 7) {
    std::string bad = good_model;
    bad[pos] ^= 0x01;
    write_bytes(model, bad);
    std::string msg = error_of(load_all);
    ASSERT_NE(msg.find(model), std::string::npos) << "byte " << pos << ": " << msg;
    ASSERT_NE(msg.find("CRC-32 mismatch"), std::string::npos) << "byte " << pos << ": " << msg;
    ASSERT_EQ(read_bytes(model), bad);  // loading wrote nothing
  }
  write_bytes(model, good_model.substr(0, good_model.size() - 3));
  expect_error(model, "truncated");
  fs::remove(model);
  expect_error(model, "missing");
  write_bytes(model, good_model);
  fs::remove(it + "optimizer.safetensors");
  expect_error(it + "optimizer.safetensors", "missing");
  save_sample(path("ckpt"), 5);

  // checkpoint.json: a changed value, broken JSON, a missing file.
  std::string bad_index = good_index;
  const size_t p = bad_index.find("\"consumed_train_samples\": 40");
  ASSERT_NE(p, std::string::npos) << good_index.substr(0, 300);
  bad_index[p + 26] = '5';  // 40 -> 50
  write_bytes(index, bad_index);
  expect_error(index, "CRC-32 mismatch");
  write_bytes(index, good_index.substr(0, good_index.size() / 2));
  expect_error(index, "not valid JSON");
  fs::remove(index);
  expect_error(index, "missing");
  write_bytes(index, good_index);
  ASSERT_EQ(error_of(load_all), "");

  // The tracker file.
  write_bytes(path("ckpt/latest_checkpointed_iteration.txt"), "5x\n");
  expect_error(path("ckpt/latest_checkpointed_iteration.txt"), "not an iteration number");
  write_bytes(path("ckpt/latest_checkpointed_iteration.txt"), "9\n");
  expect_error(path("ckpt/iter_0000009/checkpoint.json"), "missing");
  EXPECT_NE(error_of([&] { CheckpointReader::open(path("nothing")); }).find("no such checkpoint directory"),
            std::string::npos);
}

TEST_F(CkptSaveLoad, TrackerAbsentMeansNoCheckpoint) {
  EXPECT_FALSE(read_latest_iteration(path("ckpt")));
  fs::create_directories(path("ckpt"));
  EXPECT_FALSE(read_latest_iteration(path("ckpt")));
  std::string msg = error_of([&] { CheckpointReader::open(path("ckpt")); });
  EXPECT_NE(msg.find("not a checkpoint"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lattice
