// Training checkpoints (docs/checkpoint-format.md):
//   DIR/iter_NNNNNNN/checkpoint.json        format version, training state, tensor index,
//                                           size and CRC-32 of every other file, its own CRC-32
//   DIR/iter_NNNNNNN/model.safetensors      parameters (Megatron-Core names)
//   DIR/iter_NNNNNNN/optimizer.safetensors  optimizer state ("optimizer.exp_avg.<param>", ...)
//   DIR/latest_checkpointed_iteration.txt   the newest complete checkpoint, written last
// Saving stages the iteration directory under a temporary name, fsyncs every file and the
// directory, renames it into place and only then rewrites the tracker file, so a crash at
// any instant leaves the previous checkpoint loadable. Loading verifies every checksum.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_index.h"
#include "checkpoint/safetensors.h"
#include "model/mixed_precision.h"
#include "optim/loss_scaler.h"

namespace lattice {

inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr const char* kCheckpointIndexFile = "checkpoint.json";
inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";

// "iter_0000042"
std::string iter_dir_name(int64_t iteration);

// The iteration DIR/latest_checkpointed_iteration.txt names; nullopt when DIR or the file
// does not exist; a lattice::Error naming the file when it is malformed.
std::optional<int64_t> read_latest_iteration(const std::string& dir);

// Whether PATH holds a checkpoint to open: a tracker file, or checkpoint.json (an
// iteration directory). Says nothing about its integrity (CheckpointReader::open does).
bool has_checkpoint(const std::string& path);

// The iteration directory DIR/iter_NNNNNNN of a checkpoint root, to load a chosen iteration instead of
// the tracker's (--ckpt-step); a lattice::Error naming `flag`, the directory and the iterations DIR
// holds when it has no checkpoint of that iteration.
std::string checkpoint_at_iteration(const std::string& dir, int64_t iteration, const std::string& flag);

// The keys of a checkpoint's args that say where its weights came from, which every checkpoint trained from
// it carries on: "converted-from-hf" (the HuggingFace folder `lattice convert --from-hf` read),
// "hf-model-type" (that folder's config.json model_type, the family `convert --to-hf` writes by default),
// "converted-from-megatron" and "megatron-iteration" (the Megatron-LM checkpoint `--from-megatron` read).
nlohmann::json checkpoint_provenance(const nlohmann::json& args);

// Optimizer bookkeeping beside its state tensors.
struct OptimizerState {
  std::string name;  // "adam" | "sgd"
  int64_t step = 0;  // updates taken (Adam's bias correction)
};

// lattice's only random state in training: dropout masks come from a counter-based
// Philox stream keyed by (seed, iteration, micro-batch), so the seed and the iteration
// determine every future draw; nothing stateful needs saving.
struct RngState {
  uint64_t seed = 0;
};

// Everything a checkpoint holds besides tensors.
struct CheckpointState {
  int64_t iteration = 0;                 // completed iterations
  int64_t consumed_train_samples = 0;    // data position: the next sample index
  nlohmann::json model_config = nlohmann::json::object();
  nlohmann::json args = nlohmann::json::object();  // the full argument set of the run
  std::optional<OptimizerState> optimizer;          // absent: saved with --no-save-optim
  std::optional<nlohmann::json> opt_param_scheduler;  // absent with --no-save-optim
  std::optional<RngState> rng;                      // absent: saved with --no-save-rng
  std::optional<LossScalerState> loss_scaler;       // fp16's dynamic loss scaler (absent otherwise)
  // fp8's delayed scaling, by weight name (empty without --fp8-format). An amax history
  // entry that was not finite is stored as null.
  std::map<std::string, Fp8ScalingState> fp8;
  // Megatron's num_floating_point_operations_so_far: the model FLOPs of every iteration trained so far
  // (--log-progress's throughputs; 0 in a checkpoint saved without it).
  double num_floating_point_operations_so_far = 0;
  // --check-for-spiky-loss / --check-for-large-grads: the values sampled so far (Megatron's
  // rerun_state_machine large_value_counts and max_values; absent without the checks).
  std::optional<nlohmann::json> rerun_state_machine;
};

// fp8 scaling states by weight name as checkpoint.json's "fp8" object, and back (errors
// name `where` and the field).
nlohmann::json fp8_state_to_json(const std::map<std::string, Fp8ScalingState>& states);
std::map<std::string, Fp8ScalingState> fp8_state_from_json(const nlohmann::json& f, const std::string& where);

// Collects tensors and state, then writes one iteration directory.
class CheckpointWriter {
 public:
  // A whole tensor: one piece covering its shape.
  void add_tensor(const std::string& file, const std::string& name, const std::string& dtype,
                  const std::vector<int64_t>& shape, const void* data);
  // The box [offsets, offsets + lengths) of a global tensor; data is row-major of shape
  // `lengths`. The data is copied, or with `borrow` written from where it is at save(): it must then
  // stay valid and unchanged until save() returns (a model's parameters saved while the model lives).
  void add_piece(const std::string& file, const std::string& name, const std::string& dtype,
                 const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offsets,
                 const std::vector<int64_t>& lengths, const void* data, bool borrow = false);
  // The row-major element range [begin, end) of a global tensor (a shard of a flat
  // buffer), stored as the few boxes that make it up; data holds end - begin elements.
  void add_flat_range(const std::string& file, const std::string& name, const std::string& dtype,
                      const std::vector<int64_t>& global_shape, int64_t begin, int64_t end, const void* data);
  // add_piece's box with its data produced when the file is written (SafetensorsWriter::add_produced):
  // produce(out) writes the box's bytes, row-major.
  void add_produced_piece(const std::string& file, const std::string& name, const std::string& dtype,
                          const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offsets,
                          const std::vector<int64_t>& lengths, std::function<void(uint8_t* out)> produce);
  void set_state(const CheckpointState& state) { state_ = state; }

