// Tokens -> syntax tree, following jinja2's grammar and operator precedence.
#pragma once
#include <string>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace lattice::jinja {

// The template's statements. Throws lattice::Error "<name> line L: <what>" on a syntax error.
Body parse(const std::vector<Token>& tokens, const std::string& name);

}  // namespace lattice::jinja
