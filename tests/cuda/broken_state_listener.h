// A GoogleTest listener that ends the process when a test leaves it unusable for the
// tests after it: on a GPU, a kernel that faults (an illegal address, a trap) leaves a
// "sticky" error in the CUDA context, and every later CUDA call of the process fails.
// After each test it asks `check` (empty: all is well; else what is broken); when broken
// it prints one line, "[  BROKEN  ] Suite.Name: <what>", and exits with status 3, so a
// runner (scripts/gtest_resilient.py) reports that test as failed and runs the remaining
// ones in a new process instead of reporting all of them as failed.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

namespace lattice::test {

class BrokenStateListener : public ::testing::EmptyTestEventListener {
 public:
  explicit BrokenStateListener(std::function<std::string()> check) : check_(std::move(check)) {}

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::string broken = check_();
    if (broken.empty()) return;
    std::fflush(stdout);
    std::printf("[  BROKEN  ] %s.%s: %s\n", info.test_suite_name(), info.name(), broken.c_str());
    std::fflush(stdout);
    std::_Exit(3);
  }

 private:
  std::function<std::string()> check_;
};

}  // namespace lattice::test
