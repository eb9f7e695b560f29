// main() of the GPU tests (lattice_cuda_tests, and lattice_simt_tests on the emulation):
// GoogleTest's, plus a listener that ends the process after a test that left the CUDA
// context unusable (broken_state_listener.h; scripts/gtest_resilient.py then runs the
// remaining tests in a new process).
#include <gtest/gtest.h>

#include "broken_state_listener.h"
#include "core/cuda_runtime.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new lattice::test::BrokenStateListener([] {
    const std::string err = lattice::cuda::context_error();
    return err.empty() ? err : "the CUDA context is unusable (" + err + ")";
  }));
  return RUN_ALL_TESTS();
}
