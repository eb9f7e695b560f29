#include "checkpoint/checkpoint.h"

#include <cmath>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/checksum.h"
#include "checkpoint/durable_fs.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace lattice {
namespace {

using json = nlohmann::json;

constexpr const char* kFormatName = "lattice-checkpoint";
constexpr const char* kStagingPrefix = ".tmp.";  // .tmp.iter_NNNNNNN: a save in progress
constexpr const char* kTrashPrefix = ".trash.";  // .trash.iter_NNNNNNN: a removal in progress

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The checksum of checkpoint.json covers the document without its "index_crc32" key,
// serialised compactly with sorted keys, so it is independent of indentation.
uint32_t document_crc(const json& doc_without_crc) {
  const std::string s = doc_without_crc.dump();
  return crc32_bytes(s.data(), s.size());
}

// fp8's three scaled tensors of a weight, in Fp8ScalingState's order.
constexpr const char* kFp8Tensors[3] = {"input", "weight", "output_grad"};

template <typename T>
T field(const json& j, const char* key, const std::string& where);

}  // namespace

json fp8_state_to_json(const std::map<std::string, Fp8ScalingState>& states) {
  json f = json::object();
  for (const auto& [name, st] : states) {
    json w = json::object();
    for (int k = 0; k < 3; ++k) {
      json h = json::array();
      for (float a : st.amax_history[size_t(k)]) h.push_back(std::isfinite(a) ? json(a) : json(nullptr));
      w[kFp8Tensors[k]] = {{"amax_history", h}, {"scale", st.scale[size_t(k)]}};
    }
    f[name] = w;
  }
  return f;
}

std::map<std::string, Fp8ScalingState> fp8_state_from_json(const json& f, const std::string& where) {
  if (!f.is_object()) LATTICE_FAIL() << where << ": fp8 must be a JSON object";
  std::map<std::string, Fp8ScalingState> states;
  for (const auto& [name, w] : f.items()) {
    Fp8ScalingState st;
    for (int k = 0; k < 3; ++k) {
      const std::string at = where + " fp8 " + name + " " + kFp8Tensors[k];
      const json t = field<json>(w, kFp8Tensors[k], at);
      st.scale[size_t(k)] = field<float>(t, "scale", at);
      if (!(st.scale[size_t(k)] > 0) || !std::isfinite(st.scale[size_t(k)]))
        LATTICE_FAIL() << at << ": scale must be a positive finite number";
      const json h = field<json>(t, "amax_history", at);
      if (!h.is_array()) LATTICE_FAIL() << at << ": amax_history must be an array";
      for (const json& a : h) {
        if (!a.is_null() && !a.is_number()) LATTICE_FAIL() << at << ": amax_history holds a non-number";
        st.amax_history[size_t(k)].push_back(a.is_null() ? INFINITY : a.get<float>());
      }
    }
    states[name] = st;
  }
  return states;
}

namespace {

json state_to_json(const CheckpointState& s) {
  json j = {{"format", kFormatName},
            {"format_version", kCheckpointFormatVersion},
            {"iteration", s.iteration},
            {"consumed_train_samples", s.consumed_train_samples},
            {"num_floating_point_operations_so_far", s.num_floating_point_operations_so_far},
            {"model_config", s.model_config},
            {"args", s.args}};
  if (s.optimizer) j["optimizer"] = {{"name", s.optimizer->name}, {"step", s.optimizer->step}};
  if (s.opt_param_scheduler) j["opt_param_scheduler"] = *s.opt_param_scheduler;
  if (s.rng) j["rng"] = {{"seed", s.rng->seed}, {"generator", "philox4x32-10(seed, iteration, micro_batch)"}};
  if (s.loss_scaler)
    j["loss_scaler"] = {{"scale", s.loss_scaler->scale},
                        {"growth_tracker", s.loss_scaler->growth_tracker},
                        {"hysteresis_tracker", s.loss_scaler->hysteresis_tracker}};
  if (!s.fp8.empty()) j["fp8"] = fp8_state_to_json(s.fp8);
  if (s.rerun_state_machine) j["rerun_state_machine"] = *s.rerun_state_machine;
  return j;
}

template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) LATTICE_FAIL() << where << ": missing field '" << key << "'";
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    LATTICE_FAIL() << where << ": field '" << key << "' has the wrong type";
  }
}

