// A GoogleTest binary whose tests pass, fail, skip, crash, hang and break the process's
// state, for tests/e2e/test_gtest_resilient.sh, which runs scripts/gtest_resilient.py on
// it. Not a test of lattice by itself (no ctest entry): run alone it crashes and hangs.
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <thread>

#include "../cuda/broken_state_listener.h"

namespace {

bool g_broken = false;  // what a faulted kernel does to a CUDA context, in miniature

TEST(Fixture, Passes) { std::printf("[ info ] passes ran\n"); }
TEST(Fixture, Fails) { EXPECT_EQ(1, 2) << "a failure the runner must report"; }
TEST(Fixture, Skips) { GTEST_SKIP() << "skipped on purpose"; }
TEST(Fixture, Crashes) {
  std::printf("[ info ] crashes ran\n");
  std::raise(SIGSEGV);
}
TEST(Fixture, PassesAfterCrash) {}
TEST(Fixture, BreaksTheState) { g_broken = true; }
TEST(Fixture, PassesAfterBreak) {
  // Runs in a new process when the runner works: the state here is not broken.
  EXPECT_FALSE(g_broken);
}
TEST(Fixture, Hangs) {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

class Param : public ::testing::TestWithParam<int> {};
TEST_P(Param, EvenPasses) { EXPECT_EQ(GetParam() % 2, 0); }
INSTANTIATE_TEST_SUITE_P(Values, Param, ::testing::Values(2, 3, 4));

TEST(FixtureLast, Passes) {}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(
      new lattice::test::BrokenStateListener([] { return g_broken ? std::string("the state is broken") : std::string(); }));
  return RUN_ALL_TESTS();
}
