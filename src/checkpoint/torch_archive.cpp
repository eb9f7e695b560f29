#include "checkpoint/torch_archive.h"

#include <zip.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "checkpoint/durable_fs.h"
#include "core/error.h"
#include "kernels/cast_math.h"

namespace lattice {

namespace {

// torch.<Name>Storage -> (dtype, element bytes).
const std::map<std::string, std::pair<std::string, int>>& storage_types() {
  static const std::map<std::string, std::pair<std::string, int>> types = {
      {"FloatStorage", {"float32", 4}},  {"DoubleStorage", {"float64", 8}}, {"HalfStorage", {"float16", 2}},
      {"BFloat16Storage", {"bfloat16", 2}}, {"LongStorage", {"int64", 8}},  {"IntStorage", {"int32", 4}},
      {"ShortStorage", {"int16", 2}},    {"CharStorage", {"int8", 1}},      {"ByteStorage", {"uint8", 1}},
      {"BoolStorage", {"bool", 1}},      {"UntypedStorage", {"uint8", 1}}};
  return types;
}

// torch.<dtype> (the dtype argument of _rebuild_tensor_v3) -> element bytes.
int dtype_size(const std::string& dtype) {
  for (const auto& [storage, t] : storage_types())
    if (t.first == dtype) return t.second;
  return 0;
}

std::vector<int64_t> int_tuple(const PyRef& v, const std::string& what) {
  if (!v || (!v->is(PyValue::Kind::tuple) && !v->is(PyValue::Kind::list)))
    LATTICE_FAIL() << what << ": a tensor's size or stride is " << (v ? v->describe() : "missing");
  std::vector<int64_t> out;
  for (const PyRef& x : v->items) {
    if (!x->is(PyValue::Kind::integer) || x->integer < 0)
      LATTICE_FAIL() << what << ": a tensor's dim is " << x->describe();
    out.push_back(x->integer);
  }
  return out;
}

PyRef opaque(const char* what, std::shared_ptr<void> p) {
  auto v = std::make_shared<PyValue>();
  v->kind = PyValue::Kind::opaque;
  v->name = what;
  v->payload = std::move(p);
  return v;
}

}  // namespace

int64_t TorchTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TorchTensor::contiguous() const {
  int64_t expect = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && stride[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

struct TorchArchive::Zip {
  zip_t* z = nullptr;
  std::mutex mu;
  std::set<zip_uint64_t> verified;  // records whose CRC-32 was checked whole (read in parts afterwards)
  ~Zip() {
    if (z) zip_discard(z);
  }
};

namespace {
// Reads the rest of an open record to its end: libzip checks the record's CRC-32 (the central directory's) only when a
// read reaches past the end, which reading exactly a record's bytes never does. False when the check fails.
bool crc_checked_at_end(zip_file_t* f) {
  char c;
  return zip_fread(f, &c, 1) == 0;
}

[[noreturn]] void not_torch_save(const std::string& what, zip_error_t* e) {
  const std::string why = zip_error_strerror(e);
  zip_error_fini(e);
  LATTICE_FAIL() << what << ": not a torch.save file (" << why
                 << "; files of PyTorch before 1.6, or saved with _use_new_zipfile_serialization=False, are not read)";
}
}  // namespace

TorchArchive::TorchArchive(const std::string& path) : path_(path), zip_(std::make_unique<Zip>()) {
  int err = 0;
  zip_->z = zip_open(path.c_str(), ZIP_RDONLY, &err);
  if (!zip_->z) {
    zip_error_t e;
    zip_error_init_with_code(&e, err);
    not_torch_save(path, &e);
  }
  read_pickle();
}

TorchArchive::TorchArchive(const std::string& what, std::vector<uint8_t> bytes)
    : path_(what), bytes_(std::move(bytes)), zip_(std::make_unique<Zip>()) {
  open_source([&](zip_error_t* e) { return zip_source_buffer_create(bytes_.data(), bytes_.size(), 0, e); });
}

TorchArchive::TorchArchive(const std::string& what, const std::string& path, uint64_t start, uint64_t length)
    : path_(what), zip_(std::make_unique<Zip>()) {
  open_source([&](zip_error_t* e) { return zip_source_file_create(path.c_str(), start, zip_int64_t(length), e); });
}

void TorchArchive::open_source(const std::function<zip_source_t*(zip_error_t*)>& make) {
  zip_error_t e;
  zip_error_init(&e);
  zip_source_t* src = make(&e);
  if (src) zip_->z = zip_open_from_source(src, ZIP_RDONLY, &e);
  if (!zip_->z) {
    if (src) zip_source_free(src);
    not_torch_save(path_, &e);
  }
  zip_error_fini(&e);
  read_pickle();
}

void TorchArchive::read_pickle() {
  const std::string& path = path_;
  // The record PREFIX/data.pkl (PREFIX: the name the file was saved under).
  const zip_int64_t entries = zip_get_num_entries(zip_->z, 0);
  zip_int64_t pkl = -1;
  for (zip_int64_t i = 0; i < entries && pkl < 0; ++i) {
    const std::string name = zip_get_name(zip_->z, zip_uint64_t(i), 0);
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash + 1) == "data.pkl") {
      pkl = i;
      prefix_ = name.substr(0, slash + 1);
    }
  }
  if (pkl < 0) LATTICE_FAIL() << path << ": a zip archive without data.pkl (not a torch.save file)";
  auto read_record = [&](zip_int64_t index) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(zip_->z, zip_uint64_t(index), 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE))
      LATTICE_FAIL() << path << ": cannot read the record " << zip_get_name(zip_->z, zip_uint64_t(index), 0);
    std::vector<uint8_t> bytes(st.size);
    zip_file_t* f = zip_fopen_index(zip_->z, zip_uint64_t(index), 0);
    const bool ok = f && zip_fread(f, bytes.data(), st.size) == zip_int64_t(st.size) && crc_checked_at_end(f);
    if (f) zip_fclose(f);
    if (!ok) LATTICE_FAIL() << path << ": the record " << st.name << " is truncated or corrupt (its CRC-32)";
    return bytes;
  };
  if (const zip_int64_t order = zip_name_locate(zip_->z, (prefix_ + "byteorder").c_str(), 0); order >= 0) {
    const std::vector<uint8_t> b = read_record(order);
    if (std::string(b.begin(), b.end()) != "little")
      LATTICE_FAIL() << path << ": saved on a big-endian machine (byteorder " << std::string(b.begin(), b.end()) << ")";
  }
  const std::vector<uint8_t> pickle = read_record(pkl);
  PickleHooks hooks;
  const std::string what = path + " (" + prefix_ + "data.pkl)";
  hooks.persistent_load = [&](const PyRef& pid) -> PyRef {
    // ('storage', torch.<Type>Storage, key, location, numel)
    if (!pid->is(PyValue::Kind::tuple) || pid->items.size() < 5 || !pid->items[0]->is(PyValue::Kind::string) ||
        pid->items[0]->text != "storage" || !pid->items[1]->is(PyValue::Kind::global) ||
        !pid->items[2]->is(PyValue::Kind::string) || !pid->items[4]->is(PyValue::Kind::integer))
      LATTICE_FAIL() << what << ": a persistent id that is not a torch storage: " << pid->describe();
    auto t = std::make_shared<TorchTensor>();
    const auto type = storage_types().find(pid->items[1]->name);
    if (type == storage_types().end())
      LATTICE_FAIL() << what << ": unknown storage type " << pid->items[1]->qualified_name();
    t->dtype = type->second.first;
    t->element_size = type->second.second;
    t->storage = pid->items[2]->text;
    t->storage_numel = pid->items[4]->integer;
    return opaque("storage", t);
  };
  hooks.reduce = [&](const PyRef& callable, const PyRef& args) -> PyRef {
    if (!callable->is(PyValue::Kind::global) || callable->text != "torch._utils") return nullptr;
    const std::string& fn = callable->name;
    if (fn == "_rebuild_parameter" || fn == "_rebuild_parameter_with_state") {  // (data, requires_grad, hooks, ...)
      if (args->items.empty() || !tensor(args->items[0])) LATTICE_FAIL() << what << ": " << fn << " of no tensor";
      return args->items[0];
    }
    if (fn != "_rebuild_tensor_v2" && fn != "_rebuild_tensor_v3") return nullptr;
    // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, dtype (v3)][, metadata])
    const std::vector<PyRef>& a = args->items;
    if (a.size() < 4 || !a[0]->is(PyValue::Kind::opaque) || a[0]->name != "storage" ||
        !a[1]->is(PyValue::Kind::integer))
      LATTICE_FAIL() << what << ": " << fn << " with arguments " << args->describe() << " that are not a tensor's";
    auto t = std::make_shared<TorchTensor>(*std::static_pointer_cast<TorchTensor>(a[0]->payload));
    if (fn == "_rebuild_tensor_v3") {
      if (a.size() < 7 || !a[6]->is(PyValue::Kind::global) || dtype_size(a[6]->name) == 0)
        LATTICE_FAIL() << what << ": _rebuild_tensor_v3 without a known dtype";
      const int size = dtype_size(a[6]->name);
      t->storage_numel = t->storage_numel * t->element_size / size;
      t->dtype = a[6]->name;
      t->element_size = size;
    }
    t->offset = a[1]->integer;
    t->shape = int_tuple(a[2], what);
    t->stride = int_tuple(a[3], what);
    if (t->shape.size() != t->stride.size())
      LATTICE_FAIL() << what << ": a tensor with " << t->shape.size() << " dims and " << t->stride.size() << " strides";
    return opaque("tensor", t);
  };
  root_ = unpickle(pickle.data(), pickle.size(), what, hooks);
}

