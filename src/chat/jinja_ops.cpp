// Operators, attribute/item access, slicing, calls and %-formatting with Python's semantics.
#include <cmath>
#include <cstdio>

#include "chat/jinja_builtins.h"

namespace lattice::jinja {
namespace {

const char* op_symbol(Op op) {
  switch (op) {
    case Op::kAdd:
      return "+";
    case Op::kSub:
      return "-";
    case Op::kMul:
      return "*";
    case Op::kDiv:
      return "/";
    case Op::kFloorDiv:
      return "//";
    case Op::kMod:
      return "%";
    case Op::kPow:
      return "** or pow()";
    case Op::kLt:
      return "<";
    case Op::kLe:
      return "<=";
    case Op::kGt:
      return ">";
    case Op::kGe:
      return ">=";
    default:
      return "?";
  }
}

[[noreturn]] void unsupported(Op op, const Value& a, const Value& b) {
  throw RuntimeError(std::string("unsupported operand type(s) for ") + op_symbol(op) + ": '" + a.type_name() +
                     "' and '" + b.type_name() + "'");
}

bool is_int_like(const Value& v) { return v.is_int() || v.is_bool(); }

[[noreturn]] void overflow() { throw RuntimeError("integer overflow (values beyond 64 bits are not supported)"); }

// Python's float divmod: the floored quotient and a remainder with the divisor's sign.
std::pair<double, double> float_divmod(double x, double y) {
  if (y == 0.0) throw RuntimeError("float division by zero");
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0.0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floordiv;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, x / y);
  }
  return {floordiv, mod};
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value(std::move(out), seq.seq_kind());
}

Value arithmetic(Op op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) unsupported(op, a, b);
  if (is_int_like(a) && is_int_like(b) && op != Op::kDiv) {
    int64_t x = a.as_int(), y = b.as_int(), r = 0;
    switch (op) {
      case Op::kAdd:
        if (__builtin_add_overflow(x, y, &r)) overflow();
        return Value(r);
      case Op::kSub:
        if (__builtin_sub_overflow(x, y, &r)) overflow();
        return Value(r);
      case Op::kMul:
        if (__builtin_mul_overflow(x, y, &r)) overflow();
        return Value(r);
      case Op::kFloorDiv:
      case Op::kMod: {
        if (y == 0)
          throw RuntimeError(op == Op::kMod ? "integer modulo by zero" : "integer division or modulo by zero");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors toward negative infinity
          q -= 1;
          m += y;
        }
        return Value(op == Op::kMod ? m : q);
      }
      case Op::kPow: {
        if (y < 0) return Value(std::pow(double(x), double(y)));
        if (x == 0 || x == 1) return Value(y == 0 ? int64_t(1) : x);
        if (x == -1) return Value(y % 2 ? int64_t(-1) : int64_t(1));
        int64_t result = 1;  // |x| >= 2: overflows within 63 steps
        for (int64_t i = 0; i < y; ++i)
          if (__builtin_mul_overflow(result, x, &result)) overflow();
        return Value(result);
      }
      default:
        break;
    }
  }
  double x = a.as_float(), y = b.as_float();
  switch (op) {
    case Op::kAdd:
      return Value(x + y);
    case Op::kSub:
      return Value(x - y);
    case Op::kMul:
      return Value(x * y);
    case Op::kDiv:
      if (y == 0.0) throw RuntimeError("division by zero");
      return Value(x / y);
    case Op::kFloorDiv:
      return Value(float_divmod(x, y).first);
    case Op::kMod:
      return Value(float_divmod(x, y).second);
    case Op::kPow:
      if (x == 0.0 && y < 0) throw RuntimeError("0.0 cannot be raised to a negative power");
      return Value(std::pow(x, y));
    default:
      unsupported(op, a, b);
  }
}

}  // namespace

