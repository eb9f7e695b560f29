#include "train/weight_hash.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "checkpoint/checksum.h"
#include "core/device.h"
#include "core/error.h"

namespace lattice {
namespace {

// The replicas of `comm` compare the hashes of the parameters that are (not) routed experts'.
std::optional<WeightHashMismatch> compare(const ParamBuffer& params, Comm& comm, bool experts) {
  std::vector<int> indices;
  for (size_t i = 0; i < params.infos().size(); ++i)
    if (params.infos()[i].expert == experts) indices.push_back(int(i));
  if (indices.empty() || comm.size() == 1) return std::nullopt;  // every replica has as many
  const int64_t n = int64_t(indices.size());
  std::vector<double> mine(static_cast<size_t>(n));  // a CRC-32 is exact in a double
  std::vector<float> host;
  for (int64_t k = 0; k < n; ++k) {
    const ParamInfo& p = params.infos()[size_t(indices[size_t(k)])];
    host.resize(size_t(p.numel));
    copy_to_host(host.data(), params.params() + p.offset, size_t(p.numel) * sizeof(float));
    mine[size_t(k)] = double(crc32_bytes(host.data(), host.size() * sizeof(float)));
  }
  std::vector<double> rank0 = mine;
  comm.broadcast(rank0.data(), n * int64_t(sizeof(double)), 0);
  double first = double(n);  // the first parameter any replica holds differently from rank 0
  for (int64_t k = 0; k < n; ++k)
    if (mine[size_t(k)] != rank0[size_t(k)]) {
      first = double(k);
      break;
    }
  first = -first;  // the minimum over the replicas, as the maximum of the negations
  comm.all_reduce(&first, 1, ReduceOp::max);
  first = -first;
  if (first >= double(n)) return std::nullopt;
  const size_t k = size_t(first);
  double who = -(mine[k] != rank0[k] ? double(comm.rank()) : double(comm.size()));  // the lowest such rank
  comm.all_reduce(&who, 1, ReduceOp::max);
  who = -who;
  double hash = comm.rank() == int(who) ? mine[k] : 0.0;  // the differing replica's hash, to every rank
  comm.all_reduce(&hash, 1, ReduceOp::max);
  WeightHashMismatch m;
  m.param = params.infos()[size_t(indices[k])].name;
  m.rank = int(who);
  m.world_rank = comm.world_ranks()[size_t(m.rank)];
  m.rank0_world_rank = comm.world_ranks()[0];
  m.rank0_hash = uint32_t(rank0[k]);
  m.hash = uint32_t(hash);
  return m;
}

}  // namespace

std::optional<WeightHashMismatch> find_weight_hash_mismatch(const ParamBuffer& params, Comm& dense, Comm& expert) {
  std::optional<WeightHashMismatch> m = compare(params, dense, false);
  if (m) return m;  // known to the whole data-parallel group
  m = compare(params, expert, true);
  if (&expert == &dense || dense.size() == 1) return m;
  // An expert group's finding, to the other expert groups of the data-parallel group: the
  // lowest data-parallel rank that has one sends it.
  double source = -(m ? double(dense.rank()) : double(dense.size()));
  dense.all_reduce(&source, 1, ReduceOp::max);
  source = -source;
  if (source >= double(dense.size())) return std::nullopt;
  struct Wire {
    char param[512];
    int32_t rank, world_rank, rank0_world_rank;
    uint32_t rank0_hash, hash;
  } w{};
  if (m) {
    w = Wire{{}, m->rank, m->world_rank, m->rank0_world_rank, m->rank0_hash, m->hash};
    std::strncpy(w.param, m->param.c_str(), sizeof w.param - 1);
  }
  dense.broadcast(&w, int64_t(sizeof w), int(source));
  return WeightHashMismatch{w.param, w.rank, w.world_rank, w.rank0_world_rank, w.rank0_hash, w.hash};
}

void apply_test_replica_perturbation(const ParamBuffer& params, int world_rank) {
  const char* env = std::getenv("LATTICE_TEST_PERTURB_REPLICA");
  if (!env || std::atoi(env) != world_rank) return;
  for (size_t i = params.infos().size(); i-- > 0;) {
    const ParamInfo& p = params.infos()[i];
    if (p.expert || p.numel == 0) continue;
    float v = 0;
    copy_to_host(&v, params.params() + p.offset, sizeof v);
    v += 1e-3f;
    copy_to_device(params.params() + p.offset, &v, sizeof v);
    return;
  }
}

void check_weight_hashes_across_dp_replicas(const ParamBuffer& params, Comm& dense, Comm& expert, Comm& world,
                                            int64_t iteration) {
  const std::optional<WeightHashMismatch> m = find_weight_hash_mismatch(params, dense, expert);
  // Every rank stops together: the other tensor- and pipeline-parallel positions' groups may match.
  double found = m ? 1.0 : 0.0;
  world.all_reduce(&found, 1, ReduceOp::max);
  if (found == 0.0) return;
  if (!m)
    LATTICE_FAIL() << "--check-weight-hash-across-dp-replicas-interval: after iteration " << iteration
                   << " the data-parallel replicas of another tensor- or pipeline-parallel rank's parameters differ "
                      "(their ranks' errors name them)";
  LATTICE_FAIL() << "--check-weight-hash-across-dp-replicas-interval: after iteration " << iteration << " parameter "
                 << m->param << " differs between its data-parallel replicas on ranks " << m->rank0_world_rank
                 << " (CRC-32 " << crc32_hex(m->rank0_hash) << ") and " << m->world_rank << " (CRC-32 "
                 << crc32_hex(m->hash) << ")";
}

}  // namespace lattice
