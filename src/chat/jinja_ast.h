// The syntax tree of a template: expressions and statements, as jinja2's parser builds them.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace lattice::jinja {

enum class Op {
  // binary arithmetic; kConcat is ~
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kConcat,
  // short-circuit: return an operand, as Python does
  kAnd,
  kOr,
  // unary
  kNot,
  kNeg,
  kPos,
  // comparisons
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kIn,
  kNotIn,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using KeywordArgs = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // [items...]
    kTuple,     // (items...)
    kDict,      // {items[0]: items[1], items[2]: items[3], ...}
    kGetAttr,   // items[0].name
    kGetItem,   // items[0][items[1]]
    kSlice,     // items[0][items[1]:items[2]:items[3]], omitted parts null
    kCall,      // items[0](items[1..], kwargs)
    kFilter,    // items[0] | name(items[1..], kwargs); items[0] is null in {% filter %} and {% set x | f %}
    kTest,      // items[0] is [not] name(items[1..], kwargs); negated for `is not`
    kUnary,     // op items[0]
    kBinary,    // items[0] op items[1]
    kCompare,   // items[0] ops[0] items[1] ops[1] items[2] ... (chained as Python: a < b < c)
    kCondExpr,  // items[1] if items[0] else items[2]; items[2] null when there is no else (undefined)
  };
  Kind kind;
  int line;
  Value value;
  std::string name;
  std::vector<ExprPtr> items;
  KeywordArgs kwargs;
  Op op = Op::kAdd;
  std::vector<Op> ops;
  bool negated = false;
};

// Where `set` and `for` store values: one name, names to unpack a sequence into, or a namespace attribute.
struct Target {
  std::vector<std::string> names;
  bool unpack = false;    // `a, b` (even with one name: `a,`)
  std::string attribute;  // `ns.attr`: names[0] is the namespace
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches: (condition, body)...; the else branch has a null condition
    kFor,          // for target in expr [if cond]: body, else_body
    kSet,          // set target = expr
    kSetBlock,     // set target [| filter expr]: body endset
    kMacro,        // macro name(params): body
    kFilterBlock,  // filter expr: body
    kScope,        // with params: body (also transformers' {% generation %}: renders its body as is)
    kBreak,
    kContinue,
  };
  Kind kind;
  int line;
  std::string text;
  ExprPtr expr;
  Target target;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::string name;
  KeywordArgs params;  // macro parameters (default or null) and `with` assignments
};

}  // namespace lattice::jinja
