// GoogleTest main for tests that run under mpirun with several ranks: every rank runs
// every test; only rank 0 prints, and a failure on any rank fails the run.
#include <gtest/gtest.h>
#include <mpi.h>

#include "dist/mpi_comm.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  lattice::mpi_init_world();
  const int rank = lattice::mpi_world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  return any_failed;
}