CheckpointState state_from_json(const json& j, const std::string& where) {
  CheckpointState s;
  s.iteration = field<int64_t>(j, "iteration", where);
  s.consumed_train_samples = field<int64_t>(j, "consumed_train_samples", where);
  if (s.iteration < 0 || s.consumed_train_samples < 0)
    LATTICE_FAIL() << where << ": negative iteration or consumed_train_samples";
  if (j.contains("num_floating_point_operations_so_far")) {
    s.num_floating_point_operations_so_far = field<double>(j, "num_floating_point_operations_so_far", where);
    if (!(s.num_floating_point_operations_so_far >= 0) || !std::isfinite(s.num_floating_point_operations_so_far))
      LATTICE_FAIL() << where << ": num_floating_point_operations_so_far must be a finite number >= 0";
  }
  s.model_config = field<json>(j, "model_config", where);
  s.args = field<json>(j, "args", where);
  if (!s.model_config.is_object() || !s.args.is_object())
    LATTICE_FAIL() << where << ": model_config and args must be JSON objects";
  if (j.contains("optimizer")) {
    const json& o = j["optimizer"];
    s.optimizer = OptimizerState{field<std::string>(o, "name", where + " optimizer"),
                                 field<int64_t>(o, "step", where + " optimizer")};
  }
  if (j.contains("opt_param_scheduler")) s.opt_param_scheduler = j["opt_param_scheduler"];
  if (j.contains("rng")) s.rng = RngState{field<uint64_t>(j["rng"], "seed", where + " rng")};
  if (j.contains("loss_scaler")) {
    const json& l = j["loss_scaler"];
    const std::string w = where + " loss_scaler";
    s.loss_scaler = LossScalerState{field<double>(l, "scale", w), field<int64_t>(l, "growth_tracker", w),
                                    field<int64_t>(l, "hysteresis_tracker", w)};
    if (!(s.loss_scaler->scale > 0) || !std::isfinite(s.loss_scaler->scale) || s.loss_scaler->growth_tracker < 0)
      LATTICE_FAIL() << w << ": scale must be a positive finite number and growth_tracker >= 0";
  }
  if (j.contains("fp8")) s.fp8 = fp8_state_from_json(j["fp8"], where);
  if (j.contains("rerun_state_machine")) {
    if (!j["rerun_state_machine"].is_object()) LATTICE_FAIL() << where << ": rerun_state_machine must be a JSON object";
    s.rerun_state_machine = j["rerun_state_machine"];
  }
  return s;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) LATTICE_FAIL() << path << ": cannot open: " << std::strerror(errno);
  std::ostringstream os;
  os << f.rdbuf();
  if (f.bad()) LATTICE_FAIL() << path << ": read failed";
  return os.str();
}

// A non-negative decimal integer (digits only); false otherwise.
bool parse_count(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

// iter_NNNNNNN (at least 7 digits) -> N; -1 for any other name.
int64_t parse_iter_dir_name(const std::string& name) {
  int64_t v = -1;
  if (name.size() < 12 || name.compare(0, 5, "iter_") != 0 || !parse_count(name.substr(5), &v)) return -1;
  return v;
}

// Leftovers of saves or removals that a crash interrupted.
void remove_stale_staging(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(kStagingPrefix, 0) == 0 || n.rfind(kTrashPrefix, 0) == 0) fs::remove_all(e.path(), ec);
  }
}

// Keeps the checkpoint just saved and the newest keep_last_n - 1 others.
void prune_checkpoints(const fs::path& dir, int64_t keep_last_n, int64_t saved) {
  if (keep_last_n <= 0) return;
  std::vector<int64_t> others;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t it = parse_iter_dir_name(e.path().filename().string());
    if (it >= 0 && it != saved && e.is_directory()) others.push_back(it);
  }
  std::sort(others.begin(), others.end(), std::greater<>());
  for (size_t k = size_t(keep_last_n - 1); k < others.size(); ++k) {
    const std::string name = iter_dir_name(others[k]);
    remove_dir_durably((dir / name).string(), (dir / (kTrashPrefix + name)).string());
  }
}

