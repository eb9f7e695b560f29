// The Python methods of str, dict and list that templates call, and the globals (range, namespace, dict,
// and transformers' raise_exception and strftime_now). Case mapping is ASCII-only.
#include <locale.h>

#include <algorithm>
#include <cctype>
#include <clocale>
#include <ctime>
#include <cwctype>
#include <unordered_map>

#include "chat/jinja_builtins.h"

namespace lattice::jinja {

namespace {

// Unicode simple case mapping through the C library's C.UTF-8 locale (ASCII-only if that locale is missing).
locale_t utf8_locale() {
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t(0));
  return loc;
}

// Python's str.isspace() over ASCII: space, \t \n \v \f \r and the separators \x1c-\x1f.
bool py_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

uint32_t map_char(uint32_t c, bool upper) {
  if (c < 0x80) return upper ? uint32_t(std::toupper(int(c))) : uint32_t(std::tolower(int(c)));
  locale_t loc = utf8_locale();
  if (!loc) return c;
  return uint32_t(upper ? towupper_l(wint_t(c), loc) : towlower_l(wint_t(c), loc));
}

std::string map_case(const std::string& s, bool upper) {
  bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) {
    std::string out = s;
    for (char& c : out)
      c = char(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    return out;
  }
  std::string out;
  for (const std::string& ch : utf8_chars(s)) out += utf8_encode(map_char(utf8_decode(ch), upper));
  return out;
}

}  // namespace

std::string str_lower(const std::string& s) { return map_case(s, false); }

std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const std::string& ch : utf8_chars(s)) {
    char c = ch[0];
    bool sep = ch.size() == 1 && (py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<');
    out += sep ? ch : utf8_encode(map_char(utf8_decode(ch), word_start));
    word_start = sep;
  }
  return out;
}
std::string str_upper(const std::string& s) { return map_case(s, true); }

namespace {

bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }

const std::string& str_arg(const Value& v, const char* method) {
  if (!v.is_string()) throw RuntimeError(std::string(method) + "() argument must be str, not " + v.type_name());
  return v.as_string();
}

// Byte offset -> code point index, for find() and index().
int64_t char_index(const std::string& s, size_t byte_pos) { return int64_t(utf8_length(s.substr(0, byte_pos))); }