TorchArchive::~TorchArchive() = default;

const TorchTensor* TorchArchive::tensor(const PyRef& v) {
  if (!v || !v->is(PyValue::Kind::opaque) || v->name != "tensor") return nullptr;
  return static_cast<const TorchTensor*>(v->payload.get());
}

std::optional<double> TorchArchive::number(const PyRef& v, const std::string& name) const {
  if (!v) return std::nullopt;
  if (v->is(PyValue::Kind::integer)) return double(v->integer);
  if (v->is(PyValue::Kind::floating)) return v->floating;
  if (const TorchTensor* t = tensor(v); t && t->numel() == 1) {
    float x = 0;
    read_float(*t, name, &x);
    return double(x);
  }
  LATTICE_FAIL() << path_ << ": " << name << " is " << v->describe() << ", not a number";
}

void TorchArchive::read_float(const TorchTensor& t, const std::string& name, float* out) const {
  const bool floating = t.dtype == "float32" || t.dtype == "bfloat16" || t.dtype == "float16" || t.dtype == "float64";
  if (!floating) LATTICE_FAIL() << path_ << ": tensor " << name << " is " << t.dtype << ", not floating point";
  if (!t.contiguous()) LATTICE_FAIL() << path_ << ": tensor " << name << " is not contiguous (its strides)";
  const int64_t n = t.numel();
  if (t.offset < 0 || t.offset + n > t.storage_numel)
    LATTICE_FAIL() << path_ << ": tensor " << name << " (" << n << " elements at " << t.offset
                   << ") lies outside its storage of " << t.storage_numel;
  const std::string record = prefix_ + "data/" + t.storage;
  const zip_int64_t index = zip_name_locate(zip_->z, record.c_str(), 0);
  if (index < 0) LATTICE_FAIL() << path_ << ": tensor " << name << "'s storage " << record << " is missing";
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(zip_->z, zip_uint64_t(index), 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE) ||
      st.size != uint64_t(t.storage_numel) * uint64_t(t.element_size))
    LATTICE_FAIL() << path_ << ": tensor " << name << "'s storage " << record << " holds " << st.size
                   << " bytes, not the " << t.storage_numel << " x " << t.element_size << " its pickle says";
  const size_t es = size_t(t.element_size);
  // fp32 is read straight into out; another dtype through a buffer of its bytes.
  const bool f32 = t.dtype == "float32";
  std::vector<uint8_t> buffer(f32 ? 0 : size_t(n) * es);
  uint8_t* bytes = f32 ? reinterpret_cast<uint8_t*>(out) : buffer.data();
  const size_t nbytes = size_t(n) * es;
  zip_file_t* f = zip_fopen_index(zip_->z, zip_uint64_t(index), 0);
  bool ok = f != nullptr;
  if (ok && t.offset > 0) {  // stored records seek; a compressed one is read through
    if (zip_fseek(f, zip_int64_t(t.offset) * zip_int64_t(es), SEEK_SET) != 0) {
      std::vector<uint8_t> skip(1 << 20);
      for (uint64_t left = uint64_t(t.offset) * es; ok && left > 0;) {
        const uint64_t k = std::min<uint64_t>(left, skip.size());
        ok = zip_fread(f, skip.data(), k) == zip_int64_t(k);
        left -= k;
      }
    }
  }
  if (ok) ok = zip_fread(f, bytes, nbytes) == zip_int64_t(nbytes);
  // The record's CRC-32: at its end when these bytes are the whole record, else once on the whole record (a view into
  // a storage that other tensors share: the distributed optimizer's buffer).
  const bool whole = t.offset == 0 && nbytes == st.size;
  if (ok && whole) ok = crc_checked_at_end(f);
  if (f) zip_fclose(f);
  if (!ok)
    LATTICE_FAIL() << path_ << ": tensor " << name << "'s storage " << record << " is truncated or corrupt (its CRC-32)";
  if (!whole) {
    std::lock_guard<std::mutex> lock(zip_->mu);
    if (zip_->verified.insert(zip_uint64_t(index)).second) {  // read through a window: records can be gigabytes
      std::vector<uint8_t> window(std::min<uint64_t>(st.size, 4 << 20));
      zip_file_t* w = zip_fopen_index(zip_->z, zip_uint64_t(index), 0);
      bool read = w != nullptr;
      for (uint64_t left = st.size; read && left > 0;) {
        const uint64_t k = std::min<uint64_t>(left, window.size());
        read = zip_fread(w, window.data(), k) == zip_int64_t(k);
        left -= k;
      }
      read = read && crc_checked_at_end(w);
      if (w) zip_fclose(w);
      if (!read) LATTICE_FAIL() << path_ << ": storage " << record << " is truncated or corrupt (its CRC-32)";
    }
  }
  if (f32) return;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = bytes + size_t(i) * es;
    if (t.dtype == "float64") {
      double d;
      std::memcpy(&d, p, 8);
      out[i] = float(d);
    } else {
      const uint16_t u = uint16_t(p[0] | (p[1] << 8));
      out[i] = t.dtype == "bfloat16" ? math::bf16_to_fp32(u) : math::fp16_to_fp32(u);
    }
  }
}

