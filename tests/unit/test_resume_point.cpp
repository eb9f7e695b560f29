// Which checkpoint training starts from (train/resume_point.h): --load's latest, --pretrained-checkpoint's
// when --load holds none (weights only), the newer non-persistent checkpoint, --ckpt-step's iteration; and
// the one-line errors of a --pretrained-checkpoint or --ckpt-step with nothing to load.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "train/resume_point.h"

namespace lattice {
namespace {

namespace fs = std::filesystem;

class ResumePoint : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lattice_resume_point_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string path(const std::string& name) const { return (root_ / name).string(); }
  // A directory holding checkpoints of these iterations (their index files), the tracker naming the last.
  std::string checkpoints(const std::string& name, std::initializer_list<int64_t> iterations) const {
    const fs::path d = root_ / name;
    int64_t last = -1;
    for (int64_t it : iterations) {
      fs::create_directories(d / iter_dir_name(it));
      std::ofstream(d / iter_dir_name(it) / kCheckpointIndexFile) << "{}";
      last = it;
    }
    std::ofstream(d / kTrackerFile) << last << "\n";
    return d.string();
  }
  static std::string error_of(const TrainArgs& a) {
    try {
      choose_checkpoint(a);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path root_;
};

TEST_F(ResumePoint, NothingToLoadStartsFresh) {
  TrainArgs a;
  EXPECT_TRUE(choose_checkpoint(a).dir.empty());
  a.load = path("empty");  // a --load without a checkpoint: the load reports it (or starts fresh)
  const CheckpointChoice c = choose_checkpoint(a);
  EXPECT_EQ(c.dir, a.load);
  EXPECT_FALSE(c.finetune);
}

TEST_F(ResumePoint, LoadsTheLoadDirectoryAsGiven) {
  TrainArgs a;
  a.load = checkpoints("run", {10, 20});
  a.finetune = true;
  const CheckpointChoice c = choose_checkpoint(a);
  EXPECT_EQ(c.dir, a.load);
  EXPECT_TRUE(c.finetune);  // --finetune kept
  EXPECT_TRUE(c.note.empty());
}

TEST_F(ResumePoint, PretrainedCheckpointOnlyWhenLoadHoldsNone) {
  TrainArgs a;
  a.pretrained_checkpoint = checkpoints("base", {100});
  a.load = path("run");  // nothing yet: the pretrained weights, as --finetune
  CheckpointChoice c = choose_checkpoint(a);
  EXPECT_EQ(c.dir, a.pretrained_checkpoint);
  EXPECT_TRUE(c.finetune);
  EXPECT_NE(c.note.find("fine-tuning from --pretrained-checkpoint"), std::string::npos) << c.note;
  checkpoints("run", {5});  // the run saved once: it resumes from its own checkpoint, all of it
  c = choose_checkpoint(a);
  EXPECT_EQ(c.dir, a.load);
  EXPECT_FALSE(c.finetune);
  a.load.clear();  // no --load at all: the pretrained weights
  EXPECT_EQ(choose_checkpoint(a).dir, a.pretrained_checkpoint);
}

TEST_F(ResumePoint, PretrainedCheckpointWithoutCheckpointIsAnError) {
  TrainArgs a;
  a.pretrained_checkpoint = path("missing");
  a.load = path("run");
  const std::string e = error_of(a);
  EXPECT_NE(e.find("--pretrained-checkpoint " + a.pretrained_checkpoint + ": no checkpoint"), std::string::npos) << e;
  EXPECT_NE(e.find("and none in --load"), std::string::npos) << e;
}

TEST_F(ResumePoint, NewerNonPersistentCheckpointWins) {
  TrainArgs a;
  a.load = checkpoints("run", {10});
  a.non_persistent_save_interval = 2;
  a.non_persistent_ckpt_type = "global";
  ASSERT_TRUE(a.non_persistent());
  EXPECT_EQ(choose_checkpoint(a).dir, a.load);  // none yet
  const std::string np = checkpoints("run/non_persistent", {12});
  CheckpointChoice c = choose_checkpoint(a);
  EXPECT_EQ(c.dir, np);
  EXPECT_NE(c.note.find("(iteration 12) is newer than --load's (iteration 10)"), std::string::npos) << c.note;
  checkpoints("run", {10, 14});  // the persistent one is newer again
  EXPECT_EQ(choose_checkpoint(a).dir, a.load);
  a.non_persistent_global_ckpt_dir = checkpoints("elsewhere", {16});  // read from where they are written
  EXPECT_EQ(choose_checkpoint(a).dir, a.non_persistent_global_ckpt_dir);
  a.ckpt_step = 10;  // an explicit iteration: --load's
  EXPECT_EQ(choose_checkpoint(a).dir, (fs::path(a.load) / iter_dir_name(10)).string());
}

TEST_F(ResumePoint, CkptStepPicksTheIterationOrNamesThoseHeld) {
  TrainArgs a;
  a.load = checkpoints("run", {10, 20, 30});
  a.ckpt_step = 20;
  EXPECT_EQ(choose_checkpoint(a).dir, (fs::path(a.load) / iter_dir_name(20)).string());
  a.ckpt_step = 25;
  const std::string e = error_of(a);
  EXPECT_NE(e.find("--ckpt-step 25"), std::string::npos) << e;
  EXPECT_NE(e.find("10, 20, 30"), std::string::npos) << e;
  a.load = path("empty");
  a.ckpt_step = 10;
  EXPECT_NE(error_of(a).find("holds no checkpoint"), std::string::npos) << error_of(a);
  // With --pretrained-checkpoint taken, the step is the pretrained directory's.
  a.pretrained_checkpoint = checkpoints("base", {10, 40});
  const CheckpointChoice c = choose_checkpoint(a);
  EXPECT_EQ(c.dir, (fs::path(a.pretrained_checkpoint) / iter_dir_name(10)).string());
  EXPECT_TRUE(c.finetune);
}

}  // namespace
}  // namespace lattice
