// jinja2's builtin filters and tests, plus transformers' tojson (json.dumps with ensure_ascii=False).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "chat/jinja_builtins.h"

namespace lattice::jinja {
namespace {

using FilterFn = Value (*)(const Value& input, const CallArgs& args);
using TestFn = bool (*)(const Value& input, const CallArgs& args);

BoundArgs bind(const char* filter, const CallArgs& args, std::initializer_list<Param> params) {
  return BoundArgs(filter, args, params);
}

// ---- helpers shared by filters ----

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0, each with getitem semantics.
Value lookup_path(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  Value v = item;
  std::string path = attribute.str();
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = get_item(v, digits ? Value(int64_t(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// The sort key of jinja2's ignore_case: strings lower-cased.
Value fold_case(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(str_lower(v.as_string())) : v;
}

// The key of an item for sort/min/max/unique: optional attribute path(s) ("a,b" gives a tuple), case folding.
Value sort_key(const Value& item, const Value& attribute, bool case_sensitive, bool multi) {
  if (attribute.is_none() || attribute.is_undefined()) return fold_case(item, case_sensitive);
  if (multi && attribute.is_string() && attribute.as_string().find(',') != std::string::npos) {
    std::vector<Value> keys;
    std::string attrs = attribute.as_string();
    for (size_t start = 0;;) {
      size_t comma = attrs.find(',', start);
      keys.push_back(fold_case(lookup_path(item, Value(attrs.substr(start, comma - start))), case_sensitive));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return Value(std::move(keys), SequenceKind::kTuple);
  }
  return fold_case(lookup_path(item, attribute), case_sensitive);
}

std::vector<Value> sorted(std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Python's sort is stable, and reverse=True keeps equal items in their order.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? less_than(keys[b], keys[a]) : less_than(keys[a], keys[b]);
  });
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

// ---- tojson: Python's json.dumps ----

struct JsonStyle {
  bool ensure_ascii = false;
  bool pretty = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (const std::string& ch : utf8_chars(s)) {
    uint32_t c = utf8_decode(ch);
    char buf[16];
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {  // a surrogate pair
            uint32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
          }
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string json_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  return float_repr(v);
}

[[noreturn]] void not_serializable(const Value& v) {
  throw RuntimeError("Object of type " + v.type_name() + " is not JSON serializable");
}

void to_json(const Value& v, const JsonStyle& style, int level, std::string& out) {
  auto newline = [&](int lvl) {
    if (!style.pretty) return;
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += style.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat:
      out += json_float(v.as_float());
      return;
    case Value::Kind::kString:
      json_string(v.as_string(), style.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      if (v.seq_kind() != SequenceKind::kList && v.seq_kind() != SequenceKind::kTuple) not_serializable(v);
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const Value& item : v.items()) {
        if (!first) out += style.item_sep;
        first = false;
        newline(level + 1);
        to_json(item, style, level + 1, out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict().size() == 0) {
        out += "{}";
        return;
      }
      std::vector<std::pair<Value, Value>> entries = v.dict().entries();
      if (style.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return less_than(a.first, b.first); });
      }
      out += '{';
      bool first = true;
      for (const auto& [key, value] : entries) {
        std::string k;
        switch (key.kind()) {  // json.dumps converts these keys to strings
          case Value::Kind::kString:
            k = key.as_string();
            break;
          case Value::Kind::kInt:
            k = std::to_string(key.as_int());
            break;
          case Value::Kind::kFloat:
            k = json_float(key.as_float());
            break;
          case Value::Kind::kBool:
            k = key.as_bool() ? "true" : "false";
            break;
          case Value::Kind::kNone:
            k = "null";
            break;
          default:
            throw RuntimeError("keys must be str, int, float, bool or None, not " + key.type_name());
        }
        if (!first) out += style.item_sep;
        first = false;
        newline(level + 1);
        json_string(k, style.ensure_ascii, out);
        out += style.key_sep;
        to_json(value, style, level + 1, out);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      not_serializable(v);
  }
}

Value f_tojson(const Value& input, const CallArgs& args) {
  BoundArgs a = bind("tojson", args,
                     {{"ensure_ascii", Value(false)},
                      {"indent", Value::none()},
                      {"separators", Value::none()},
                      {"sort_keys", Value(false)}});
  JsonStyle style;
  style.ensure_ascii = a[0].truthy();
  if (!a[1].is_none()) {
    style.pretty = true;
    style.item_sep = ",";
    if (a[1].is_string()) {
      style.indent = a[1].as_string();
    } else if (a[1].is_int()) {
      style.indent = std::string(size_t(std::max<int64_t>(0, a[1].as_int())), ' ');
    } else {
      throw RuntimeError("tojson: indent must be an int or a str");
    }
  }
  if (!a[2].is_none()) {
    if (!a[2].is_list() || a[2].items().size() != 2 || !a[2].items()[0].is_string() || !a[2].items()[1].is_string())
      throw RuntimeError("tojson: separators must be a pair of strings");
    style.item_sep = a[2].items()[0].as_string();
    style.key_sep = a[2].items()[1].as_string();
  }
  style.sort_keys = a[3].truthy();
  std::string out;
  to_json(input, style, 0, out);
  return Value(std::move(out));
}

// ---- filters ----

Value f_abs(const Value& v, const CallArgs& args) {
  bind("abs", args, {});
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  throw RuntimeError("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_attr(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("attr", args, {required("name")});
  std::string name = a[0].str();
  // An attribute only: unlike `.name`, no fallback to the dict's item.
  if (v.is_dict() && method_kind(v, name) == MethodKind::kNone)
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  return get_attr(v, name);
}

Value f_capitalize(const Value& v, const CallArgs& args) {
  bind("capitalize", args, {});
  return call_method(Value(v.str()), "capitalize", {});
}

Value f_center(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("center", args, {{"width", Value(80)}});
  std::string s = v.str();
  int64_t len = int64_t(utf8_length(s)), width = a[0].as_int();
  if (width <= len) return Value(s);
  int64_t pad = width - len, left = pad / 2 + (pad & width & 1);  // CPython's str.center
  return Value(std::string(size_t(left), ' ') + s + std::string(size_t(pad - left), ' '));
}

Value f_default(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("default", args, {{"default_value", Value("")}, {"boolean", Value(false)}});
  if (v.is_undefined() || (a[1].truthy() && !v.truthy())) return a[0];
  return v;
}

Value f_dictsort(const Value& v, const CallArgs& args) {
  BoundArgs a =
      bind("dictsort", args, {{"case_sensitive", Value(false)}, {"by", Value("key")}, {"reverse", Value(false)}});
  if (!v.is_dict()) throw RuntimeError("You can only sort by either \"key\" or \"value\" of a dict");
  std::string by = a[1].str();
  if (by != "key" && by != "value") throw RuntimeError("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items, keys;
  for (const auto& [k, val] : v.dict().entries()) {
    items.emplace_back(std::vector<Value>{k, val}, SequenceKind::kTuple);
    keys.push_back(fold_case(by == "key" ? k : val, a[0].truthy()));
  }
  return Value(sorted(std::move(items), keys, a[2].truthy()));
}

Value f_escape(const Value& v, const CallArgs& args) {
  bind("escape", args, {});
  std::string out;
  for (char c : v.str()) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value(out);
}

Value f_first(const Value& v, const CallArgs& args) {
  bind("first", args, {});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(const Value& v, const CallArgs& args) {
  bind("last", args, {});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python's float(str): surrounding whitespace, underscores between digits, inf/nan.
bool parse_float(std::string s, double& out) {
  s = python_strip(s, Value::none(), true, true);
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && ::isdigit(s[i - 1]) && ::isdigit(s[i + 1])) continue;
    t += s[i];
  }
  if (t.empty() || t.find_first_of("xXpP") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return false;
  std::string low = str_lower(t);
  if (low.find("inf") != std::string::npos)
    return low == "inf" || low == "+inf" || low == "-inf" || low == "infinity" || low == "+infinity" ||
           low == "-infinity";
  return true;
}

// Python's int(str, base): sign, whitespace, underscores between digits, a 0x/0o/0b prefix when it fits the base.
bool parse_int(std::string s, int64_t base, int64_t& out) {
  s = python_strip(s, Value::none(), true, true);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    char p = char(std::tolower(static_cast<unsigned char>(s[i + 1])));
    int64_t prefix_base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefix_base && (base == 0 || base == prefix_base)) {
      base = prefix_base;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (i >= s.size()) return false;
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_' && i + 1 < s.size() && s[i + 1] != '_' && i > 0) continue;
    int d = ::isdigit(c) ? c - '0' : ::isalpha(c) ? std::tolower(c) - 'a' + 10 : 99;
    if (d >= base) return false;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return false;
  }
  out = neg ? -v : v;
  return true;
}

Value f_float(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("float", args, {{"default", Value(0.0)}});
  if (v.is_number()) return Value(v.as_float());
  double d;
  if (v.is_string() && parse_float(v.as_string(), d)) return Value(d);
  return a[0];
}

Value f_int(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("int", args, {{"default", Value(0)}, {"base", Value(10)}});
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    if (!std::isfinite(v.as_float())) return a[0];
    return Value(int64_t(v.as_float()));
  }
  if (v.is_string()) {
    int64_t i;
    if (parse_int(v.as_string(), a[1].as_int(), i)) return Value(i);
    double d;  // jinja2 then tries int(float(s))
    if (parse_float(v.as_string(), d) && std::isfinite(d)) return Value(int64_t(d));
  }
  return a[0];
}

Value f_items(const Value& v, const CallArgs& args) {
  bind("items", args, {});
  if (v.is_undefined()) return Value(std::vector<Value>{});
  if (!v.is_dict()) throw RuntimeError("Can only get item pairs from a mapping.");
  return Value(call_method(v, "items", {}).items());
}

Value f_join(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("join", args, {{"d", Value("")}, {"attribute", Value::none()}});
  std::string sep = a[0].str(), out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += (a[1].is_none() ? item : lookup_path(item, a[1])).str();
  }
  return Value(out);
}

Value f_length(const Value& v, const CallArgs& args) {
  bind("length", args, {});
  return Value(length(v));
}

Value f_list(const Value& v, const CallArgs& args) {
  bind("list", args, {});
  return Value(iterate(v));
}

Value f_lower(const Value& v, const CallArgs& args) {
  bind("lower", args, {});
  return Value(str_lower(v.str()));
}

Value f_upper(const Value& v, const CallArgs& args) {
  bind("upper", args, {});
  return Value(str_upper(v.str()));
}

Value f_map(const Value& v, const CallArgs& args) {
  std::vector<Value> out;
  if (args.positional.empty()) {
    Value attribute, def = Value::none();
    for (const auto& [k, val] : args.keyword) {
      if (k == "attribute") {
        attribute = val;
      } else if (k == "default") {
        def = val;
      } else {
        throw RuntimeError("Unexpected keyword argument '" + k + "'");
      }
    }
    if (attribute.is_undefined()) throw RuntimeError("map requires a filter argument");
    for (const Value& item : iterate(v)) {
      Value r = lookup_path(item, attribute);
      out.push_back(r.is_undefined() && !def.is_none() ? def : r);
    }
    return Value(std::move(out));
  }
  std::string name = args.positional[0].str();
  CallArgs rest{{args.positional.begin() + 1, args.positional.end()}, args.keyword};
  for (const Value& item : iterate(v)) out.push_back(apply_filter(name, item, rest));
  return Value(std::move(out));
}

Value min_max(const char* fn, const Value& v, const CallArgs& args, bool want_max) {
  BoundArgs a = bind(fn, args, {{"case_sensitive", Value(false)}, {"attribute", Value::none()}});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(items[0], a[1], a[0].truthy(), false);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(items[i], a[1], a[0].truthy(), false);
    if (want_max ? less_than(best_key, k) : less_than(k, best_key)) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

Value f_max(const Value& v, const CallArgs& args) { return min_max("max", v, args, true); }
Value f_min(const Value& v, const CallArgs& args) { return min_max("min", v, args, false); }

// select/reject/selectattr/rejectattr: the test named by the first positional argument (after the attribute for
// the *attr forms), or truthiness when there is none.
Value select(const Value& v, const CallArgs& args, bool keep, bool by_attribute) {
  size_t off = 0;
  Value attribute;
  if (by_attribute) {
    if (args.positional.empty()) throw RuntimeError("Missing parameter for attribute name");
    attribute = args.positional[0];
    off = 1;
  }
  bool has_test = args.positional.size() > off;
  std::string test = has_test ? args.positional[off].str() : "";
  CallArgs rest;
  if (has_test) rest = {{args.positional.begin() + long(off) + 1, args.positional.end()}, args.keyword};
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    Value x = by_attribute ? lookup_path(item, attribute) : item;
    bool pass = has_test ? apply_test(test, x, rest) : x.truthy();
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

Value f_select(const Value& v, const CallArgs& args) { return select(v, args, true, false); }
Value f_reject(const Value& v, const CallArgs& args) { return select(v, args, false, false); }
Value f_selectattr(const Value& v, const CallArgs& args) { return select(v, args, true, true); }
Value f_rejectattr(const Value& v, const CallArgs& args) { return select(v, args, false, true); }

Value f_replace(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("replace", args, {required("old"), required("new"), {"count", Value::none()}});
  CallArgs call{{Value(a[0].str()), Value(a[1].str()), a[2].is_none() ? Value(-1) : a[2]}, {}};
  return call_method(Value(v.str()), "replace", call);
}

Value f_reverse(const Value& v, const CallArgs& args) {
  bind("reverse", args, {});
  if (v.is_string()) {
    auto chars = utf8_chars(v.as_string());
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
    return Value(out);
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value f_round(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("round", args, {{"precision", Value(0)}, {"method", Value("common")}});
  std::string method = a[1].str();
  if (method != "common" && method != "ceil" && method != "floor")
    throw RuntimeError("method must be common, ceil or floor");
  if (!v.is_number()) throw RuntimeError("type " + v.type_name() + " doesn't define __round__ method");
  int64_t precision = a[0].as_int();
  if (method == "common") {
    if (!v.is_float()) return Value(v.as_int());  // Python's round(int, n) stays an int
    double x = v.as_float();
    if (!std::isfinite(x)) return Value(x);
    if (precision < 0) {
      double p = std::pow(10.0, double(-precision));
      return Value(std::nearbyint(x / p) * p);
    }
    // Python rounds the exact binary value half-to-even, as printf does.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", int(std::min<int64_t>(precision, 300)), x);
    return Value(std::strtod(buf, nullptr));
  }
  double p = std::pow(10.0, double(precision));
  double x = v.as_float() * p;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

Value f_string(const Value& v, const CallArgs& args) {
  bind("string", args, {});
  return Value(v.str());
}

Value f_sort(const Value& v, const CallArgs& args) {
  BoundArgs a =
      bind("sort", args, {{"reverse", Value(false)}, {"case_sensitive", Value(false)}, {"attribute", Value::none()}});
  std::vector<Value> items = iterate(v), keys;
  for (const Value& item : items) keys.push_back(sort_key(item, a[2], a[1].truthy(), true));
  return Value(sorted(std::move(items), keys, a[0].truthy()));
}

Value f_sum(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("sum", args, {{"attribute", Value::none()}, {"start", Value(0)}});
  Value total = a[1];
  for (const Value& item : iterate(v))
    total = binary_op(Op::kAdd, total, a[0].is_none() ? item : lookup_path(item, a[0]));
  return total;
}

Value f_title(const Value& v, const CallArgs& args) {
  bind("title", args, {});
  return Value(jinja_title(v.str()));
}

Value f_trim(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("trim", args, {{"chars", Value::none()}});
  return Value(python_strip(v.str(), a[0], true, true));
}

// jinja2's truncate: strings longer than length + leeway are cut to `length` with `end`, at a word boundary
// unless killwords.
Value f_truncate(const Value& v, const CallArgs& args) {
  BoundArgs a =
      bind("truncate", args,
           {{"length", Value(255)}, {"killwords", Value(false)}, {"end", Value("...")}, {"leeway", Value(5)}});
  auto chars = utf8_chars(v.str());
  std::string end = a[2].str();
  int64_t length = a[0].as_int(), leeway = a[3].is_none() ? 5 : a[3].as_int();
  int64_t end_len = int64_t(utf8_length(end));
  if (length < end_len) throw RuntimeError("expected length >= " + std::to_string(end_len));
  if (int64_t(chars.size()) <= length + leeway) return Value(v.str());
  std::string head;
  for (int64_t i = 0; i < length - end_len; ++i) head += chars[size_t(i)];
  if (!a[1].truthy()) {
    size_t space = head.rfind(' ');
    if (space != std::string::npos) head.resize(space);
  }
  return Value(head + end);
}

Value f_unique(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("unique", args, {{"case_sensitive", Value(false)}, {"attribute", Value::none()}});
  std::vector<Value> out, seen;
  for (const Value& item : iterate(v)) {
    Value key = sort_key(item, a[1], a[0].truthy(), false);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value(std::move(out));
}

// jinja2's indent: lines after the first get the indentation (the first too with first=True); blank lines
// only with blank=True.
Value f_indent(const Value& v, const CallArgs& args) {
  BoundArgs a = bind("indent", args, {{"width", Value(4)}, {"first", Value(false)}, {"blank", Value(false)}});
  std::string indention =
      a[0].is_string() ? a[0].as_string() : std::string(size_t(std::max<int64_t>(0, a[0].as_int())), ' ');
  // jinja2 appends a newline before splitlines(), so a trailing newline does not make an extra line.
  std::vector<Value> lines = call_method(Value(v.str() + "\n"), "splitlines", {}).items();
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i].as_string();
    if (i) out += "\n";
    if (i && (a[2].truthy() || !line.empty())) out += indention;
    out += line;
  }
  if (a[1].truthy()) out = indention + out;
  return Value(out);
}

// len(re.findall(r"\w+", s)); non-ASCII bytes count as word characters.
Value f_wordcount(const Value& v, const CallArgs& args) {
  bind("wordcount", args, {});
  int64_t n = 0;
  bool in_word = false;
  for (char c : v.str()) {
    bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_format(const Value& v, const CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty())
    throw RuntimeError("can't handle positional and keyword arguments at the same time");
  if (!args.keyword.empty()) {
    Dict d;
    for (const auto& [k, val] : args.keyword) d.set(Value(k), val);
    return Value(percent_format(v.str(), Value(std::move(d))));
  }
  return Value(percent_format(v.str(), Value(args.positional, SequenceKind::kTuple)));
}

Value f_safe(const Value& v, const CallArgs& args) {
  bind("safe", args, {});
  return Value(v.str());  // Markup(str(value)); without autoescape only the conversion to str remains
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> kFilters = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_escape},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return kFilters;
}

// ---- tests ----

Value test_arg(const char* test, const CallArgs& args) { return BoundArgs(test, args, {required("other")})[0]; }

bool no_args(const char* test, const CallArgs& args) {
  BoundArgs(test, args, {});
  return true;
}

bool t_defined(const Value& v, const CallArgs& a) { return no_args("defined", a) && !v.is_undefined(); }
bool t_undefined(const Value& v, const CallArgs& a) { return no_args("undefined", a) && v.is_undefined(); }
bool t_none(const Value& v, const CallArgs& a) { return no_args("none", a) && v.is_none(); }
bool t_boolean(const Value& v, const CallArgs& a) { return no_args("boolean", a) && v.is_bool(); }
bool t_true(const Value& v, const CallArgs& a) { return no_args("true", a) && v.is_bool() && v.as_bool(); }
bool t_false(const Value& v, const CallArgs& a) { return no_args("false", a) && v.is_bool() && !v.as_bool(); }
bool t_integer(const Value& v, const CallArgs& a) { return no_args("integer", a) && v.is_int(); }
bool t_float(const Value& v, const CallArgs& a) { return no_args("float", a) && v.is_float(); }
bool t_number(const Value& v, const CallArgs& a) { return no_args("number", a) && v.is_number(); }
bool t_string(const Value& v, const CallArgs& a) { return no_args("string", a) && v.is_string(); }
bool t_mapping(const Value& v, const CallArgs& a) { return no_args("mapping", a) && v.is_dict(); }
// Undefined counts as iterable, a sequence and callable, as jinja2's Undefined has those methods.
bool t_iterable(const Value& v, const CallArgs& a) {
  return no_args("iterable", a) && (v.is_undefined() || v.is_string() || v.is_list() || v.is_dict());
}
bool t_sequence(const Value& v, const CallArgs& a) {
  return no_args("sequence", a) && (v.is_undefined() || v.is_string() || v.is_list() || v.is_dict());
}
bool t_callable(const Value& v, const CallArgs& a) {
  return no_args("callable", a) && (v.is_callable() || v.is_undefined());
}
bool t_even(const Value& v, const CallArgs& a) {
  no_args("even", a);
  return binary_op(Op::kMod, v, Value(2)).as_float() == 0;
}
bool t_odd(const Value& v, const CallArgs& a) {
  no_args("odd", a);
  return binary_op(Op::kMod, v, Value(2)).as_float() == 1;
}
bool t_divisibleby(const Value& v, const CallArgs& a) {
  BoundArgs b("divisibleby", a, {required("num")});
  return binary_op(Op::kMod, v, b[0]).as_float() == 0;
}
bool t_eq(const Value& v, const CallArgs& a) { return compare(Op::kEq, v, test_arg("eq", a)); }
bool t_ne(const Value& v, const CallArgs& a) { return compare(Op::kNe, v, test_arg("ne", a)); }
bool t_lt(const Value& v, const CallArgs& a) { return compare(Op::kLt, v, test_arg("lt", a)); }
bool t_le(const Value& v, const CallArgs& a) { return compare(Op::kLe, v, test_arg("le", a)); }
bool t_gt(const Value& v, const CallArgs& a) { return compare(Op::kGt, v, test_arg("gt", a)); }
bool t_ge(const Value& v, const CallArgs& a) { return compare(Op::kGe, v, test_arg("ge", a)); }
bool t_in(const Value& v, const CallArgs& a) { return compare(Op::kIn, v, test_arg("in", a)); }
// Python's `is`: None and bools are singletons, small ints are cached; other values are the same object only
// when they come from the same place.
bool t_sameas(const Value& v, const CallArgs& a) {
  Value o = test_arg("sameas", a);
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kUndefined:
      return true;
    case Value::Kind::kBool:
      return v.as_bool() == o.as_bool();
    case Value::Kind::kInt:
      return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    case Value::Kind::kString:
      return &v.as_string() == &o.as_string();
    case Value::Kind::kList:
      return &v.items() == &o.items();
    default:
      return equals(v, o);
  }
}
bool t_lower(const Value& v, const CallArgs& a) {
  no_args("lower", a);
  return call_method(Value(v.str()), "islower", {}).as_bool();
}
bool t_upper(const Value& v, const CallArgs& a) {
  no_args("upper", a);
  return call_method(Value(v.str()), "isupper", {}).as_bool();
}
bool t_escaped(const Value&, const CallArgs& a) { return !no_args("escaped", a); }
bool t_filter(const Value& v, const CallArgs& a) {
  return no_args("filter", a) && v.is_string() && has_filter(v.as_string());
}
bool t_test(const Value& v, const CallArgs& a) {
  return no_args("test", a) && v.is_string() && has_test(v.as_string());
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> kTests = {
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"boolean", t_boolean},
      {"true", t_true},
      {"false", t_false},
      {"integer", t_integer},
      {"float", t_float},
      {"number", t_number},
      {"string", t_string},
      {"mapping", t_mapping},
      {"iterable", t_iterable},
      {"sequence", t_sequence},
      {"callable", t_callable},
      {"even", t_even},
      {"odd", t_odd},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"le", t_le},
      {"<=", t_le},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"in", t_in},
      {"sameas", t_sameas},
      {"lower", t_lower},
      {"upper", t_upper},
      {"escaped", t_escaped},
      {"filter", t_filter},
      {"test", t_test},
  };
  return kTests;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) != 0; }

Value apply_filter(const std::string& name, const Value& input, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw RuntimeError("no filter named '" + name + "'");
  return it->second(input, args);
}

bool has_test(const std::string& name) { return tests().count(name) != 0; }

bool apply_test(const std::string& name, const Value& input, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw RuntimeError("no test named '" + name + "'");
  return it->second(input, args);
}

}  // namespace lattice::jinja