std::string TorchSaveWriter::add_storage(std::vector<uint8_t> bytes) {
  const uint64_t size = bytes.size();
  storages_.push_back(Storage{std::move(bytes), size, {}});
  return std::to_string(storages_.size() - 1);
}

std::string TorchSaveWriter::add_storage(uint64_t size, std::function<std::vector<uint8_t>()> produce) {
  storages_.push_back(Storage{{}, size, std::move(produce)});
  return std::to_string(storages_.size() - 1);
}

namespace {

// A libzip source whose bytes a producer makes when libzip opens it (while zip_close writes the archive) and
// drops when it closes it. An exception of the producer cannot cross libzip's C frames: it is kept in `error`
// and the source fails, which fails zip_close.
struct ProducedSource {
  uint64_t size;
  const std::function<std::vector<uint8_t>()>* produce;
  std::string* error;
  std::vector<uint8_t> bytes;
  uint64_t at = 0;
  zip_error_t zerr;

  static zip_int64_t callback(void* user, void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
    auto* s = static_cast<ProducedSource*>(user);
    switch (cmd) {
      case ZIP_SOURCE_OPEN:
        try {
          s->bytes = (*s->produce)();
          if (s->bytes.size() != s->size)
            LATTICE_FAIL() << "a storage made " << s->bytes.size() << " bytes, not " << s->size;
        } catch (const std::exception& e) {
          if (s->error->empty()) *s->error = e.what();
          zip_error_set(&s->zerr, ZIP_ER_READ, 0);
          return -1;
        }
        s->at = 0;
        return 0;
      case ZIP_SOURCE_READ: {
        const uint64_t n = std::min<uint64_t>(len, s->bytes.size() - s->at);
        std::memcpy(data, s->bytes.data() + s->at, n);
        s->at += n;
        return zip_int64_t(n);
      }
      case ZIP_SOURCE_CLOSE:
        std::vector<uint8_t>().swap(s->bytes);
        return 0;
      case ZIP_SOURCE_STAT: {
        auto* st = static_cast<zip_stat_t*>(data);
        zip_stat_init(st);
        st->size = s->size;
        st->comp_size = s->size;
        st->comp_method = ZIP_CM_STORE;
        st->valid |= ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD;
        return sizeof(zip_stat_t);
      }
      case ZIP_SOURCE_ERROR:
        return zip_error_to_data(&s->zerr, data, len);
      case ZIP_SOURCE_FREE:
        zip_error_fini(&s->zerr);
        delete s;
        return 0;
      case ZIP_SOURCE_SUPPORTS:
        return zip_source_make_command_bitmap(ZIP_SOURCE_OPEN, ZIP_SOURCE_READ, ZIP_SOURCE_CLOSE, ZIP_SOURCE_STAT,
                                              ZIP_SOURCE_ERROR, ZIP_SOURCE_FREE, -1);
      default:
        zip_error_set(&s->zerr, ZIP_ER_OPNOTSUPP, 0);
        return -1;
    }
  }
};

}  // namespace