// Megatron's --save-retain-interval: after a save, the checkpoint the tracker named before it is
// removed unless its iteration is a multiple of the interval (a symbolic link is left alone).
void drop_unretained(const fs::path& dir, int64_t previous, int64_t saved, int64_t retain_interval) {
  if (retain_interval <= 0 || previous <= 0 || previous == saved || previous % retain_interval == 0) return;
  const std::string name = iter_dir_name(previous);
  std::error_code ec;
  if (fs::is_symlink(dir / name, ec) || !fs::is_directory(dir / name, ec)) return;
  remove_dir_durably((dir / name).string(), (dir / (kTrashPrefix + name)).string());
}

}  // namespace

std::string iter_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", (long long)iteration);
  return buf;
}

// " (a Megatron-LM checkpoint: ...)" when `dir` holds Megatron-LM's own files (mp_rank_* directories, or
// torch_dist's .metadata and common.pt), else "": what to do instead of loading it.
static std::string megatron_hint(const fs::path& dir, const std::string& given) {
  std::error_code ec;
  bool megatron = fs::exists(dir / ".metadata", ec) && fs::exists(dir / "common.pt", ec);
  for (fs::directory_iterator it(dir, ec), end; !megatron && !ec && it != end; it.increment(ec))
    megatron = it->path().filename().string().rfind("mp_rank_", 0) == 0;
  if (!megatron) return "";
  return " (a Megatron-LM checkpoint, which lattice reads by converting it: lattice convert --from-megatron " + given +
         " --save CKPT)";
}

std::optional<int64_t> read_latest_iteration(const std::string& dir) {
  const fs::path tracker = fs::path(dir) / kTrackerFile;
  std::error_code ec;
  if (!fs::exists(tracker, ec)) return std::nullopt;
  std::string text = read_whole_file(tracker.string());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  int64_t it = -1;
  if (text == "release")
    if (const std::string hint = megatron_hint(fs::path(dir) / "release", dir); !hint.empty())
      LATTICE_FAIL() << tracker.string() << ": names 'release'" << hint;
  if (!parse_count(text, &it)) {
    std::string shown = text.substr(0, 20);
    for (char& c : shown)
      if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
    LATTICE_FAIL() << tracker.string() << ": corrupt: not an iteration number: '" << shown << "'";
  }
  return it;
}

nlohmann::json checkpoint_provenance(const nlohmann::json& args) {
  nlohmann::json p = nlohmann::json::object();
  for (const char* key : {"converted-from-hf", "hf-model-type", "converted-from-megatron", "megatron-iteration"})
    if (args.contains(key)) p[key] = args.at(key);
  return p;
}

bool has_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::path(path) / kTrackerFile, ec) || fs::exists(fs::path(path) / kCheckpointIndexFile, ec);
}

std::string checkpoint_at_iteration(const std::string& dir, int64_t iteration, const std::string& flag) {
  const fs::path at = fs::path(dir) / iter_dir_name(iteration);
  std::error_code ec;
  if (fs::exists(at / kCheckpointIndexFile, ec)) return at.string();
  std::vector<int64_t> held;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t it = parse_iter_dir_name(e.path().filename().string());
    if (it >= 0 && fs::exists(e.path() / kCheckpointIndexFile, ec)) held.push_back(it);
  }
  std::sort(held.begin(), held.end());
  std::string list;
  for (int64_t it : held) list += (list.empty() ? "" : ", ") + std::to_string(it);
  LATTICE_FAIL() << flag << " " << iteration << ": " << dir << " has no checkpoint of iteration " << iteration << " (no "
                 << (at / kCheckpointIndexFile).string() << "; it holds "
                 << (list.empty() ? std::string("none") : "iterations " + list) << ")";
}

// ---------------------------------------------------------------------------------------------
// Writing

void CheckpointWriter::add_tensor(const std::string& file, const std::string& name, const std::string& dtype,
                                  const std::vector<int64_t>& shape, const void* data) {
  add_piece(file, name, dtype, shape, std::vector<int64_t>(shape.size(), 0), shape, data);
}

