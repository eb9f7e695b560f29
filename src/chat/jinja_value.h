// The value type of the Jinja engine: Python's values as templates see them (undefined, None, bool, int, float,
// str, list/tuple, dict, namespace-like objects, callables), with Python's str(), repr(), truthiness and ==.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace lattice::jinja {

// A Python error while rendering (TypeError, UndefinedError, ...). The renderer prefixes "<name> line L: ".
class RuntimeError : public std::runtime_error {
 public:
  explicit RuntimeError(const std::string& msg) : std::runtime_error(msg) {}
};

// raise_exception(msg) from a template: reaches the user as "<name>: <msg>", without a line.
class RaisedException : public std::runtime_error {
 public:
  explicit RaisedException(const std::string& msg) : std::runtime_error(msg) {}
};

class Value;
class Dict;

// The arguments of a call, as written: f(a, b, key=c).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using NativeFunction = std::function<Value(const CallArgs&)>;

// What a list-like value prints as: [1, 2], (1, 2), dict_items([...]), ...
enum class SequenceKind { kList, kTuple, kDictItems, kDictKeys, kDictValues };

struct ListData {
  std::vector<Value> items;
  SequenceKind seq_kind = SequenceKind::kList;
};

// An object with attributes: namespace(...) (assignable with {% set ns.x = ... %}) and the loop object.
struct ObjectData;

struct CallableData {
  std::string name;
  NativeFunction fn;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kObject, kCallable };

  Value();  // undefined, named nothing
  Value(bool b);
  Value(int v);
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s);
  Value(std::vector<Value> items, SequenceKind seq_kind = SequenceKind::kList);
  Value(Dict d);

  // Undefined with the UndefinedError message that using it raises, e.g. "'x' is undefined".
  static Value undefined(std::string hint);
  static Value none();
  static Value object(std::shared_ptr<ObjectData> obj);
  static Value function(std::string name, NativeFunction fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // int, float or bool (Python's bool is an int)
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;   // int or bool
  double as_float() const;  // int, float or bool
  const std::string& as_string() const;
  const std::vector<Value>& items() const;  // list/tuple
  SequenceKind seq_kind() const;
  const Dict& dict() const;
  ObjectData& object() const;
  const CallableData& callable() const;
  const std::string& undefined_hint() const;  // the UndefinedError message
  // Throws the UndefinedError of an undefined value.
  [[noreturn]] void throw_undefined() const;

  bool truthy() const;
  std::string str() const;        // Python's str(); undefined is ""
  std::string repr() const;       // Python's repr()
  std::string type_name() const;  // Python's type name: 'str', 'int', 'NoneType', 'list', 'dict', ...

 private:
  Kind kind_;
  std::variant<std::monostate, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const ListData>, std::shared_ptr<const Dict>, std::shared_ptr<ObjectData>,
               std::shared_ptr<const CallableData>>
      data_;
};

// Python's == (1 == 1.0 == True, deep for lists and dicts; undefined equals only undefined).
bool equals(const Value& a, const Value& b);

// An insertion-ordered dict, like Python's. Lookup is linear: template dicts are small.
class Dict {
 public:
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(Value key, Value value);     // replaces the value of an equal key, or appends
  void append(Value key, Value value);  // for a key known to be new (JSON objects)
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<Value, Value>> entries_;
};

struct ObjectData {
  std::string type_name;    // "Namespace", "LoopContext"
  bool assignable = false;  // namespace: {% set ns.x = ... %} allowed
  Dict attrs;
};

// What `for x in v` iterates: list items, dict keys, string characters; undefined gives nothing.
std::vector<Value> iterate(const Value& v);
// len(v) for strings (code points), lists, dicts; throws for others.
int64_t length(const Value& v);

// UTF-8 helpers: strings count and index code points as Python does.
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);
std::string utf8_encode(uint32_t code_point);
uint32_t utf8_decode(const std::string& one_char);  // one character of utf8_chars()

// Python's repr of a float: shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf", "nan".
std::string float_repr(double v);

// Converts the render variables (nlohmann::json or nlohmann::ordered_json) to values; dicts keep the JSON's order.
template <typename Json>
Value from_json(const Json& j);

}  // namespace lattice::jinja

namespace lattice::jinja {

template <typename Json>
Value from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value(double(u));
      return Value(int64_t(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.append(Value(it.key()), from_json(it.value()));
      return Value(std::move(d));
    }
    default:
      return Value::none();  // binary and discarded values have no Python equivalent here
  }
}

}  // namespace lattice::jinja
