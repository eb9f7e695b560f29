// Open MPI implementation of Comm, and the process runtime (MPI_Init once, when the
// process was started by mpirun; a one-process run needs no mpirun and no MPI).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"

namespace lattice {

// True when this process was launched by mpirun (Open MPI / PMIx environment).
bool launched_by_mpirun();

// Initialises MPI once (thread level FUNNELED); finalised at exit. Returns world size.
int mpi_init_world();
int mpi_world_rank();
int mpi_world_size();
// Ranks of the world on this node (for the default thread count).
int mpi_local_size();

// Seconds a blocking wait may last before the job is aborted with a message naming
// this rank, the group and the operation (--distributed-timeout-minutes).
void set_comm_timeout_seconds(double seconds);

// A communicator over the given world ranks (every world rank must call this with the
// same `groups`; returns the group containing this rank, or null when it is in none).
std::unique_ptr<Comm> make_mpi_comm(const std::string& name, const std::vector<std::vector<int>>& groups);

// Aborts the whole job (all ranks) after printing `message` (one line) on stderr.
[[noreturn]] void abort_job(const std::string& message);

}  // namespace lattice