std::string CheckpointWriter::add_index_entry(const std::string& file, const std::string& name,
                                              const std::string& dtype, const std::vector<int64_t>& global_shape,
                                              const std::vector<int64_t>& offsets,
                                              const std::vector<int64_t>& lengths) {
  if (file.empty() || file.find('/') != std::string::npos || file[0] == '.' || file == kCheckpointIndexFile)
    LATTICE_FAIL() << "checkpoint writer: invalid file name '" << file << "'";
  TensorEntry& e = index_.tensors[name];
  if (e.pieces.empty()) {
    e.dtype = dtype;
    e.shape = global_shape;
  } else if (e.dtype != dtype || e.shape != global_shape) {
    LATTICE_FAIL() << "checkpoint writer: tensor '" << name << "' added as " << dtype << " "
                   << dims_str(global_shape) << " after " << e.dtype << " " << dims_str(e.shape);
  }
  // The first piece of a tensor in a file is stored under the tensor's name (what other
  // safetensors readers expect), further ones as name#k.
  size_t in_file = 0;
  for (const TensorPiece& p : e.pieces) in_file += p.file == file;
  const std::string key = in_file == 0 ? name : name + "#" + std::to_string(e.pieces.size());
  e.pieces.push_back({file, key, offsets, lengths});
  index_.files[file] = FileEntry{};
  return key;
}

void CheckpointWriter::add_piece(const std::string& file, const std::string& name, const std::string& dtype,
                                 const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offsets,
                                 const std::vector<int64_t>& lengths, const void* data, bool borrow) {
  const std::string key = add_index_entry(file, name, dtype, global_shape, offsets, lengths);
  const size_t bytes = size_t(box_numel(lengths)) * safetensors_dtype_size(dtype);
  if (borrow)
    files_[file].add_view(key, dtype, lengths, data, bytes);
  else
    files_[file].add(key, dtype, lengths, data, bytes);
}

void CheckpointWriter::add_produced_piece(const std::string& file, const std::string& name, const std::string& dtype,
                                          const std::vector<int64_t>& global_shape,
                                          const std::vector<int64_t>& offsets, const std::vector<int64_t>& lengths,
                                          std::function<void(uint8_t* out)> produce) {
  const std::string key = add_index_entry(file, name, dtype, global_shape, offsets, lengths);
  files_[file].add_produced(key, dtype, lengths, size_t(box_numel(lengths)) * safetensors_dtype_size(dtype),
                            std::move(produce));
}

void CheckpointWriter::add_flat_range(const std::string& file, const std::string& name, const std::string& dtype,
                                      const std::vector<int64_t>& global_shape, int64_t begin, int64_t end,
                                      const void* data) {
  const size_t esize = safetensors_dtype_size(dtype);
  const auto* p = static_cast<const uint8_t*>(data);
  for (const Box& b : flat_range_to_boxes(global_shape, begin, end)) {
    add_piece(file, name, dtype, global_shape, b.offsets, b.lengths, p);
    p += size_t(box_numel(b.lengths)) * esize;
  }
}

std::string CheckpointWriter::save(const std::string& dir, int64_t keep_last_n, int64_t retain_interval) const {
  const fs::path root(dir);
  std::error_code ec;
  const bool created = fs::create_directories(root, ec);
  if (created) {
    const fs::path parent = root.parent_path().empty() ? fs::path(".") : root.parent_path();
    fsync_dir(parent.string());  // the new directory's own entry
  }
  if (ec) LATTICE_FAIL() << "--save " << dir << ": cannot create directory: " << ec.message();
  remove_stale_staging(root);
  std::optional<int64_t> previous;  // the checkpoint this one follows, for --save-retain-interval
  if (retain_interval > 0) {
    try {
      previous = read_latest_iteration(dir);
    } catch (const Error&) {  // a damaged tracker names no checkpoint to drop; the save replaces it
    }
  }

  const std::string name = iter_dir_name(state_.iteration);
  const fs::path staged = root / (kStagingPrefix + name);
  fs::create_directory(staged, ec);
  if (ec) LATTICE_FAIL() << staged.string() << ": cannot create directory: " << ec.message();

  // A save that fails (a full disk, a write error, a tensor that cannot be read) removes what it staged,
  // and the directory itself when it made it: the space goes back to the user, and the checkpoints already
  // published stay as they were.
  try {
    CheckpointIndex index = index_;
    for (const auto& [file, writer] : files_) {
      const std::string path = (staged / file).string();
      writer.write(path);
      const FileChecksum cs = checksum_file(path);
      index.files[file] = FileEntry{cs.bytes, cs.crc32};
    }
    json doc = state_to_json(state_);
    doc["files"] = index.files_json();
    doc["tensors"] = index.tensors_json();
    // What we write must be what we accept.
    CheckpointIndex::from_json(doc["tensors"], doc["files"], (staged / kCheckpointIndexFile).string());
    doc["index_crc32"] = crc32_hex(document_crc(doc));
    const std::string text = doc.dump(1) + "\n";
    write_file_synced((staged / kCheckpointIndexFile).string(), text.data(), text.size());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staged, ignored);
    if (created) fs::remove(root, ignored);  // the directory this save made (left alone if it holds anything)
    throw;
  }

  const fs::path target = root / name;
  publish_dir(staged.string(), target.string());
  write_file_atomic((root / kTrackerFile).string(), std::to_string(state_.iteration) + "\n");
  prune_checkpoints(root, keep_last_n, state_.iteration);
  if (previous) drop_unretained(root, *previous, state_.iteration, retain_interval);
  return target.string();
}