Value split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<Value> parts;
  if (sep.is_none() || sep.is_undefined()) {  // runs of whitespace, no empty parts
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < s.size();) {
      while (i < s.size() && py_space(s[i])) ++i;
      if (i == s.size()) break;
      size_t j = i;
      while (j < s.size() && !py_space(s[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit < 0 || size_t(maxsplit) >= words.size()) {
      for (auto [a, b] : words) parts.emplace_back(s.substr(a, b - a));
      return Value(std::move(parts));
    }
    size_t n = size_t(maxsplit);
    if (!from_right) {
      for (size_t k = 0; k < n; ++k) parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      size_t rest = words[n].first, end = s.size();
      while (end > rest && py_space(s[end - 1])) --end;
      parts.emplace_back(s.substr(rest, end - rest));
    } else {
      size_t first = words.size() - n;
      size_t begin = 0, rest_end = words[first - 1].second;
      while (begin < rest_end && py_space(s[begin])) ++begin;
      parts.emplace_back(s.substr(begin, rest_end - begin));
      for (size_t k = first; k < words.size(); ++k)
        parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
    return Value(std::move(parts));
  }
  const std::string& d = str_arg(sep, "split");
  if (d.empty()) throw RuntimeError("empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t start = 0;
    for (size_t pos;
         (maxsplit < 0 || int64_t(pieces.size()) < maxsplit) && (pos = s.find(d, start)) != std::string::npos;) {
      pieces.push_back(s.substr(start, pos - start));
      start = pos + d.size();
    }
    pieces.push_back(s.substr(start));
  } else {
    size_t end = s.size();
    for (;;) {
      if (maxsplit >= 0 && int64_t(pieces.size()) >= maxsplit) break;
      if (end < d.size()) break;
      size_t pos = s.rfind(d, end - d.size());
      if (pos == std::string::npos) break;
      pieces.push_back(s.substr(pos + d.size(), end - pos - d.size()));
      end = pos;
    }
    pieces.push_back(s.substr(0, end));
    std::reverse(pieces.begin(), pieces.end());
  }
  for (auto& p : pieces) parts.emplace_back(std::move(p));
  return Value(std::move(parts));
}

std::string replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` before every character and at the end
    int64_t n = 0;
    for (const std::string& ch : utf8_chars(s)) {
      if (count < 0 || n < count) {
        out += with;
        ++n;
      }
      out += ch;
    }
    if (count < 0 || n < count) out += with;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  for (size_t pos; (count < 0 || n < count) && (pos = s.find(old, start)) != std::string::npos; ++n) {
    out.append(s, start, pos - start);
    out += with;
    start = pos + old.size();
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Python's str.title(): a cased character after a cased one is lower, any other is upper.
std::string title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (const std::string& ch : utf8_chars(s)) {
    uint32_t c = utf8_decode(ch), up = map_char(c, true), low = map_char(c, false);
    bool cased = up != c || low != c;
    out += cased ? utf8_encode(prev_cased ? low : up) : ch;
    prev_cased = cased;
  }
  return out;
}

// Python's str.capitalize(): the first character upper, the rest lower.
std::string capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (const std::string& ch : utf8_chars(s)) {
    out += utf8_encode(map_char(utf8_decode(ch), first));
    first = false;
  }
  return out;
}

// Python's startswith/endswith: a str or a tuple of them.
bool affix_match(const std::string& s, const Value& affix, bool at_start) {
  auto one = [&](const Value& a) {
    const std::string& x = str_arg(a, at_start ? "startswith" : "endswith");
    if (x.size() > s.size()) return false;
    return at_start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) return std::any_of(affix.items().begin(), affix.items().end(), one);
  return one(affix);
}

bool all_chars(const std::string& s, bool (*pred)(char)) { return !s.empty() && std::all_of(s.begin(), s.end(), pred); }

// str.format with {} / {0} / {name} fields and !r / !s conversions; format specs are not supported.
std::string str_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw RuntimeError("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 's';
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos) throw RuntimeError("str.format() with format specs is not supported");
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      size_t index = field.empty() ? auto_index++ : size_t(std::stoul(field));
      if (index >= args.positional.size())
        throw RuntimeError("Replacement index " + std::to_string(index) + " out of range for positional args tuple");
      v = &args.positional[index];
    } else {
      for (const auto& [k, kv] : args.keyword)
        if (k == field) v = &kv;
      if (!v) throw RuntimeError("KeyError: '" + field + "'");
    }
    out += conversion == 's' ? v->str() : v->repr();
  }
  return out;
}

Value str_method(const std::string& s, const std::string& name, const CallArgs& args) {
  auto bind = [&](std::initializer_list<Param> params) { return BoundArgs(name, args, params); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    BoundArgs a = bind({{"chars", Value::none()}});
    return Value(python_strip(s, a[0], name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    BoundArgs a = bind({{"sep", Value::none()}, {"maxsplit", Value(-1)}});
    return split(s, a[0], a[1].as_int(), name == "rsplit");
  }
  if (name == "splitlines") {
    BoundArgs a = bind({{"keepends", Value(false)}});
    std::vector<Value> lines;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      char c = s[i];
      if (c != '\n' && c != '\r' && c != '\v' && c != '\f' && !(c >= '\x1c' && c <= '\x1e')) continue;
      size_t end = i;
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      lines.emplace_back(s.substr(start, (a[0].truthy() ? i + 1 : end) - start));
      start = i + 1;
    }
    if (start < s.size()) lines.emplace_back(s.substr(start));
    return Value(std::move(lines));
  }
  if (name == "startswith" || name == "endswith") {
    BoundArgs a = bind({required("affix")});
    return Value(affix_match(s, a[0], name == "startswith"));
  }
  if (name == "upper") return Value(str_upper(s));
  if (name == "lower" || name == "casefold") return Value(str_lower(s));
  if (name == "title") return Value(title(s));
  if (name == "capitalize") return Value(capitalize(s));
  if (name == "swapcase") {
    std::string out;
    for (const std::string& ch : utf8_chars(s)) {
      uint32_t c = utf8_decode(ch), up = map_char(c, true);
      out += utf8_encode(up != c ? up : map_char(c, false));
    }
    return Value(out);
  }
  if (name == "replace") {
    BoundArgs a = bind({required("old"), required("new"), {"count", Value(-1)}});
    return Value(replace(s, str_arg(a[0], "replace"), str_arg(a[1], "replace"), a[2].as_int()));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    BoundArgs a = bind({required("sub")});
    const std::string& sub = str_arg(a[0], name.c_str());
    size_t pos = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (pos == std::string::npos) {
      if (name.find("index") != std::string::npos) throw RuntimeError("substring not found");
      return Value(-1);
    }
    return Value(char_index(s, pos));
  }
  if (name == "count") {
    BoundArgs a = bind({required("sub")});
    const std::string& sub = str_arg(a[0], "count");
    if (sub.empty()) return Value(int64_t(utf8_length(s)) + 1);
    int64_t n = 0;
    for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
    return Value(n);
  }
  if (name == "join") {
    BoundArgs a = bind({required("iterable")});
    std::string out;
    size_t i = 0;
    for (const Value& v : iterate(a[0])) {
      if (!v.is_string())
        throw RuntimeError("sequence item " + std::to_string(i) + ": expected str instance, " + v.type_name() +
                           " found");
      if (i++) out += s;
      out += v.as_string();
    }
    return Value(out);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    BoundArgs a = bind({required("affix")});
    const std::string& x = str_arg(a[0], name.c_str());
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
    if (name == "removesuffix" && !x.empty() && affix_match(s, a[0], false))
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  if (name == "partition" || name == "rpartition") {
    BoundArgs a = bind({required("sep")});
    const std::string& sep = str_arg(a[0], name.c_str());
    size_t pos = name == "partition" ? s.find(sep) : s.rfind(sep);
    std::vector<Value> parts;
    if (pos == std::string::npos) {
      parts = name == "partition" ? std::vector<Value>{Value(s), Value(""), Value("")}
                                  : std::vector<Value>{Value(""), Value(""), Value(s)};
    } else {
      parts = {Value(s.substr(0, pos)), Value(sep), Value(s.substr(pos + sep.size()))};
    }
    return Value(std::move(parts), SequenceKind::kTuple);
  }
  if (name == "format") return Value(str_format(s, args));
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
    return Value(all_chars(s, [](char c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha") return Value(all_chars(s, [](char c) { return is_lower(c) || is_upper(c); }));
  if (name == "isalnum")
    return Value(all_chars(s, [](char c) { return is_lower(c) || is_upper(c) || (c >= '0' && c <= '9'); }));
  if (name == "isspace") return Value(all_chars(s, py_space));
  if (name == "islower" || name == "isupper") {  // some cased character, and none of the other case
    bool any_cased = false, ok = true;
    for (const std::string& ch : utf8_chars(s)) {
      uint32_t c = utf8_decode(ch);
      bool is_up = map_char(c, false) != c, is_low = map_char(c, true) != c;
      any_cased = any_cased || is_up || is_low;
      if ((name == "islower" && is_up) || (name == "isupper" && is_low)) ok = false;
    }
    return Value(any_cased && ok);
  }
  throw RuntimeError("'str' object has no attribute '" + name + "'");
}

Value dict_method(const Value& d, const std::string& name, const CallArgs& args) {
  auto bind = [&](std::initializer_list<Param> params) { return BoundArgs(name, args, params); };
  if (name == "items" || name == "keys" || name == "values") {
    bind({});
    std::vector<Value> out;
    for (const auto& [k, v] : d.dict().entries()) {
      if (name == "items") {
        out.emplace_back(std::vector<Value>{k, v}, SequenceKind::kTuple);
      } else {
        out.push_back(name == "keys" ? k : v);
      }
    }
    SequenceKind kind = name == "items"  ? SequenceKind::kDictItems
                        : name == "keys" ? SequenceKind::kDictKeys
                                         : SequenceKind::kDictValues;
    return Value(std::move(out), kind);
  }
  if (name == "get") {
    BoundArgs a = bind({required("key"), {"default", Value::none()}});
    const Value* v = d.dict().find(a[0]);
    return v ? *v : a[1];
  }
  if (name == "copy") return d;
  throw RuntimeError("'dict' object has no attribute '" + name + "'");
}

Value list_method(const Value& l, const std::string& name, const CallArgs& args) {
  BoundArgs a(name, args, {name == "copy" ? Param{"unused"} : required("value")});
  if (name == "copy") return Value(l.items());
  int64_t n = 0, i = 0;
  for (const Value& v : l.items()) {
    if (equals(v, a[0])) {
      if (name == "index") return Value(i);
      ++n;
    }
    ++i;
  }
  if (name == "index") throw RuntimeError(a[0].repr() + " is not in " + l.type_name());
  return Value(n);
}

}  // namespace

std::string python_strip(const std::string& s, const Value& chars, bool left, bool right) {
  if (chars.is_none() || chars.is_undefined()) {
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && py_space(s[b])) ++b;
    if (right)
      while (e > b && py_space(s[e - 1])) --e;
    return s.substr(b, e - b);
  }
  auto set = utf8_chars(str_arg(chars, "strip"));
  auto cs = utf8_chars(s);
  size_t b = 0, e = cs.size();
  auto in_set = [&](const std::string& c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  if (left)
    while (b < e && in_set(cs[b])) ++b;
  if (right)
    while (e > b && in_set(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

MethodKind method_kind(const Value& obj, const std::string& name) {
  static const std::vector<std::string> kStr = {
      "strip",        "lstrip",       "rstrip",    "split",      "rsplit",  "splitlines", "startswith",
      "endswith",     "upper",        "lower",     "casefold",   "title",   "capitalize", "swapcase",
      "replace",      "find",         "rfind",     "index",      "rindex",  "count",      "join",
      "removeprefix", "removesuffix", "partition", "rpartition", "format",  "isdigit",    "isdecimal",
      "isnumeric",    "isalpha",      "isalnum",   "isspace",    "islower", "isupper"};
  static const std::vector<std::string> kDict = {"items", "keys", "values", "get", "copy"};
  static const std::vector<std::string> kDictUnsafe = {"pop", "popitem", "update", "clear", "setdefault"};
  static const std::vector<std::string> kList = {"index", "count", "copy"};
  static const std::vector<std::string> kListUnsafe = {"append", "extend",  "insert", "pop",
                                                       "remove", "reverse", "sort",   "clear"};
  auto in = [&](const std::vector<std::string>& xs) { return std::find(xs.begin(), xs.end(), name) != xs.end(); };
  if (obj.is_string()) return in(kStr) ? MethodKind::kSafe : MethodKind::kNone;
  if (obj.is_dict()) return in(kDict) ? MethodKind::kSafe : in(kDictUnsafe) ? MethodKind::kUnsafe : MethodKind::kNone;
  if (obj.is_list()) {
    if (obj.seq_kind() == SequenceKind::kTuple)
      return name == "index" || name == "count" ? MethodKind::kSafe : MethodKind::kNone;
    if (obj.seq_kind() != SequenceKind::kList) return MethodKind::kNone;
    return in(kList) ? MethodKind::kSafe : in(kListUnsafe) ? MethodKind::kUnsafe : MethodKind::kNone;
  }
  return MethodKind::kNone;
}

Value call_method(const Value& obj, const std::string& name, const CallArgs& args) {
  if (obj.is_string()) return str_method(obj.as_string(), name, args);
  if (obj.is_dict()) return dict_method(obj, name, args);
  if (obj.is_list()) return list_method(obj, name, args);
  throw RuntimeError("'" + obj.type_name() + "' object has no attribute '" + name + "'");
}

namespace {

Value range_fn(const CallArgs& args) {
  if (!args.keyword.empty()) throw RuntimeError("range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3)
    throw RuntimeError("range expected at most 3 arguments, got " + std::to_string(args.positional.size()));
  for (const Value& v : args.positional)
    if (!v.is_int() && !v.is_bool())
      throw RuntimeError("'" + v.type_name() + "' object cannot be interpreted as an integer");
  int64_t start = 0, stop, step = 1;
  if (args.positional.size() == 1) {
    stop = args.positional[0].as_int();
  } else {
    start = args.positional[0].as_int();
    stop = args.positional[1].as_int();
    if (args.positional.size() == 3) step = args.positional[2].as_int();
  }
  if (step == 0) throw RuntimeError("range() arg 3 must not be zero");
  int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                           : (start > stop ? (start - stop - step - 1) / -step : 0);
  if (count > 100000) throw RuntimeError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> out;
  for (int64_t i = 0; i < count; ++i) out.emplace_back(start + i * step);
  return Value(std::move(out));
}

// dict(...) and namespace(...): a mapping or pairs, then keyword arguments.
Dict dict_from_args(const char* fn, const CallArgs& args) {
  Dict d;
  if (args.positional.size() > 1) throw RuntimeError(std::string(fn) + " expected at most 1 argument");
  if (args.positional.size() == 1) {
    const Value& src = args.positional[0];
    if (src.is_dict()) {
      d = src.dict();
    } else {
      for (const Value& pair : iterate(src)) {
        if (!pair.is_list() || pair.items().size() != 2)
          throw RuntimeError(std::string(fn) + ": sequence elements must be pairs");
        d.set(pair.items()[0], pair.items()[1]);
      }
    }
  }
  for (const auto& [k, v] : args.keyword) d.set(Value(k), v);
  return d;
}

std::string strftime_now(const std::string& format) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  if (format.empty()) return "";
  for (size_t size = 256; size <= 65536; size *= 4) {
    std::string buf(size, '\0');
    size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
    if (n > 0) return buf.substr(0, n);
  }
  return "";
}

}  // namespace

const Value* find_global(const std::string& name) {
  static const std::unordered_map<std::string, Value> kGlobals = {
      {"range", Value::function("range", range_fn)},
      {"dict", Value::function("dict", [](const CallArgs& args) { return Value(dict_from_args("dict", args)); })},
      {"namespace", Value::function("namespace",
                                    [](const CallArgs& args) {
                                      auto obj = std::make_shared<ObjectData>();
                                      obj->type_name = "Namespace";
                                      obj->assignable = true;
                                      obj->attrs = dict_from_args("namespace", args);
                                      return Value::object(std::move(obj));
                                    })},
      {"raise_exception", Value::function("raise_exception",
                                          [](const CallArgs& args) -> Value {
                                            BoundArgs a("raise_exception", args, {required("message")});
                                            throw RaisedException(a[0].str());
                                          })},
      {"strftime_now", Value::function("strftime_now",
                                       [](const CallArgs& args) {
                                         BoundArgs a("strftime_now", args, {required("format")});
                                         return Value(strftime_now(a[0].str()));
                                       })},
  };
  auto it = kGlobals.find(name);
  return it == kGlobals.end() ? nullptr : &it->second;
}

}  // namespace lattice::jinja
