#include "chat/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace lattice::jinja {

Value::Value() : kind_(Kind::kUndefined), data_(std::shared_ptr<const std::string>()) {}
Value::Value(bool b) : kind_(Kind::kBool), data_(b) {}
Value::Value(int v) : kind_(Kind::kInt), data_(int64_t(v)) {}
Value::Value(int64_t v) : kind_(Kind::kInt), data_(v) {}
Value::Value(double v) : kind_(Kind::kFloat), data_(v) {}
Value::Value(std::string s) : kind_(Kind::kString), data_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(const char* s) : Value(std::string(s)) {}
Value::Value(std::vector<Value> items, SequenceKind seq_kind)
    : kind_(Kind::kList), data_(std::make_shared<const ListData>(ListData{std::move(items), seq_kind})) {}
Value::Value(Dict d) : kind_(Kind::kDict), data_(std::make_shared<const Dict>(std::move(d))) {}

Value Value::undefined(std::string hint) {
  Value v;
  v.data_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  v.data_ = std::monostate();
  return v;
}

Value Value::object(std::shared_ptr<ObjectData> obj) {
  Value v;
  v.kind_ = Kind::kObject;
  v.data_ = std::move(obj);
  return v;
}

Value Value::function(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.data_ = std::make_shared<const CallableData>(CallableData{std::move(name), std::move(fn)});
  return v;
}

int64_t Value::as_int() const {
  if (kind_ == Kind::kBool) return std::get<bool>(data_) ? 1 : 0;
  return std::get<int64_t>(data_);
}

double Value::as_float() const {
  if (kind_ == Kind::kFloat) return std::get<double>(data_);
  return double(as_int());
}

const std::string& Value::as_string() const { return *std::get<std::shared_ptr<const std::string>>(data_); }
const std::vector<Value>& Value::items() const { return std::get<std::shared_ptr<const ListData>>(data_)->items; }
SequenceKind Value::seq_kind() const { return std::get<std::shared_ptr<const ListData>>(data_)->seq_kind; }
const Dict& Value::dict() const { return *std::get<std::shared_ptr<const Dict>>(data_); }
ObjectData& Value::object() const { return *std::get<std::shared_ptr<ObjectData>>(data_); }
const CallableData& Value::callable() const { return *std::get<std::shared_ptr<const CallableData>>(data_); }

const std::string& Value::undefined_hint() const {
  static const std::string kNoHint = "undefined value";
  const auto& p = std::get<std::shared_ptr<const std::string>>(data_);
  return p ? *p : kNoHint;
}

void Value::throw_undefined() const { throw RuntimeError(undefined_hint()); }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !items().empty();
    case Kind::kDict:
      return dict().size() != 0;
    default:
      return true;
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      switch (seq_kind()) {
        case SequenceKind::kTuple:
          return "tuple";
        case SequenceKind::kDictItems:
          return "dict_items";
        case SequenceKind::kDictKeys:
          return "dict_keys";
        case SequenceKind::kDictValues:
          return "dict_values";
        default:
          return "list";
      }
    case Kind::kDict:
      return "dict";
    case Kind::kObject:
      return object().type_name;
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);  // shortest round trip
  std::string sci(buf, res.ptr);
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out = "-";
    i = 1;
  }
  size_t e = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  int exp10 = std::atoi(sci.c_str() + e + 1);
  int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  int n = int(digits.size());
  if (decpt <= -4 || decpt > 16) {  // Python's repr switches to exponent notation here
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + eb;
  }
  if (decpt <= 0) return out + "0." + std::string(size_t(-decpt), '0') + digits;
  if (decpt >= n) return out + digits + std::string(size_t(decpt - n), '0') + ".0";
  return out + digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
}