// ---------------------------------------------------------------------------------------------
// Reading

CheckpointReader CheckpointReader::open(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  CheckpointReader r;
  if (fs::exists(p / kCheckpointIndexFile, ec)) {
    r.iter_dir_ = p.string();
  } else if (std::optional<int64_t> it = read_latest_iteration(path)) {
    r.iter_dir_ = (p / iter_dir_name(*it)).string();
    if (!fs::exists(fs::path(r.iter_dir_) / kCheckpointIndexFile, ec))
      LATTICE_FAIL() << (fs::path(r.iter_dir_) / kCheckpointIndexFile).string() << ": missing ("
                     << (p / kTrackerFile).string() << " names iteration " << *it << ")"
                     << megatron_hint(r.iter_dir_, path);
  } else if (!fs::exists(p, ec)) {
    LATTICE_FAIL() << path << ": no such checkpoint directory";
  } else {
    LATTICE_FAIL() << path << ": not a checkpoint (neither " << kTrackerFile << " nor " << kCheckpointIndexFile
                   << ")" << megatron_hint(p, path);
  }
  const std::string index_path = (fs::path(r.iter_dir_) / kCheckpointIndexFile).string();
  json doc;
  try {
    doc = json::parse(read_whole_file(index_path));
  } catch (const json::parse_error& e) {
    LATTICE_FAIL() << index_path << ": corrupt: not valid JSON (" << e.what() << ")";
  }
  if (!doc.is_object() || !doc.contains("index_crc32") || !doc["index_crc32"].is_string())
    LATTICE_FAIL() << index_path << ": corrupt: no index_crc32";
  uint32_t stored = 0;
  if (!parse_crc32_hex(doc["index_crc32"].get<std::string>(), &stored))
    LATTICE_FAIL() << index_path << ": corrupt: index_crc32 is not 8 hex digits";
  doc.erase("index_crc32");
  const uint32_t computed = document_crc(doc);
  if (computed != stored)
    LATTICE_FAIL() << index_path << ": corrupt: CRC-32 mismatch (recorded " << crc32_hex(stored) << ", computed "
                   << crc32_hex(computed) << ")";
  if (doc.value("format", std::string()) != kFormatName)
    LATTICE_FAIL() << index_path << ": not a lattice checkpoint (format is not '" << kFormatName << "')";
  const int version = field<int>(doc, "format_version", index_path);
  if (version != kCheckpointFormatVersion)
    LATTICE_FAIL() << index_path << ": checkpoint format version " << version << ", this lattice reads version "
                   << kCheckpointFormatVersion;
  r.state_ = state_from_json(doc, index_path);
  if (!doc.contains("tensors") || !doc.contains("files"))
    LATTICE_FAIL() << index_path << ": missing 'tensors' or 'files'";
  r.index_ = CheckpointIndex::from_json(doc["tensors"], doc["files"], index_path);
  return r;
}

const TensorEntry& CheckpointReader::tensor(const std::string& name) const {
  auto it = index_.tensors.find(name);
  if (it == index_.tensors.end())
    LATTICE_FAIL() << (fs::path(iter_dir_) / kCheckpointIndexFile).string() << ": no tensor '" << name << "'";
  return it->second;
}