Value binary_op(Op op, const Value& a, const Value& b) {
  if (op == Op::kConcat) return Value(a.str() + b.str());
  if (a.is_undefined()) a.throw_undefined();
  if (b.is_undefined()) b.throw_undefined();
  switch (op) {
    case Op::kAdd:
      if (a.is_string()) {
        if (!b.is_string()) throw RuntimeError("can only concatenate str (not \"" + b.type_name() + "\") to str");
        return Value(a.as_string() + b.as_string());
      }
      if (a.is_list()) {
        if (!b.is_list() || b.seq_kind() != a.seq_kind())
          throw RuntimeError("can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " +
                             a.type_name());
        std::vector<Value> out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return Value(std::move(out), a.seq_kind());
      }
      break;
    case Op::kMul:
      if ((a.is_string() || a.is_list()) && is_int_like(b)) return repeat(a, b.as_int());
      if ((b.is_string() || b.is_list()) && is_int_like(a)) return repeat(b, a.as_int());
      break;
    case Op::kMod:
      if (a.is_string()) return Value(percent_format(a.as_string(), b));
      break;
    default:
      break;
  }
  return arithmetic(op, a, b);
}

Value unary_op(Op op, const Value& a) {
  if (op == Op::kNot) return Value(!a.truthy());
  if (a.is_undefined()) a.throw_undefined();
  if (is_int_like(a)) return Value(op == Op::kNeg ? -a.as_int() : a.as_int());
  if (a.is_float()) return Value(op == Op::kNeg ? -a.as_float() : a.as_float());
  throw RuntimeError(std::string("bad operand type for unary ") + (op == Op::kNeg ? "-" : "+") + ": '" + a.type_name() +
                     "'");
}

namespace {
// -1, 0, 1 as Python orders a and b; throws a TypeError naming `op` for values without an order.
int order(Op op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.throw_undefined();
  if (b.is_undefined()) b.throw_undefined();
  if (a.is_number() && b.is_number()) {
    if (is_int_like(a) && is_int_like(b)) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    double x = a.as_float(), y = b.as_float();
    return x < y ? -1 : x > y ? 1 : 0;  // nan: neither, as Python (all comparisons false except !=)
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.seq_kind() == b.seq_kind()) {
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return order(op, x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw RuntimeError(std::string("'") + op_symbol(op) + "' not supported between instances of '" + a.type_name() +
                     "' and '" + b.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string())
        throw RuntimeError("'in <string>' requires string as left operand, not " + item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.items())
        if (equals(v, item)) return true;
      return false;
    case Value::Kind::kDict:
      return container.dict().find(item) != nullptr;
    default:
      throw RuntimeError("argument of type '" + container.type_name() + "' is not iterable");
  }
}
}  // namespace

bool less_than(const Value& a, const Value& b) { return order(Op::kLt, a, b) < 0; }

bool compare(Op op, const Value& a, const Value& b) {
  switch (op) {
    case Op::kEq:
      return equals(a, b);
    case Op::kNe:
      return !equals(a, b);
    case Op::kIn:
      return contains(b, a);
    case Op::kNotIn:
      return !contains(b, a);
    default:
      break;
  }
  if (a.is_float() && std::isnan(a.as_float())) return false;
  if (b.is_float() && std::isnan(b.as_float())) return false;
  int c = order(op, a, b);
  switch (op) {
    case Op::kLt:
      return c < 0;
    case Op::kLe:
      return c <= 0;
    case Op::kGt:
      return c > 0;
    default:
      return c >= 0;
  }
}

namespace {

// jinja2's object_type_repr: "dict object", "None", "str object", ...
std::string object_type(const Value& v) { return v.is_none() ? "None" : v.type_name() + " object"; }

Value no_attribute(const Value& obj, const std::string& name) {
  std::string what = "'";  // (appended, not "'" + ...: GCC 12 warns falsely of an overlapping memcpy there)
  what += object_type(obj);
  what += "' has no attribute '";
  what += name;
  what += "'";
  return Value::undefined(what);
}

Value no_element(const Value& obj, const Value& key) {
  return Value::undefined(object_type(obj) + " has no element " + key.repr());
}

Value bound_method(const Value& obj, const std::string& name) {
  return Value::function(name, [obj, name](const CallArgs& args) { return call_method(obj, name, args); });
}

// The attribute part of jinja2's getattr: a method, or an object's attribute; null Value when there is none.
bool find_attribute(const Value& obj, const std::string& name, Value& out) {
  if (obj.is_object()) {
    if (const Value* v = obj.object().attrs.find(name)) {
      out = *v;
      return true;
    }
    return false;
  }
  switch (method_kind(obj, name)) {
    case MethodKind::kSafe:
      out = bound_method(obj, name);
      return true;
    case MethodKind::kUnsafe:  // as the sandbox: undefined, and calling it names the reason
      out = Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
      return true;
    default:
      return false;
  }
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) obj.throw_undefined();
  Value out;
  if (find_attribute(obj, name, out)) return out;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(name)) return *v;
  }
  return no_attribute(obj, name);
}