void TorchSaveWriter::pickle_tensor(PickleWriter& w, const std::string& key, const std::string& storage_type,
                                    int64_t numel, const std::vector<int64_t>& shape) {
  w.global("torch._utils", "_rebuild_tensor_v2").mark();
  w.mark().string("storage").global("torch", storage_type).string(key).string("cpu").integer(numel).tuple();
  w.persistent_id().integer(0);
  w.mark();
  for (int64_t d : shape) w.integer(d);
  w.tuple().mark();
  int64_t stride = 1;
  std::vector<int64_t> strides(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  for (int64_t s : strides) w.integer(s);
  w.tuple().boolean(false).global("collections", "OrderedDict").empty_tuple().reduce().tuple().reduce();
}

void TorchSaveWriter::write(const std::string& path, const std::string& prefix, const std::string& pickle) const {
  const std::string tmp = path + ".tmp";
  int err = 0;
  zip_t* z = zip_open(tmp.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  if (!z) LATTICE_FAIL() << tmp << ": cannot create (libzip error " << err << ")";
  static const char version[] = "3\n", byteorder[] = "little";
  std::string produce_error;  // a producer's exception, kept across libzip's frames
  auto add = [&](const std::string& name, const void* data, size_t n, const Storage* produced = nullptr) {
    zip_source_t* src = nullptr;
    if (produced) {
      auto* s = new ProducedSource{produced->size, &produced->produce, &produce_error, {}, 0, {}};
      zip_error_init(&s->zerr);
      src = zip_source_function(z, &ProducedSource::callback, s);
      if (!src) {
        zip_error_fini(&s->zerr);
        delete s;
      }
    } else {
      src = zip_source_buffer(z, data, n, 0);
    }
    const zip_int64_t index = src ? zip_file_add(z, (prefix + "/" + name).c_str(), src, ZIP_FL_ENC_UTF_8) : -1;
    if (index < 0) {
      if (src) zip_source_free(src);
      const std::string why = zip_strerror(z);
      zip_discard(z);
      std::filesystem::remove(tmp);
      LATTICE_FAIL() << path << ": cannot add " << name << ": " << why;
    }
    zip_set_file_compression(z, zip_uint64_t(index), ZIP_CM_STORE, 0);
    zip_file_set_mtime(z, zip_uint64_t(index), 0, 0);
  };
  add("data.pkl", pickle.data(), pickle.size());
  for (size_t i = 0; i < storages_.size(); ++i) {
    const Storage& s = storages_[i];
    add("data/" + std::to_string(i), s.bytes.data(), s.bytes.size(), s.produce ? &s : nullptr);
  }
  add("version", version, 2);
  add("byteorder", byteorder, 6);
  if (zip_close(z) != 0) {
    const std::string why = produce_error.empty() ? zip_strerror(z) : produce_error;
    zip_discard(z);
    std::filesystem::remove(tmp);
    if (!produce_error.empty()) LATTICE_FAIL() << produce_error;
    LATTICE_FAIL() << path << ": cannot write: " << why;
  }
  fsync_file(tmp);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) LATTICE_FAIL() << path << ": cannot rename " << tmp << " into place: " << ec.message();
}

}  // namespace lattice