const SafetensorsFile& CheckpointReader::file(const std::string& name) const {
  auto it = open_files_.find(name);
  if (it != open_files_.end()) return *it->second;
  const std::string path = (fs::path(iter_dir_) / name).string();
  const FileEntry& want = index_.files.at(name);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    LATTICE_FAIL() << path << ": missing (listed in " << kCheckpointIndexFile << "): " << std::strerror(errno);
  if (uint64_t(st.st_size) != want.bytes)
    LATTICE_FAIL() << path << ": corrupt: " << st.st_size << " bytes, " << kCheckpointIndexFile << " records "
                   << want.bytes << " (truncated or overwritten)";
  const FileChecksum got = checksum_file(path);
  if (got.crc32 != want.crc32 || got.bytes != want.bytes)
    LATTICE_FAIL() << path << ": corrupt: CRC-32 mismatch (" << kCheckpointIndexFile << " records "
                   << crc32_hex(want.crc32) << ", the file has " << crc32_hex(got.crc32) << ")";
  auto f = std::make_shared<SafetensorsFile>(SafetensorsFile::read(path));
  open_files_[name] = f;
  return *f;
}

void CheckpointReader::read_tensor(const std::string& name, const std::string& dtype,
                                   const std::vector<int64_t>& shape, void* out) const {
  const TensorEntry& e = tensor(name);
  if (e.shape != shape)
    LATTICE_FAIL() << "checkpoint " << iter_dir_ << ": tensor '" << name << "' has shape " << dims_str(e.shape)
                   << ", the model expects " << dims_str(shape);
  read_slice(name, dtype, std::vector<int64_t>(shape.size(), 0), shape, out);
}

void CheckpointReader::release(const std::string& name) const {
  for (const TensorPiece& p : tensor(name).pieces) {
    const auto it = open_files_.find(p.file);
    if (it != open_files_.end() && it->second->has(p.key)) it->second->release(p.key);
  }
}

void CheckpointReader::read_slice(const std::string& name, const std::string& dtype,
                                  const std::vector<int64_t>& offsets, const std::vector<int64_t>& lengths,
                                  void* out) const {
  const TensorEntry& e = tensor(name);
  if (e.dtype != dtype)
    LATTICE_FAIL() << "checkpoint " << iter_dir_ << ": tensor '" << name << "' has dtype " << e.dtype
                   << ", expected " << dtype;
  bool inside = offsets.size() == e.shape.size() && lengths.size() == e.shape.size();
  for (size_t d = 0; inside && d < e.shape.size(); ++d)
    inside = offsets[d] >= 0 && lengths[d] >= 0 && offsets[d] + lengths[d] <= e.shape[d];
  if (!inside)
    LATTICE_FAIL() << "checkpoint " << iter_dir_ << ": tensor '" << name << "': slice offsets "
                   << dims_str(offsets) << " lengths " << dims_str(lengths) << " is outside its shape "
                   << dims_str(e.shape);
  const size_t esize = safetensors_dtype_size(dtype);
  int64_t copied = 0;
  for (const TensorPiece& p : e.pieces) {
    bool meets = true;
    for (size_t d = 0; meets && d < p.offsets.size(); ++d)
      meets = std::max(p.offsets[d], offsets[d]) < std::min(p.offsets[d] + p.lengths[d], offsets[d] + lengths[d]);
    if (!meets) continue;
    const SafetensorsFile& f = file(p.file);
    if (!f.has(p.key))
      LATTICE_FAIL() << f.path() << ": corrupt: no tensor '" << p.key << "' (" << kCheckpointIndexFile
                     << " places a piece of '" << name << "' here)";
    const SafeTensor& t = f.get(p.key);
    if (t.dtype != e.dtype || t.shape != p.lengths)
      LATTICE_FAIL() << f.path() << ": tensor '" << p.key << "' is " << t.dtype << " " << dims_str(t.shape) << ", "
                     << kCheckpointIndexFile << " says " << e.dtype << " " << dims_str(p.lengths);
    copied += copy_box_intersection(p.offsets, p.lengths, t.bytes.data(), offsets, lengths, out, esize);
  }
  LATTICE_CHECK(copied == box_numel(lengths)) << "tensor " << name << ": pieces covered " << copied << " elements";
}

}  // namespace lattice