  // Writes DIR/iter_NNNNNNN (state().iteration) atomically, then the tracker file; then
  // removes all but the newest keep_last_n checkpoints (0 keeps all), and with retain_interval
  // (--save-retain-interval; 0: none) the checkpoint the tracker named before, unless its
  // iteration is a multiple of retain_interval. Returns the iteration directory.
  std::string save(const std::string& dir, int64_t keep_last_n = 0, int64_t retain_interval = 0) const;

 private:
  // A new piece's index entry: the key it is stored under in `file` (the tensor's name, or name#k).
  std::string add_index_entry(const std::string& file, const std::string& name, const std::string& dtype,
                              const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offsets,
                              const std::vector<int64_t>& lengths);
  std::map<std::string, SafetensorsWriter> files_;
  CheckpointIndex index_;
  CheckpointState state_;
};

// One verified checkpoint.
class CheckpointReader {
 public:
  // PATH is a checkpoint directory (its tracker file names the iteration) or an
  // iteration directory. Verifies checkpoint.json (its checksum, format version and
  // index); each data file's size and checksum are verified when it is first read.
  static CheckpointReader open(const std::string& path);

  const std::string& iter_dir() const { return iter_dir_; }
  const CheckpointState& state() const { return state_; }
  const CheckpointIndex& index() const { return index_; }
  bool has_tensor(const std::string& name) const { return index_.tensors.count(name) != 0; }
  const TensorEntry& tensor(const std::string& name) const;

  // The whole tensor into `out`; its dtype and global shape must be the given ones.
  void read_tensor(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                   void* out) const;
  // The box [offsets, offsets + lengths) of the global tensor, row-major, into `out`.
  void read_slice(const std::string& name, const std::string& dtype, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& lengths, void* out) const;
  // Gives back the memory of the pages read for tensor `name` (SafetensorsFile::release): a checkpoint larger
  // than memory read tensor by tensor.
  void release(const std::string& name) const;

 private:
  const SafetensorsFile& file(const std::string& name) const;

  std::string iter_dir_;
  CheckpointState state_;
  CheckpointIndex index_;
  mutable std::map<std::string, std::shared_ptr<SafetensorsFile>> open_files_;
};

}  // namespace lattice
