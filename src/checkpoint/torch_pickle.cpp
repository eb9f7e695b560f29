#include "checkpoint/torch_pickle.h"

#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"

namespace lattice {

namespace {

PyRef make(PyValue::Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  return v;
}

class Unpickler {
 public:
  Unpickler(const uint8_t* data, size_t n, const std::string& what, const PickleHooks& hooks)
      : p_(data), n_(n), what_(what), hooks_(hooks) {}

  PyRef run() {
    for (;;) {
      op_at_ = at_;
      const uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;              // PROTO
        case 0x95: take(8); break;             // FRAME: the length of the frame that follows
        case '.': return stop();               // STOP
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case '0': pop(); break;                // POP
        case '1': pop_mark(); break;           // POP_MARK
        case '2': push(top()); break;          // DUP
        case 'N': push(py_none()); break;
        case 0x88: push(boolean(true)); break;   // NEWTRUE
        case 0x89: push(boolean(false)); break;  // NEWFALSE
        case 'J': push(py_int(int32_t(le(4)))); break;  // BININT
        case 'K': push(py_int(int64_t(le(1)))); break;  // BININT1
        case 'M': push(py_int(int64_t(le(2)))); break;  // BININT2
        case 0x8a: push(long_int(le(1))); break;  // LONG1
        case 0x8b: push(long_int(le(4))); break;  // LONG4
        case 'I': push(text_int(line())); break;  // INT (protocol 0; I00 / I01 are booleans)
        case 'L': push(text_int(line())); break;  // LONG (protocol 0)
        case 'G': {                                // BINFLOAT: big-endian double
          uint64_t bits = 0;
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | byte();
          auto v = make(PyValue::Kind::floating);
          std::memcpy(&v->floating, &bits, 8);
          push(v);
          break;
        }
        case 'F': {  // FLOAT (protocol 0)
          auto v = make(PyValue::Kind::floating);
          v->floating = std::strtod(line().c_str(), nullptr);
          push(v);
          break;
        }
        case 'X': push(py_string(take_string(le(4)))); break;     // BINUNICODE
        case 0x8c: push(py_string(take_string(le(1)))); break;    // SHORT_BINUNICODE
        case 0x8d: push(py_string(take_string(le(8)))); break;    // BINUNICODE8
        case 'T': push(py_string(take_string(le(4)))); break;     // BINSTRING (Python 2 str)
        case 'U': push(py_string(take_string(le(1)))); break;     // SHORT_BINSTRING
        case 'B': push(bytes(take_string(le(4)))); break;         // BINBYTES
        case 'C': push(bytes(take_string(le(1)))); break;         // SHORT_BINBYTES
        case 0x8e: push(bytes(take_string(le(8)))); break;        // BINBYTES8
        case 0x96: push(bytes(take_string(le(8)))); break;        // BYTEARRAY8
        case ')': push(make(PyValue::Kind::tuple)); break;        // EMPTY_TUPLE
        case 't': push(sequence(PyValue::Kind::tuple, pop_mark())); break;  // TUPLE
        case 0x85: push(tuple_of(1)); break;  // TUPLE1
        case 0x86: push(tuple_of(2)); break;  // TUPLE2
        case 0x87: push(tuple_of(3)); break;  // TUPLE3
        case ']': push(make(PyValue::Kind::list)); break;        // EMPTY_LIST
        case 'l': push(sequence(PyValue::Kind::list, pop_mark())); break;  // LIST
        case 0x8f: push(make(PyValue::Kind::list)); break;       // EMPTY_SET (a list here)
        case 0x91: push(sequence(PyValue::Kind::list, pop_mark())); break;  // FROZENSET
        case 'a': {  // APPEND
          PyRef v = pop();
          append_to(top(), {v});
          break;
        }
        case 'e':  // APPENDS
        case 0x90: {  // ADDITEMS
          std::vector<PyRef> vs = pop_mark();
          append_to(top(), vs);
          break;
        }
        case '}': push(make(PyValue::Kind::dict)); break;  // EMPTY_DICT
        case 'd': {  // DICT
          std::vector<PyRef> kv = pop_mark();
          PyRef d = make(PyValue::Kind::dict);
          set_items(d, kv);
          push(d);
          break;
        }
        case 's': {  // SETITEM
          PyRef v = pop(), k = pop();
          set_items(top(), {k, v});
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<PyRef> kv = pop_mark();
          set_items(top(), kv);
          break;
        }
        case 'c': {  // GLOBAL module\nname\n
          std::string module = line();
          std::string name = line();
          push(global(std::move(module), std::move(name)));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          PyRef name = pop(), module = pop();
          if (!module->is(PyValue::Kind::string) || !name->is(PyValue::Kind::string))
            fail("STACK_GLOBAL of non-strings");
          push(global(module->text, name->text));
          break;
        }
        case 'R': {  // REDUCE
          PyRef args = pop(), callable = pop();
          push(reduce(callable, args));
          break;
        }
        case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
          PyRef args = pop(), cls = pop();
          push(object(cls, args));
          break;
        }
        case 0x92: {  // NEWOBJ_EX
          pop();  // kwargs
          PyRef args = pop(), cls = pop();
          push(object(cls, args));
          break;
        }
        case 'b': {  // BUILD
          PyRef state = pop();
          PyRef obj = top();
          if (obj->is(PyValue::Kind::object)) obj->state = state;
          else if (!obj->is(PyValue::Kind::opaque)) fail("BUILD on " + obj->describe());
          break;
        }
        case 'Q': {  // BINPERSID
          PyRef pid = pop();
          if (!hooks_.persistent_load) fail("a persistent id (BINPERSID) and no loader for it");
          push(hooks_.persistent_load(pid));
          break;
        }
        case 'q': memo_[le(1)] = top(); break;      // BINPUT
        case 'r': memo_[le(4)] = top(); break;      // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(); break;  // MEMOIZE
        case 'p': memo_[memo_index(line())] = top(); break;  // PUT (protocol 0)
        case 'h': push(memo(le(1))); break;        // BINGET
        case 'j': push(memo(le(4))); break;        // LONG_BINGET
        case 'g': push(memo(memo_index(line()))); break;  // GET
        default: {
          std::ostringstream os;
          os << "unknown pickle opcode 0x" << std::hex << int(op);
          fail(os.str());
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    LATTICE_FAIL() << what_ << ": not a readable pickle: " << why << " at byte " << op_at_;
  }
  uint8_t byte() {
    if (at_ >= n_) fail("truncated");
    return p_[at_++];
  }
  const uint8_t* take(uint64_t k) {
    if (k > n_ - at_) fail("truncated (a length of " + std::to_string(k) + " bytes)");
    const uint8_t* s = p_ + at_;
    at_ += k;
    return s;
  }
  std::string take_string(uint64_t k) {
    const uint8_t* s = take(k);
    return std::string(reinterpret_cast<const char*>(s), k);
  }
  uint64_t le(int k) {
    const uint8_t* s = take(uint64_t(k));
    uint64_t v = 0;
    for (int i = k - 1; i >= 0; --i) v = (v << 8) | s[i];
    return v;
  }
  std::string line() {
    std::string s;
    for (uint8_t c = byte(); c != '\n'; c = byte()) s.push_back(char(c));
    return s;
  }
  PyRef long_int(uint64_t k) {  // little-endian two's complement of k bytes
    if (k > 8) fail("an integer of " + std::to_string(k) + " bytes (more than 64 bits)");
    const uint8_t* s = take(k);
    uint64_t v = 0;
    for (int i = int(k) - 1; i >= 0; --i) v = (v << 8) | s[i];
    if (k > 0 && k < 8 && (s[k - 1] & 0x80)) v |= ~uint64_t(0) << (8 * k);  // sign-extend
    return py_int(int64_t(v));
  }
  uint64_t memo_index(const std::string& s) const {  // protocol 0's decimal memo key
    if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos)
      fail("the memo index '" + s + "'");
    return std::stoull(s);
  }
  PyRef text_int(const std::string& s) {
    if (s == "00" || s == "01") return boolean(s == "01");
    std::string digits = s;
    if (!digits.empty() && digits.back() == 'L') digits.pop_back();
    try {
      return py_int(std::stoll(digits));
    } catch (const std::exception&) {
      fail("the integer '" + s + "'");
    }
  }
  static PyRef boolean(bool b) {
    PyRef v = make(PyValue::Kind::boolean);
    v->boolean = b;
    return v;
  }
  static PyRef bytes(std::string s) {
    PyRef v = make(PyValue::Kind::bytes);
    v->text = std::move(s);
    return v;
  }
  static PyRef global(std::string module, std::string name) {
    PyRef v = make(PyValue::Kind::global);
    v->text = std::move(module);
    v->name = std::move(name);
    return v;
  }
  static PyRef sequence(PyValue::Kind k, std::vector<PyRef> items) {
    PyRef v = make(k);
    v->items = std::move(items);
    return v;
  }
  PyRef tuple_of(size_t k) {
    if (stack_.size() < k + (marks_.empty() ? 0 : marks_.back())) fail("stack underflow");
    std::vector<PyRef> items(stack_.end() - long(k), stack_.end());
    stack_.resize(stack_.size() - k);
    return sequence(PyValue::Kind::tuple, std::move(items));
  }
  PyRef object(const PyRef& callable, const PyRef& args) {
    if (!args->is(PyValue::Kind::tuple)) fail("arguments that are not a tuple: " + args->describe());
    PyRef v = make(PyValue::Kind::object);
    v->callable = callable;
    v->args = args;
    return v;
  }
  PyRef reduce(const PyRef& callable, const PyRef& args) {
    if (callable->is(PyValue::Kind::global) && callable->text == "collections" && callable->name == "OrderedDict" &&
        args->is(PyValue::Kind::tuple) && args->items.empty())
      return make(PyValue::Kind::dict);
    // Protocol 2's bytes: _codecs.encode(text, 'latin1'), each code point below 256 one byte.
    if (callable->is(PyValue::Kind::global) && callable->text == "_codecs" && callable->name == "encode" &&
        args->items.size() == 2 && args->items[0]->is(PyValue::Kind::string) &&
        args->items[1]->is(PyValue::Kind::string) && args->items[1]->text == "latin1")
      return bytes(latin1(args->items[0]->text));
    if (hooks_.reduce)
      if (PyRef v = hooks_.reduce(callable, args)) return v;
    return object(callable, args);
  }
  std::string latin1(const std::string& utf8) {  // code points below 256, UTF-8 encoded, as bytes
    std::string out;
    for (size_t i = 0; i < utf8.size(); ++i) {
      const uint8_t c = uint8_t(utf8[i]);
      if (c < 0x80) {
        out.push_back(char(c));
      } else if ((c & 0xe0) == 0xc0 && c <= 0xc3 && i + 1 < utf8.size()) {
        out.push_back(char(((c & 0x03) << 6) | (uint8_t(utf8[++i]) & 0x3f)));
      } else {
        fail("_codecs.encode of a code point above 255");
      }
    }
    return out;
  }
  void append_to(const PyRef& target, const std::vector<PyRef>& vs) {
    if (!target->is(PyValue::Kind::list)) fail("APPEND to " + target->describe());
    target->items.insert(target->items.end(), vs.begin(), vs.end());
  }
  void set_items(const PyRef& target, const std::vector<PyRef>& kv) {
    if (kv.size() % 2) fail("SETITEMS with an odd number of values");
    if (!target->is(PyValue::Kind::dict) && !target->is(PyValue::Kind::object))
      fail("SETITEM on " + target->describe());
    for (size_t i = 0; i < kv.size(); i += 2) target->entries.emplace_back(kv[i], kv[i + 1]);
  }
  void push(PyRef v) { stack_.push_back(std::move(v)); }
  PyRef top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("stack underflow");
    return stack_.back();
  }
  PyRef pop() {
    PyRef v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<PyRef> pop_mark() {
    if (marks_.empty()) fail("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> items(stack_.begin() + long(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  PyRef memo(uint64_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) fail("memo entry " + std::to_string(k) + " never stored");
    return it->second;
  }
  PyRef stop() {
    if (stack_.size() != 1 || !marks_.empty())
      fail("STOP with " + std::to_string(stack_.size()) + " values on the stack");
    return stack_.back();
  }

  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0, op_at_ = 0;
  const std::string& what_;
  const PickleHooks& hooks_;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PyRef> memo_;
};

}  // namespace

PyRef py_none() { return make(PyValue::Kind::none); }

PyRef py_int(int64_t v) {
  PyRef r = make(PyValue::Kind::integer);
  r->integer = v;
  return r;
}

PyRef py_string(std::string s) {
  PyRef r = make(PyValue::Kind::string);
  r->text = std::move(s);
  return r;
}

std::string PyValue::qualified_name() const {
  if (kind == Kind::global) return text + "." + name;
  if (kind == Kind::object && callable) return callable->qualified_name();
  return "";
}

PyRef PyValue::get(const std::string& key) const {
  const std::vector<std::pair<PyRef, PyRef>>* e = &entries;
  if (kind == Kind::object && state && state->kind == Kind::dict) e = &state->entries;
  for (auto it = e->rbegin(); it != e->rend(); ++it)  // the last assignment wins, as in a dict
    if (it->first->kind == Kind::string && it->first->text == key) return it->second;
  return nullptr;
}

std::string PyValue::describe() const {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return boolean ? "True" : "False";
    case Kind::integer: return "int " + std::to_string(integer);
    case Kind::floating: {
      std::ostringstream os;
      os << "float " << floating;
      return os.str();
    }
    case Kind::string: return "str '" + text + "'";
    case Kind::bytes: return "bytes of " + std::to_string(text.size());
    case Kind::list: return "list of " + std::to_string(items.size());
    case Kind::tuple: return "tuple of " + std::to_string(items.size());
    case Kind::dict: return "dict of " + std::to_string(entries.size());
    case Kind::global: return "global " + qualified_name();
    case Kind::object: return qualified_name() + " object";
    case Kind::opaque: return "tensor";
  }
  return "?";
}

PyRef unpickle(const uint8_t* data, size_t n, const std::string& what, const PickleHooks& hooks) {
  return Unpickler(data, n, what, hooks).run();
}

namespace {
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
}  // namespace

PickleWriter::PickleWriter() : out_("\x80\x02", 2) {}

PickleWriter& PickleWriter::none() {
  out_.push_back('N');
  return *this;
}

PickleWriter& PickleWriter::boolean(bool v) {
  out_.push_back(char(v ? 0x88 : 0x89));
  return *this;
}

PickleWriter& PickleWriter::integer(int64_t v) {
  if (v >= 0 && v < 256) {
    out_.push_back('K');
    put_le(out_, uint64_t(v), 1);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_.push_back('J');
    put_le(out_, uint64_t(uint32_t(int32_t(v))), 4);
  } else {  // LONG1: 8 bytes of two's complement
    out_.push_back(char(0x8a));
    out_.push_back(char(8));
    put_le(out_, uint64_t(v), 8);
  }
  return *this;
}

PickleWriter& PickleWriter::floating(double v) {
  out_.push_back('G');
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  for (int i = 7; i >= 0; --i) out_.push_back(char((bits >> (8 * i)) & 0xff));  // big-endian
  return *this;
}

PickleWriter& PickleWriter::string(const std::string& utf8) {
  out_.push_back('X');
  put_le(out_, utf8.size(), 4);
  out_ += utf8;
  return *this;
}

PickleWriter& PickleWriter::global(const std::string& module, const std::string& name) {
  out_ += "c" + module + "\n" + name + "\n";
  return *this;
}

PickleWriter& PickleWriter::mark() {
  out_.push_back('(');
  return *this;
}

PickleWriter& PickleWriter::tuple() {
  out_.push_back('t');
  return *this;
}

PickleWriter& PickleWriter::empty_tuple() {
  out_.push_back(')');
  return *this;
}

PickleWriter& PickleWriter::empty_dict() {
  out_.push_back('}');
  return *this;
}

PickleWriter& PickleWriter::empty_list() {
  out_.push_back(']');
  return *this;
}

PickleWriter& PickleWriter::set_items() {
  out_.push_back('u');
  return *this;
}

PickleWriter& PickleWriter::append_items() {
  out_.push_back('e');
  return *this;
}

PickleWriter& PickleWriter::reduce() {
  out_.push_back('R');
  return *this;
}

PickleWriter& PickleWriter::newobj() {
  out_.push_back(char(0x81));
  return *this;
}

PickleWriter& PickleWriter::build() {
  out_.push_back('b');
  return *this;
}

PickleWriter& PickleWriter::persistent_id() {
  out_.push_back('Q');
  return *this;
}

std::string PickleWriter::finish() {
  out_.push_back('.');
  return std::move(out_);
}

}  // namespace lattice
