// Template source -> tokens, as jinja2's lexer does with trim_blocks=True and lstrip_blocks=True: text between
// tags, `{{ }}` and `{% %}` with the tokens of their expressions, comments dropped, `{% raw %}` bodies as text,
// and the whitespace control of `-` / `+` applied to the surrounding text.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace lattice::jinja {

enum class TokenKind {
  kText,        // template data, whitespace control already applied
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier (keywords too: if, in, not, ...)
  kString,      // string literal, escapes decoded
  kInt,         // integer literal, as written without '_'
  kFloat,       // float literal, as written without '_'
  kOperator,    // + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { } ;
  kEof,
};

struct Token {
  TokenKind kind;
  std::string value;
  int line;
};

// Throws lattice::Error "<name> line L: <what>" on a lexical error (unterminated comment or string, ...).
std::vector<Token> tokenize(std::string_view source, const std::string& name);

// What a token is, for error messages: "'endfor'", "end of print statement", "end of template", ...
std::string describe(const Token& token);

}  // namespace lattice::jinja
