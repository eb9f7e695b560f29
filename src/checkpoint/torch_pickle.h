// Python pickles as PyTorch's torch.save writes them (protocol 2; the opcodes of protocols 0-5 that
// pickle's C implementation emits for dicts, lists, tuples, numbers, strings, bytes and objects).
//
// Nothing is executed: a global (GLOBAL, STACK_GLOBAL) is a name, and REDUCE / NEWOBJ / BUILD make
// an Object recording the callable, its arguments and its state, except where `hooks.reduce`
// builds the value itself (torch's tensors: checkpoint/torch_archive.h). collections.OrderedDict()
// is a Dict. A persistent id (BINPERSID: torch's storages) is handed to `hooks.persistent_load`.
// Malformed input (an unknown opcode, a truncated stream, a stack or memo out of range) is an
// error naming `what` and the byte offset.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lattice {

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

struct PyValue {
  enum class Kind { none, boolean, integer, floating, string, bytes, list, tuple, dict, global, object, opaque };
  Kind kind = Kind::none;
  bool boolean = false;
  int64_t integer = 0;
  double floating = 0;
  std::string text;                                // string, bytes; a global's module
  std::string name;                                // a global's name
  std::vector<PyRef> items;                        // list, tuple
  std::vector<std::pair<PyRef, PyRef>> entries;    // dict (insertion order); an object's SETITEMS
  PyRef callable, args, state;                     // object: the global called, its argument tuple, BUILD's state
  std::shared_ptr<void> payload;                   // opaque: what a hook made (a torch tensor)

  bool is(Kind k) const { return kind == k; }
  // A global's or an object's callable's "module.name" ("" otherwise).
  std::string qualified_name() const;
  // Dict entry by string key (an object's BUILD state when it is a dict: argparse.Namespace); null when absent.
  PyRef get(const std::string& key) const;
  // Short description for error messages ("int 3", "str 'x'", "dict of 4", "argparse.Namespace").
  std::string describe() const;
};

PyRef py_none();
PyRef py_int(int64_t v);
PyRef py_string(std::string s);

struct PickleHooks {
  // BINPERSID's id (torch: the tuple ('storage', type, key, location, numel)).
  std::function<PyRef(const PyRef& pid)> persistent_load;
  // REDUCE of a global: the value, or null to record a plain Object.
  std::function<PyRef(const PyRef& callable, const PyRef& args)> reduce;
};

// Unpickles `data` (n bytes); `what` names the source in errors.
PyRef unpickle(const uint8_t* data, size_t n, const std::string& what, const PickleHooks& hooks = {});

// Writes a pickle (protocol 2, as torch.save does) opcode by opcode: the caller pushes values as the
// unpickler will rebuild them (mark() ... tuple(), global(...) args reduce(), ...). No memo.
class PickleWriter {
 public:
  PickleWriter();
  PickleWriter& none();
  PickleWriter& boolean(bool v);
  PickleWriter& integer(int64_t v);
  PickleWriter& floating(double v);
  PickleWriter& string(const std::string& utf8);
  PickleWriter& global(const std::string& module, const std::string& name);
  PickleWriter& mark();
  PickleWriter& tuple();         // the values since mark() as a tuple
  PickleWriter& empty_tuple();
  PickleWriter& empty_dict();
  PickleWriter& empty_list();
  PickleWriter& set_items();     // the key, value pairs since mark() into the dict below the mark
  PickleWriter& append_items();  // the values since mark() onto the list below the mark
  PickleWriter& reduce();        // callable args -> callable(*args)
  PickleWriter& newobj();        // cls args -> cls.__new__(cls, *args)
  PickleWriter& build();         // obj state -> obj with state
  PickleWriter& persistent_id(); // pid -> persistent_load(pid)
  // The pickle, with its STOP.
  std::string finish();

 private:
  std::string out_;
};

}  // namespace lattice
