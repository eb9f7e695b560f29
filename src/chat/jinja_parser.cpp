#include "chat/jinja_parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "core/error.h"

namespace lattice::jinja {
namespace {

// "'a'", "'a' or 'b'", "'a', 'b' or 'c'"
std::string quoted_list(const std::vector<std::string>& xs) {
  std::string out;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) out += i + 1 == xs.size() ? " or " : ", ";
    out += "'" + xs[i] + "'";
  }
  return out;
}

ExprPtr make_expr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

StmtPtr make_stmt(Stmt::Kind kind, int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->line = line;
  return s;
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& name) : t_(tokens), name_(name) {}

  Body parse_template() { return subparse({}); }

 private:
  // ---- token stream ----
  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& tk = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return tk;
  }
  static bool is_op(const Token& tk, const char* op) { return tk.kind == TokenKind::kOperator && tk.value == op; }
  static bool is_name(const Token& tk, const char* n) { return tk.kind == TokenKind::kName && tk.value == n; }
  bool at_op(const char* op) const { return is_op(cur(), op); }
  bool at_name(const char* n) const { return is_name(cur(), n); }
  bool skip_op(const char* op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!at_name(n)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(int line, const std::string& what) const {
    LATTICE_FAIL() << name_ << " line " << line << ": " << what;
  }
  [[noreturn]] void fail_expected(const std::string& what) const {
    fail(cur().line, "expected " + what + ", got " + describe(cur()));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail_expected(std::string("'") + op + "'");
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::kName) fail_expected("a name");
    return next().value;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::kBlockEnd) fail_expected("end of statement block");
    next();
  }

  // ---- statements ----
  struct OpenBlock {
    std::string tag;
    int line;
    std::vector<std::string> ends;
  };

  // Statements up to a block tag named in `ends`, which is left as the current token.
  Body subparse(const std::vector<std::string>& ends) {
    Body body;
    for (;;) {
      const Token& tk = cur();
      switch (tk.kind) {
        case TokenKind::kText: {
          auto s = make_stmt(Stmt::Kind::kText, tk.line);
          s->text = tk.value;
          body.push_back(std::move(s));
          next();
          break;
        }
        case TokenKind::kVarBegin: {
          next();
          auto s = make_stmt(Stmt::Kind::kOutput, tk.line);
          s->expr = parse_tuple(true);
          if (cur().kind != TokenKind::kVarEnd) fail_expected("end of print statement");
          next();
          body.push_back(std::move(s));
          break;
        }
        case TokenKind::kBlockBegin: {
          next();
          if (cur().kind != TokenKind::kName) fail_expected("a tag name");
          if (std::find(ends.begin(), ends.end(), cur().value) != ends.end()) return body;
          body.push_back(parse_statement());
          break;
        }
        case TokenKind::kEof:
          if (!ends.empty())
            fail(tk.line, "unexpected end of template, expected " + quoted_list(ends) + " (the '" + open_.back().tag +
                              "' on line " + std::to_string(open_.back().line) + " is not closed)");
          return body;
        default:
          fail(tk.line, "unexpected " + describe(tk));
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& tag = cur();
    const std::string& t = tag.value;
    if (t == "if") return parse_if();
    if (t == "for") return parse_for();
    if (t == "set") return parse_set();
    if (t == "macro") return parse_macro();
    if (t == "filter") return parse_filter_block();
    if (t == "with") return parse_with();
    if (t == "generation") return parse_generation();
    if (t == "break" || t == "continue") {
      int line = next().line;
      if (loop_depth_ == 0) fail(line, "'" + t + "' outside of a loop");
      expect_block_end();
      return make_stmt(t == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, line);
    }
    static const std::vector<std::string> kInnerTags = {"elif",     "else",      "endif",   "endfor",        "endset",
                                                        "endmacro", "endfilter", "endwith", "endgeneration", "endraw"};
    if (std::find(kInnerTags.begin(), kInnerTags.end(), t) != kInnerTags.end()) {
      if (open_.empty()) fail(tag.line, "unexpected '" + t + "'");
      fail(tag.line, "unexpected '" + t + "', expected " + quoted_list(open_.back().ends) + " (the '" +
                         open_.back().tag + "' on line " + std::to_string(open_.back().line) + " is not closed)");
    }
    static const std::vector<std::string> kUnsupported = {"include", "import", "from",      "extends",
                                                          "block",   "call",   "autoescape"};
    if (std::find(kUnsupported.begin(), kUnsupported.end(), t) != kUnsupported.end())
      fail(tag.line, "the '" + t + "' tag is not supported");
    fail(tag.line, "unknown tag '" + t + "'");
  }

  // Parses the body of a block opened by `tag` up to one of `ends`; returns the end tag met, consumed.
  std::string block_body(const std::string& tag, int line, const std::vector<std::string>& ends, Body& body) {
    open_.push_back({tag, line, ends});
    body = subparse(ends);
    open_.pop_back();
    return next().value;
  }

  StmtPtr parse_if() {
    auto s = make_stmt(Stmt::Kind::kIf, next().line);
    ExprPtr cond = parse_tuple(false);
    for (;;) {
      expect_block_end();
      Body body;
      std::string end = block_body("if", s->line, {"elif", "else", "endif"}, body);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_tuple(false);
        continue;
      }
      if (end == "else") {
        expect_block_end();
        block_body("if", s->line, {"endif"}, s->else_body);
      }
      expect_block_end();
      return s;
    }
  }

  // `a`, `a, b`, `(a, b)`; with `ns.attr` when allowed.
  Target parse_target(bool allow_attribute) {
    Target target;
    if (allow_attribute && cur().kind == TokenKind::kName && is_op(look(), ".")) {
      target.names.push_back(next().value);
      next();
      target.attribute = expect_name();
      return target;
    }
    bool parens = skip_op("(");
    for (;;) {
      target.names.push_back(expect_name());
      if (!skip_op(",")) break;
      target.unpack = true;
      if (cur().kind != TokenKind::kName) break;  // trailing comma
    }
    if (parens) {
      expect_op(")");
      target.unpack = true;
    }
    return target;
  }

  StmtPtr parse_for() {
    auto s = make_stmt(Stmt::Kind::kFor, next().line);
    s->target = parse_target(false);
    if (!skip_name("in")) fail_expected("'in'");
    s->expr = parse_tuple(false, "recursive");
    if (skip_name("if")) s->cond = parse_expression(true);
    if (at_name("recursive")) fail(cur().line, "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    open_.push_back({"for", s->line, {"endfor", "else"}});
    s->body = subparse({"endfor", "else"});
    open_.pop_back();
    --loop_depth_;
    if (next().value == "else") {
      expect_block_end();
      block_body("for", s->line, {"endfor"}, s->else_body);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    int line = next().line;
    Target target = parse_target(true);
    if (skip_op("=")) {
      auto s = make_stmt(Stmt::Kind::kSet, line);
      s->target = std::move(target);
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    auto s = make_stmt(Stmt::Kind::kSetBlock, line);
    s->target = std::move(target);
    if (at_op("|")) s->expr = parse_filters(nullptr);
    expect_block_end();
    block_body("set", line, {"endset"}, s->body);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(Stmt::Kind::kMacro, next().line);
    s->name = expect_name();
    expect_op("(");
    bool defaults = false;
    while (!at_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (at_op(")")) break;
      std::string param = expect_name();
      ExprPtr def;
      if (skip_op("=")) {
        def = parse_expression(true);
        defaults = true;
      } else if (defaults) {
        fail(cur().line, "non-default argument follows default argument");
      }
      s->params.emplace_back(std::move(param), std::move(def));
    }
    expect_op(")");
    expect_block_end();
    int saved_depth = loop_depth_;
    loop_depth_ = 0;
    block_body("macro", s->line, {"endmacro"}, s->body);
    loop_depth_ = saved_depth;
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = make_stmt(Stmt::Kind::kFilterBlock, cur().line);
    s->expr = parse_filters(nullptr);  // the current token is the name `filter`, taken as the `|`
    expect_block_end();
    block_body("filter", s->line, {"endfilter"}, s->body);
    expect_block_end();
    return s;
  }

  StmtPtr parse_with() {
    auto s = make_stmt(Stmt::Kind::kScope, next().line);
    while (cur().kind != TokenKind::kBlockEnd) {
      if (!s->params.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      s->params.emplace_back(std::move(name), parse_expression(true));
    }
    expect_block_end();
    block_body("with", s->line, {"endwith"}, s->body);
    expect_block_end();
    return s;
  }

  StmtPtr parse_generation() {
    auto s = make_stmt(Stmt::Kind::kScope, next().line);
    expect_block_end();
    block_body("generation", s->line, {"endgeneration"}, s->body);
    expect_block_end();
    return s;
  }

  // ---- expressions (jinja2's parser, function for function) ----
  bool is_tuple_end(const char* extra_end) const {
    const Token& tk = cur();
    return tk.kind == TokenKind::kVarEnd || tk.kind == TokenKind::kBlockEnd || is_op(tk, ")") ||
           (extra_end && is_name(tk, extra_end));
  }

  // `a`, or `a, b, ...` as a tuple.
  ExprPtr parse_tuple(bool with_condexpr, const char* extra_end = nullptr, bool explicit_parens = false) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(parse_expression(with_condexpr));
      if (at_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail(cur().line, "expected an expression, got " + describe(cur()));
    }
    auto e = make_expr(Expr::Kind::kTuple, line);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      int line = next().line;
      auto e = make_expr(Expr::Kind::kCondExpr, line);
      ExprPtr cond = parse_or();
      e->items.push_back(std::move(cond));
      e->items.push_back(std::move(expr));
      e->items.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr binary(Op op, int line, ExprPtr a, ExprPtr b) {
    auto e =
        make_expr(op == Op::kNot || op == Op::kNeg || op == Op::kPos ? Expr::Kind::kUnary : Expr::Kind::kBinary, line);
    e->op = op;
    e->items.push_back(std::move(a));
    if (b) e->items.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      int line = next().line;
      left = binary(Op::kOr, line, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      int line = next().line;
      left = binary(Op::kAnd, line, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      int line = next().line;
      return binary(Op::kNot, line, parse_not(), nullptr);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    std::unique_ptr<Expr> cmp;
    for (;;) {
      Op op;
      const Token& tk = cur();
      if (is_op(tk, "==")) {
        op = Op::kEq;
      } else if (is_op(tk, "!=")) {
        op = Op::kNe;
      } else if (is_op(tk, "<")) {
        op = Op::kLt;
      } else if (is_op(tk, "<=")) {
        op = Op::kLe;
      } else if (is_op(tk, ">")) {
        op = Op::kGt;
      } else if (is_op(tk, ">=")) {
        op = Op::kGe;
      } else if (is_name(tk, "in")) {
        op = Op::kIn;
      } else if (is_name(tk, "not") && is_name(look(), "in")) {
        next();
        op = Op::kNotIn;
      } else {
        break;
      }
      next();
      if (!cmp) {
        cmp = make_expr(Expr::Kind::kCompare, line);
        cmp->items.push_back(std::move(expr));
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& tk = next();
      left = binary(tk.value == "+" ? Op::kAdd : Op::kSub, tk.line, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_op("~")) {
      int line = next().line;
      left = binary(Op::kConcat, line, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& tk = next();
      Op op = tk.value == "*" ? Op::kMul : tk.value == "/" ? Op::kDiv : tk.value == "//" ? Op::kFloorDiv : Op::kMod;
      left = binary(op, tk.line, std::move(left), parse_pow());
    }
    return left;
  }

  // jinja2's ** is left-associative: 2 ** 3 ** 2 == 64.
  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      int line = next().line;
      left = binary(Op::kPow, line, std::move(left), parse_unary(true));
    }
    return left;
  }

  // A unary minus binds tighter than filters: -x|abs is abs(-x).
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      const Token& tk = next();
      node = binary(tk.value == "-" ? Op::kNeg : Op::kPos, tk.line, parse_unary(false), nullptr);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    int line = tk.line;
    if (tk.kind == TokenKind::kName) {
      next();
      if (tk.value == "true" || tk.value == "True") return literal(Value(true), line);
      if (tk.value == "false" || tk.value == "False") return literal(Value(false), line);
      if (tk.value == "none" || tk.value == "None") return literal(Value::none(), line);
      auto e = make_expr(Expr::Kind::kName, line);
      e->name = tk.value;
      return e;
    }
    if (tk.kind == TokenKind::kString) {
      std::string s;
      while (cur().kind == TokenKind::kString) s += next().value;  // adjacent literals concatenate
      return literal(Value(std::move(s)), line);
    }
    if (tk.kind == TokenKind::kInt) return literal(Value(parse_int(next())), line);
    if (tk.kind == TokenKind::kFloat) return literal(Value(std::strtod(next().value.c_str(), nullptr)), line);
    if (is_op(tk, "(")) {
      next();
      ExprPtr e = parse_tuple(true, nullptr, true);
      expect_op(")");
      return e;
    }
    if (is_op(tk, "[")) {
      next();
      auto e = make_expr(Expr::Kind::kList, line);
      while (!at_op("]")) {
        if (!e->items.empty()) expect_op(",");
        if (at_op("]")) break;
        e->items.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op(tk, "{")) {
      next();
      auto e = make_expr(Expr::Kind::kDict, line);
      while (!at_op("}")) {
        if (!e->items.empty()) expect_op(",");
        if (at_op("}")) break;
        e->items.push_back(parse_expression(true));
        expect_op(":");
        e->items.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    fail(line, "unexpected " + describe(tk));
  }

  ExprPtr literal(Value v, int line) {
    auto e = make_expr(Expr::Kind::kLiteral, line);
    e->value = std::move(v);
    return e;
  }

  int64_t parse_int(const Token& tk) {
    const std::string& s = tk.value;
    int base = 10;
    size_t skip = 0;
    if (s.size() > 2 && s[0] == '0') {
      char b = char(s[1] | 0x20);
      base = b == 'x' ? 16 : b == 'o' ? 8 : b == 'b' ? 2 : 10;
      if (base != 10) skip = 2;
    }
    int64_t v = 0;
    auto res = std::from_chars(s.data() + skip, s.data() + s.size(), v, base);
    if (res.ec != std::errc()) fail(tk.line, "integer literal out of range: " + s);
    return v;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    for (;;) {
      if (at_op(".") || at_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    for (;;) {
      if (at_op("|")) {
        node = parse_filters(std::move(node));
      } else if (at_name("is")) {
        node = parse_test(std::move(node));
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& tk = next();
    if (tk.value == ".") {
      const Token& attr = next();
      if (attr.kind == TokenKind::kName) {
        auto e = make_expr(Expr::Kind::kGetAttr, tk.line);
        e->name = attr.value;
        e->items.push_back(std::move(node));
        return e;
      }
      if (attr.kind != TokenKind::kInt) fail(attr.line, "expected name or number");
      auto e = make_expr(Expr::Kind::kGetItem, tk.line);
      e->items.push_back(std::move(node));
      e->items.push_back(literal(Value(parse_int(attr)), attr.line));
      return e;
    }
    // '['
    std::vector<ExprPtr> args;
    ExprPtr slice;
    while (!at_op("]")) {
      if (!args.empty() || slice) expect_op(",");
      ExprPtr start;
      if (!at_op(":")) {
        start = parse_expression(true);
        if (!at_op(":")) {
          args.push_back(std::move(start));
          continue;
        }
      }
      // a slice: [start]:[stop][:[step]]
      next();
      if (slice || !args.empty()) fail(tk.line, "a slice must be the only subscript");
      slice = make_expr(Expr::Kind::kSlice, tk.line);
      slice->items.push_back(nullptr);  // the sliced value, filled below
      slice->items.push_back(std::move(start));
      slice->items.push_back(at_op("]") || at_op(",") || at_op(":") ? nullptr : parse_expression(true));
      ExprPtr step;
      if (skip_op(":") && !at_op("]") && !at_op(",")) step = parse_expression(true);
      slice->items.push_back(std::move(step));
    }
    expect_op("]");
    if (slice) {
      slice->items[0] = std::move(node);
      return slice;
    }
    if (args.empty()) fail(tk.line, "expected an expression, got '['");
    auto e = make_expr(Expr::Kind::kGetItem, tk.line);
    e->items.push_back(std::move(node));
    if (args.size() == 1) {
      e->items.push_back(std::move(args[0]));
    } else {
      auto tuple = make_expr(Expr::Kind::kTuple, tk.line);
      tuple->items = std::move(args);
      e->items.push_back(std::move(tuple));
    }
    return e;
  }

  // `(a, b, key=c)` into e->items (after what is already there) and e->kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!at_op(")")) {
      if (!first) {
        expect_op(",");
        if (at_op(")")) break;
      }
      first = false;
      if (at_op("*") || at_op("**")) fail(cur().line, "*args and **kwargs in calls are not supported");
      if (cur().kind == TokenKind::kName && is_op(look(), "=")) {
        std::string key = next().value;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail(cur().line, "invalid syntax for function call expression");
        e.items.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make_expr(Expr::Kind::kCall, cur().line);
    e->items.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  // `| f | g(x)`, with the current token taken as the first `|` (in `{% filter f %}` it is the tag name).
  ExprPtr parse_filters(ExprPtr node) {
    do {
      int line = next().line;
      auto e = make_expr(Expr::Kind::kFilter, line);
      e->name = expect_name();
      while (at_op(".")) {
        next();
        e->name += '.';
        e->name += expect_name();
      }
      e->items.push_back(std::move(node));
      if (at_op("(")) parse_call_args(*e);
      node = std::move(e);
    } while (at_op("|"));
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    int line = next().line;  // 'is'
    auto e = make_expr(Expr::Kind::kTest, line);
    e->negated = skip_name("not");
    e->name = expect_name();
    while (at_op(".")) {
      next();
      e->name += '.';
      e->name += expect_name();
    }
    e->items.push_back(std::move(node));
    const Token& tk = cur();
    if (is_op(tk, "(")) {
      parse_call_args(*e);
    } else if ((tk.kind == TokenKind::kName || tk.kind == TokenKind::kString || tk.kind == TokenKind::kInt ||
                tk.kind == TokenKind::kFloat || is_op(tk, "[") || is_op(tk, "{")) &&
               !is_name(tk, "else") && !is_name(tk, "or") && !is_name(tk, "and")) {
      if (is_name(tk, "is")) fail(tk.line, "you cannot chain multiple tests with is");
      e->items.push_back(parse_postfix(parse_primary()));  // `x is divisibleby 3`
    }
    return e;
  }

  const std::vector<Token>& t_;
  const std::string& name_;
  size_t i_ = 0;
  std::vector<OpenBlock> open_;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name) { return Parser(tokens, name).parse_template(); }

}  // namespace lattice::jinja
