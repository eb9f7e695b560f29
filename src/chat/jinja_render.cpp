// Renders the syntax tree: evaluates expressions and runs statements with jinja2's scoping.
#include <algorithm>
#include <unordered_map>

#include "chat/jinja.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"
#include "chat/jinja_lexer.h"
#include "chat/jinja_parser.h"
#include "core/error.h"

namespace lattice::jinja {
namespace {

// A runtime error with the line of the innermost expression or statement where it happened.
struct LocatedError {
  int line;
  std::string message;
};

// Variables of one scope: the template's top level, one for-loop iteration, one macro call, a with block.
struct Scope {
  Scope* parent = nullptr;
  size_t index = 0;  // in Renderer::scopes_
  std::unordered_map<std::string, Value> vars;
};

class Renderer {
 public:
  enum class Flow { kNormal, kBreak, kContinue };

  // Runs `body` in `scope`, appending to `out`; returns how a break/continue left it.
  Flow render(const Body& body, Scope& scope, std::string& out) {
    for (const StmtPtr& s : body) {
      Flow flow;
      try {
        flow = render_stmt(*s, scope, out);
      } catch (const RuntimeError& e) {
        throw LocatedError{s->line, e.what()};
      }
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Scope& new_scope(Scope* parent) {
    scopes_.push_back(std::make_unique<Scope>());
    scopes_.back()->parent = parent;
    scopes_.back()->index = scopes_.size() - 1;
    return *scopes_.back();
  }

  // Frees the scopes made since `mark` (finished loop iterations and macro calls), but not one a macro was
  // defined in (nor those before it): the macro may still be called.
  void release_scopes(size_t mark) {
    size_t keep = std::max(mark, pinned_);
    if (keep < scopes_.size()) scopes_.resize(keep);
  }

 private:
  static Value lookup(const Scope& scope, const std::string& name) {
    for (const Scope* s = &scope; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    if (const Value* g = find_global(name)) return *g;
    return Value::undefined("'" + name + "' is undefined");
  }

  Value eval(const Expr& e, Scope& scope) {
    try {
      return eval_inner(e, scope);
    } catch (const RuntimeError& err) {
      throw LocatedError{e.line, err.what()};
    }
  }

  CallArgs eval_args(const Expr& e, size_t first, Scope& scope) {
    CallArgs args;
    for (size_t i = first; i < e.items.size(); ++i) args.positional.push_back(eval(*e.items[i], scope));
    for (const auto& [key, value] : e.kwargs) args.keyword.emplace_back(key, eval(*value, scope));
    return args;
  }

  // A filter applied to its input; `base` is the input of a chain with no input expression ({% filter %}).
  Value eval_filter(const Expr& e, Scope& scope, const Value* base) {
    const Expr* input = e.items[0].get();
    Value v = !input                               ? *base
              : input->kind == Expr::Kind::kFilter ? eval_filter(*input, scope, base)
                                                   : eval(*input, scope);
    CallArgs args = eval_args(e, 1, scope);
    try {
      return apply_filter(e.name, v, args);
    } catch (const RuntimeError& err) {
      throw LocatedError{e.line, err.what()};
    }
  }

  Value eval_inner(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return lookup(scope, e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        items.reserve(e.items.size());
        for (const ExprPtr& x : e.items) items.push_back(eval(*x, scope));
        return Value(std::move(items), e.kind == Expr::Kind::kTuple ? SequenceKind::kTuple : SequenceKind::kList);
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          Value key = eval(*e.items[i], scope);
          if ((key.is_list() && key.seq_kind() != SequenceKind::kTuple) || key.is_dict() || key.is_undefined())
            throw RuntimeError("unhashable type: '" + key.type_name() + "'");
          d.set(std::move(key), eval(*e.items[i + 1], scope));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::kGetAttr:
        return get_attr(eval(*e.items[0], scope), e.name);
      case Expr::Kind::kGetItem: {
        Value obj = eval(*e.items[0], scope);
        return get_item(obj, eval(*e.items[1], scope));
      }
      case Expr::Kind::kSlice: {
        Value obj = eval(*e.items[0], scope);
        Value parts[3];
        for (int i = 0; i < 3; ++i)
          parts[i] = e.items[size_t(i) + 1] ? eval(*e.items[size_t(i) + 1], scope) : Value::none();
        return slice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Kind::kCall: {
        Value callee = eval(*e.items[0], scope);
        CallArgs args = eval_args(e, 1, scope);
        if (++depth_ > kMaxDepth) throw RuntimeError("maximum recursion depth exceeded");
        Value result = call(callee, args);
        --depth_;
        return result;
      }
      case Expr::Kind::kFilter:
        return eval_filter(e, scope, nullptr);
      case Expr::Kind::kTest: {
        Value v = eval(*e.items[0], scope);
        CallArgs args = eval_args(e, 1, scope);
        return Value(apply_test(e.name, v, args) != e.negated);
      }
      case Expr::Kind::kUnary:
        return unary_op(e.op, eval(*e.items[0], scope));
      case Expr::Kind::kBinary: {
        Value a = eval(*e.items[0], scope);
        if (e.op == Op::kAnd) return a.truthy() ? eval(*e.items[1], scope) : a;
        if (e.op == Op::kOr) return a.truthy() ? a : eval(*e.items[1], scope);
        Value b = eval(*e.items[1], scope);
        return binary_op(e.op, a, b);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.items[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.items[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kCondExpr:
        if (eval(*e.items[0], scope).truthy()) return eval(*e.items[1], scope);
        if (e.items[2]) return eval(*e.items[2], scope);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
    }
    return Value();
  }

  static void assign(const Target& target, const Value& v, Scope& scope) {
    if (!target.unpack) {
      scope.vars[target.names[0]] = v;
      return;
    }
    std::vector<Value> items = iterate(v);
    size_t n = target.names.size();
    if (items.size() > n) throw RuntimeError("too many values to unpack (expected " + std::to_string(n) + ")");
    if (items.size() < n)
      throw RuntimeError("not enough values to unpack (expected " + std::to_string(n) + ", got " +
                         std::to_string(items.size()) + ")");
    for (size_t i = 0; i < n; ++i) scope.vars[target.names[i]] = items[i];
  }

  void set_value(const Target& target, const Value& v, Scope& scope) {
    if (target.attribute.empty()) {
      assign(target, v, scope);
      return;
    }
    Value ns = lookup(scope, target.names[0]);
    if (!ns.is_object() || !ns.object().assignable)
      throw RuntimeError("cannot assign attribute on non-namespace object");
    ns.object().attrs.set(Value(target.attribute), v);
  }

  Flow render_for(const Stmt& s, Scope& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*s.expr, scope));
    size_t mark = scopes_.size();
    if (s.cond) {  // `for x in xs if cond`: the loop (and loop.length) sees only the items that pass
      std::vector<Value> kept;
      for (Value& item : items) {
        Scope& test_scope = new_scope(&scope);
        assign(s.target, item, test_scope);
        if (eval(*s.cond, test_scope).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
      release_scopes(mark);
    }
    if (items.empty()) {
      Scope& else_scope = new_scope(&scope);
      Flow flow = render(s.else_body, else_scope, out);
      release_scopes(mark);
      return flow;
    }
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Scope& iter_scope = new_scope(&scope);  // a set in the body does not outlive the iteration
      assign(s.target, items[size_t(i)], iter_scope);
      auto loop = std::make_shared<ObjectData>();
      loop->type_name = "LoopContext";
      Dict& a = loop->attrs;
      a.append(Value("index"), Value(i + 1));
      a.append(Value("index0"), Value(i));
      a.append(Value("revindex"), Value(n - i));
      a.append(Value("revindex0"), Value(n - i - 1));
      a.append(Value("first"), Value(i == 0));
      a.append(Value("last"), Value(i == n - 1));
      a.append(Value("length"), Value(n));
      a.append(Value("depth"), Value(1));
      a.append(Value("depth0"), Value(0));
      if (i > 0) a.append(Value("previtem"), items[size_t(i - 1)]);
      if (i + 1 < n) a.append(Value("nextitem"), items[size_t(i + 1)]);
      a.append(Value("cycle"), Value::function("cycle", [i](const CallArgs& args) {
                 if (args.positional.empty()) throw RuntimeError("no items for cycling given");
                 return args.positional[size_t(i) % args.positional.size()];
               }));
      iter_scope.vars["loop"] = Value::object(std::move(loop));
      Flow flow = render(s.body, iter_scope, out);
      release_scopes(mark);
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  // A macro is a function that renders its body in a new scope under the one it was defined in.
  Value make_macro(const Stmt& s, Scope& defining) {
    pinned_ = std::max(pinned_, defining.index + 1);
    Scope* parent = &defining;
    return Value::function(s.name, [this, &s, parent](const CallArgs& args) {
      size_t mark = scopes_.size();
      Scope& ms = new_scope(parent);
      std::vector<Value> varargs;
      for (size_t i = 0; i < args.positional.size(); ++i) {
        if (i < s.params.size()) {
          ms.vars[s.params[i].first] = args.positional[i];
        } else {
          varargs.push_back(args.positional[i]);
        }
      }
      Dict kwargs;
      for (const auto& [key, value] : args.keyword) {
        bool is_param = false;
        for (const auto& p : s.params) is_param = is_param || p.first == key;
        if (!is_param) {
          kwargs.set(Value(key), value);
          continue;
        }
        if (ms.vars.count(key))
          throw RuntimeError("macro '" + s.name + "' got multiple values for argument '" + key + "'");
        ms.vars[key] = value;
      }
      for (const auto& [name, def] : s.params) {  // defaults are evaluated at call time, in the macro's scope
        if (ms.vars.count(name)) continue;
        ms.vars[name] = def ? eval(*def, ms) : Value::undefined("parameter '" + name + "' was not provided");
      }
      ms.vars["varargs"] = Value(std::move(varargs), SequenceKind::kTuple);
      ms.vars["kwargs"] = Value(std::move(kwargs));
      std::string out;
      render(s.body, ms, out);
      release_scopes(mark);
      return Value(std::move(out));
    });
  }

  Flow render_stmt(const Stmt& s, Scope& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out += eval(*s.expr, scope).str();
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond, scope).truthy()) return render(body, scope, out);
        return render(s.else_body, scope, out);
      case Stmt::Kind::kFor:
        return render_for(s, scope, out);
      case Stmt::Kind::kSet:
        set_value(s.target, eval(*s.expr, scope), scope);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string text;
        render(s.body, new_scope(&scope), text);
        Value v(std::move(text));
        set_value(s.target, s.expr ? eval_filter(*s.expr, scope, &v) : v, scope);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope.vars[s.name] = make_macro(s, scope);
        return Flow::kNormal;
      case Stmt::Kind::kFilterBlock: {
        std::string text;
        render(s.body, new_scope(&scope), text);
        Value v(std::move(text));
        out += eval_filter(*s.expr, scope, &v).str();
        return Flow::kNormal;
      }
      case Stmt::Kind::kScope: {
        Scope& inner = new_scope(&scope);
        for (const auto& [name, value] : s.params) inner.vars[name] = eval(*value, scope);
        return render(s.body, inner, out);
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  static constexpr int kMaxDepth = 500;
  std::vector<std::unique_ptr<Scope>> scopes_;  // all live scopes, parents first; macros point into them
  size_t pinned_ = 0;                           // scopes_[0, pinned_) hold macros: never freed
  int depth_ = 0;
};

}  // namespace

struct Template::Impl {
  std::string name;
  Body body;
};

Template::Template(std::string_view source, std::string name) {
  auto impl = std::make_shared<Impl>();
  impl->name = std::move(name);
  impl->body = parse(tokenize(source, impl->name), impl->name);
  impl_ = std::move(impl);
}

Template::~Template() = default;
Template::Template(const Template&) = default;
Template& Template::operator=(const Template&) = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

const std::string& Template::name() const { return impl_->name; }

namespace {
template <typename Json>
std::string render_json(const std::string& name, const Body& body, const Json& variables) {
  if (!variables.is_object() && !variables.is_null())
    LATTICE_FAIL() << name << ": the variables to render with must be a JSON object";
  Renderer renderer;
  Scope& root = renderer.new_scope(nullptr);
  if (variables.is_object())
    for (auto it = variables.begin(); it != variables.end(); ++it) root.vars[it.key()] = from_json(it.value());
  std::string out;
  try {
    renderer.render(body, root, out);
  } catch (const LocatedError& e) {
    LATTICE_FAIL() << name << " line " << e.line << ": " << e.message;
  } catch (const RaisedException& e) {
    LATTICE_FAIL() << name << ": " << e.what();
  } catch (const RuntimeError& e) {
    LATTICE_FAIL() << name << ": " << e.what();
  }
  return out;
}
}  // namespace

std::string Template::render(const nlohmann::json& variables) const {
  return render_json(impl_->name, impl_->body, variables);
}

std::string Template::render(const nlohmann::ordered_json& variables) const {
  return render_json(impl_->name, impl_->body, variables);
}

}  // namespace lattice::jinja