namespace {
// Python's index normalization: negative counts from the end; false when out of range.
bool normalize_index(const Value& key, size_t size, size_t& out) {
  int64_t i = key.as_int();
  if (i < 0) i += int64_t(size);
  if (i < 0 || i >= int64_t(size)) return false;
  out = size_t(i);
  return true;
}
}  // namespace

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.throw_undefined();
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && is_int_like(key)) {
    size_t i;
    if (obj.is_list()) {
      if (normalize_index(key, obj.items().size(), i)) return obj.items()[i];
    } else if (obj.as_string().size() == utf8_length(obj.as_string())) {  // ASCII: bytes are characters
      if (normalize_index(key, obj.as_string().size(), i)) return Value(obj.as_string().substr(i, 1));
    } else {
      auto chars = utf8_chars(obj.as_string());
      if (normalize_index(key, chars.size(), i)) return Value(chars[i]);
    }
    return no_element(obj, key);
  }
  if (!key.is_string()) return no_element(obj, key);
  Value out;
  if (find_attribute(obj, key.as_string(), out)) return out;
  return no_attribute(obj, key.as_string());
}

namespace {
// Python's slice.indices(): the positions a slice selects in a sequence of `size`.
std::vector<size_t> slice_positions(size_t size, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto as_index = [](const Value& v, const char* what) {
    if (!is_int_like(v)) throw RuntimeError(std::string("slice ") + what + " must be an integer or None");
    return v.as_int();
  };
  int64_t n = int64_t(size);
  int64_t step = step_v.is_none() || step_v.is_undefined() ? 1 : as_index(step_v, "step");
  if (step == 0) throw RuntimeError("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t def) {
    if (v.is_none() || v.is_undefined()) return def;
    int64_t i = as_index(v, "indices");
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  int64_t start = clamp(start_v, step < 0 ? n - 1 : 0);
  int64_t stop = clamp(stop_v, step < 0 ? -1 : n);
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(size_t(i));
  return out;
}
}  // namespace

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) obj.throw_undefined();
  if (obj.is_list()) {
    std::vector<Value> out;
    for (size_t i : slice_positions(obj.items().size(), start, stop, step)) out.push_back(obj.items()[i]);
    return Value(std::move(out), obj.seq_kind() == SequenceKind::kTuple ? SequenceKind::kTuple : SequenceKind::kList);
  }
  if (obj.is_string()) {
    auto chars = utf8_chars(obj.as_string());
    std::string out;
    for (size_t i : slice_positions(chars.size(), start, stop, step)) out += chars[i];
    return Value(std::move(out));
  }
  throw RuntimeError("'" + obj.type_name() + "' object is not subscriptable");
}