namespace {

// Characters Python's str.isprintable() rejects (besides ASCII controls), so repr escapes them.
bool python_unprintable(uint32_t c) {
  return (c >= 0x80 && c <= 0xA0) || c == 0xAD || c == 0x61C || c == 0x1680 || c == 0x180E ||
         (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x2064) ||
         (c >= 0x2066 && c <= 0x206F) || c == 0x3000 || (c >= 0xD800 && c <= 0xF8FF) || c == 0xFEFF ||
         (c >= 0xFFF9 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF || c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F) ||
         c >= 0xF0000;
}

// Python's repr of a str: single quotes unless the text has a ' and no ".
std::string string_repr(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (const std::string& ch : utf8_chars(s)) {
    uint32_t c = utf8_decode(ch);
    char buf[16];
    if (c == uint32_t(quote) || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c < 0x100 && python_unprintable(c))) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (python_unprintable(c)) {
      std::snprintf(buf, sizeof buf, c <= 0xFFFF ? "\\u%04x" : "\\U%08x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kString:
      return string_repr(as_string());
    case Kind::kList: {
      SequenceKind sk = seq_kind();
      std::string out = sk == SequenceKind::kTuple ? "(" : "[";
      const auto& xs = items();
      for (size_t i = 0; i < xs.size(); ++i) {
        if (i) out += ", ";
        out += xs[i].repr();
      }
      if (sk == SequenceKind::kTuple) return out + (xs.size() == 1 ? ",)" : ")");
      out += "]";
      if (sk == SequenceKind::kList) return out;
      return type_name() + "(" + out + ")";
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict().entries()) {
        if (!first) out += ", ";
        first = false;
        out += k.repr() + ": " + v.repr();
      }
      return out + "}";
    }
    case Kind::kObject: {
      std::string out = "<" + object().type_name + " {";
      bool first = true;
      for (const auto& [k, v] : object().attrs.entries()) {
        if (!first) out += ", ";
        first = false;
        out += k.repr() + ": " + v.repr();
      }
      return out + "}>";
    }
    case Kind::kCallable:
      return "<function " + callable().name + ">";
    default:
      return str();
  }
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return float_repr(as_float());
    case Kind::kString:
      return as_string();
    default:
      return repr();
  }
}

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kList: {
      bool a_tuple = a.seq_kind() == SequenceKind::kTuple, b_tuple = b.seq_kind() == SequenceKind::kTuple;
      if (a_tuple != b_tuple) return false;
      const auto &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case K::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict().entries()) {
        const Value* other = b.dict().find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case K::kObject:
      return &a.object() == &b.object();
    case K::kCallable:
      return &a.callable() == &b.callable();
    default:
      return false;
  }
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(key.as_string());
  for (const auto& [k, v] : entries_)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : entries_)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : entries_) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

void Dict::append(Value key, Value value) { entries_.emplace_back(std::move(key), std::move(value)); }

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().size());
      for (const auto& kv : v.dict().entries()) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (auto& c : utf8_chars(v.as_string())) chars.emplace_back(std::move(c));
      return chars;
    }
    default:
      throw RuntimeError("'" + v.type_name() + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return int64_t(utf8_length(v.as_string()));
    case Value::Kind::kList:
      return int64_t(v.items().size());
    case Value::Kind::kDict:
      return int64_t(v.dict().size());
    default:
      throw RuntimeError("object of type '" + v.type_name() + "' has no len()");
  }
}

namespace {
// Bytes in the UTF-8 sequence that starts with `lead` (1 for a stray continuation byte).
size_t utf8_seq_len(unsigned char lead) {
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}
}  // namespace

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = std::min(utf8_seq_len(static_cast<unsigned char>(s[i])), s.size() - i);
    out.emplace_back(s, i, n);
    i += n;
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

uint32_t utf8_decode(const std::string& ch) {
  auto b = [&](size_t i) { return uint32_t(static_cast<unsigned char>(ch[i])); };
  if (ch.size() == 1) return b(0);
  if (ch.size() == 2) return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  if (ch.size() == 3) return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

std::string utf8_encode(uint32_t c) {
  std::string out;
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
  return out;
}

}  // namespace lattice::jinja
