// What expressions do to values, with Python's and jinja2's semantics: operators, attribute and item access,
// calls, the methods of str/dict/list, filters, tests and globals. Errors throw jinja::RuntimeError (or
// RaisedException for raise_exception); the renderer adds the template name and line.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace lattice::jinja {

// ---- operators (jinja_ops.cpp) ----
Value binary_op(Op op, const Value& a, const Value& b);  // + - * / // % ** ~
Value unary_op(Op op, const Value& a);                   // - + not
bool compare(Op op, const Value& a, const Value& b);     // == != < <= > >= in, not in
bool less_than(const Value& a, const Value& b);          // Python's a < b; TypeError across kinds
// jinja2's getattr: the attribute (a method of str/dict/list) first, then the item; a missing one is undefined.
Value get_attr(const Value& obj, const std::string& name);
// jinja2's getitem: the item first, then for a string key the attribute.
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
Value call(const Value& callee, const CallArgs& args);
// Python's printf-style `fmt % args` (args a tuple, a dict for %(name)s, or one value).
std::string percent_format(const std::string& fmt, const Value& args);

// ---- methods and globals (jinja_methods.cpp) ----
enum class MethodKind { kNone, kSafe, kUnsafe };  // kUnsafe: exists, but the immutable sandbox forbids it
MethodKind method_kind(const Value& obj, const std::string& name);
Value call_method(const Value& obj, const std::string& name, const CallArgs& args);
// range, namespace, dict, raise_exception, strftime_now; null when `name` is none of them.
const Value* find_global(const std::string& name);

// ---- filters and tests (jinja_filters.cpp) ----
bool has_filter(const std::string& name);
Value apply_filter(const std::string& name, const Value& input, const CallArgs& args);
bool has_test(const std::string& name);
bool apply_test(const std::string& name, const Value& input, const CallArgs& args);

// Python's str methods that templates and filters share.
// Python's str.lower()/upper() (simple case mapping: no "ß" -> "SS").
std::string str_lower(const std::string& s);
std::string str_upper(const std::string& s);
// jinja2's title filter: the first character of each word upper, the rest lower; words split at whitespace
// and -({[<.
std::string jinja_title(const std::string& s);
std::string python_strip(const std::string& s, const Value& chars, bool left, bool right);

// ---- argument binding ----
struct Param {
  const char* name;
  Value def = Value();
  bool required = false;
};
inline Param required(const char* name) { return Param{name, Value(), true}; }

// Binds a call's arguments to parameters as Python does: positionally first, then by keyword; missing ones
// take their defaults. `function` names the callee in errors ("indent() got an unexpected keyword argument").
class BoundArgs {
 public:
  BoundArgs(const std::string& function, const CallArgs& args, std::initializer_list<Param> params);
  const Value& operator[](size_t i) const { return values_[i]; }
  bool given(size_t i) const { return given_[i]; }

 private:
  std::vector<Value> values_;
  std::vector<bool> given_;
};

}  // namespace lattice::jinja