Value call(const Value& callee, const CallArgs& args) {
  if (callee.is_callable()) return callee.callable().fn(args);
  if (callee.is_undefined()) callee.throw_undefined();
  throw RuntimeError("'" + callee.type_name() + "' object is not callable");
}

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const Value* mapping = args.is_dict() ? &args : nullptr;
  if (args.is_list() && args.seq_kind() == SequenceKind::kTuple) {
    positional = args.items();
  } else {
    positional.push_back(args);
  }
  size_t next_arg = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw RuntimeError("incomplete format");
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) throw RuntimeError("incomplete format key");
      if (!mapping) throw RuntimeError("format requires a mapping");
      arg = mapping->dict().find(fmt.substr(i + 1, close - i - 1));
      if (!arg) throw RuntimeError("KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("#0- +").find(fmt[i]) != std::string_view::npos) flags += fmt[i++];
    int width = 0, precision = -1;
    while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') width = width * 10 + (fmt[i++] - '0');
    if (i < fmt.size() && fmt[i] == '.') {
      precision = 0;
      while (++i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') precision = precision * 10 + (fmt[i] - '0');
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw RuntimeError("incomplete format");
    char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!arg) {
      if (next_arg >= positional.size()) throw RuntimeError("not enough arguments for format string");
      arg = &positional[next_arg++];
    }
    bool left = flags.find('-') != std::string::npos;
    std::string text;
    if (conv == 's' || conv == 'r' || conv == 'a') {
      text = conv == 's' ? arg->str() : arg->repr();
      if (precision >= 0) {
        auto chars = utf8_chars(text);
        if (chars.size() > size_t(precision)) {
          text.clear();
          for (int k = 0; k < precision; ++k) text += chars[size_t(k)];
        }
      }
    } else if (std::string_view("diouxXeEfFgGc").find(conv) != std::string_view::npos) {
      if (!arg->is_number()) {
        throw RuntimeError(std::string("%") + conv + " format: a " + (conv == 'c' ? "int or char" : "real number") +
                           " is required, not " + arg->type_name());
      }
      std::string spec = "%";
      spec += flags;
      if (width) spec += std::to_string(width);
      if (precision >= 0) {
        spec += '.';
        spec += std::to_string(precision);
      }
      char buf[512];
      if (std::string_view("eEfFgG").find(conv) != std::string_view::npos) {
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), arg->as_float());
      } else if (conv == 'c') {
        std::snprintf(buf, sizeof buf, "%s", utf8_encode(uint32_t(arg->as_int())).c_str());
      } else {
        int64_t v = arg->is_float() ? int64_t(arg->as_float()) : arg->as_int();
        char c = conv == 'i' || conv == 'u' ? 'd' : conv;
        if (v < 0 && c != 'd') {  // Python prints -ff where C would print the two's complement
          std::string digits_spec = flags.find('#') != std::string::npos ? "%#" : "%";
          if (precision >= 0) {
            digits_spec += '.';
            digits_spec += std::to_string(precision);
          }
          digits_spec += "ll";
          digits_spec += c;
          std::snprintf(buf, sizeof buf, digits_spec.c_str(), (unsigned long long)(-v));
          std::string s = std::string("-") + buf;
          size_t len = s.size();
          if (size_t(width) > len) {
            if (left) {
              s += std::string(size_t(width) - len, ' ');
            } else if (flags.find('0') != std::string::npos) {
              s.insert(1, std::string(size_t(width) - len, '0'));
            } else {
              s.insert(0, std::string(size_t(width) - len, ' '));
            }
          }
          out += s;
          continue;
        }
        std::snprintf(buf, sizeof buf, (spec + "ll" + c).c_str(), (long long)v);
      }
      out += buf;
      continue;
    } else {
      throw RuntimeError(std::string("unsupported format character '") + conv + "'");
    }
    size_t len = utf8_length(text);
    std::string pad = size_t(width) > len ? std::string(size_t(width) - len, ' ') : "";
    out += left ? text + pad : pad + text;
  }
  if (!used_mapping && !mapping && next_arg < positional.size())
    throw RuntimeError("not all arguments converted during string formatting");
  return out;
}

BoundArgs::BoundArgs(const std::string& function, const CallArgs& args, std::initializer_list<Param> params)
    : values_(params.size()), given_(params.size(), false) {
  if (args.positional.size() > params.size())
    throw RuntimeError(function + "() takes at most " + std::to_string(params.size()) + " argument(s) (" +
                       std::to_string(args.positional.size()) + " given)");
  for (size_t i = 0; i < args.positional.size(); ++i) {
    values_[i] = args.positional[i];
    given_[i] = true;
  }
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (const Param& p : params) {
      if (key == p.name) break;
      ++i;
    }
    if (i == params.size()) throw RuntimeError(function + "() got an unexpected keyword argument '" + key + "'");
    if (given_[i]) throw RuntimeError(function + "() got multiple values for argument '" + key + "'");
    values_[i] = value;
    given_[i] = true;
  }
  size_t i = 0;
  for (const Param& p : params) {
    if (!given_[i]) {
      if (p.required) throw RuntimeError(function + "() missing required argument '" + std::string(p.name) + "'");
      values_[i] = p.def;
    }
    ++i;
  }
}

}  // namespace lattice::jinja
