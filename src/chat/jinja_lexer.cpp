#include "chat/jinja_lexer.h"

#include <cctype>

#include "chat/jinja_value.h"
#include "core/error.h"

namespace lattice::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
int count_newlines(std::string_view s, size_t from, size_t to) {
  int n = 0;
  for (size_t i = from; i < to; ++i) n += s[i] == '\n';
  return n;
}

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body, as jinja2 applies it. Returns false on a
// truncated \x, \u or \U escape.
bool decode_escapes(std::string_view raw, std::string& out) {
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c != '\\' || i + 1 == raw.size()) {
      out += c;
      continue;
    }
    char e = raw[++i];
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
      case '\'':
      case '"':
        out += e;
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < digits; ++k) {
          if (i + 1 + k >= raw.size() || hex_value(raw[i + 1 + k]) < 0) return false;
          cp = cp * 16 + uint32_t(hex_value(raw[i + 1 + k]));
        }
        if (cp > 0x10FFFF) return false;
        out += utf8_encode(cp);
        i += digits;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {  // up to three octal digits
          uint32_t cp = 0;
          size_t k = 0;
          for (; k < 3 && i + k < raw.size() && raw[i + k] >= '0' && raw[i + k] <= '7'; ++k)
            cp = cp * 8 + uint32_t(raw[i + k] - '0');
          out += utf8_encode(cp);
          i += k - 1;
        } else {  // unknown escapes stay as written
          out += '\\';
          out += e;
        }
    }
  }
  return true;
}

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& name) : name_(name) {
    // jinja2 reads \r\n and \r as \n, and drops one trailing newline (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      size_t start = find_tag_start(pos_);
      if (start == std::string::npos) {
        add_text(pos_, n, 0);
        break;
      }
      char open = src_[start + 1];
      size_t p = start + 2;
      char sign = (p < n && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : 0;
      size_t raw_end = open == '%' ? match_raw_begin(p) : std::string::npos;
      // lstrip_blocks applies to block tags and comments, never to {{ }}.
      add_text(pos_, start, sign, open != '{');
      if (sign) ++p;
      if (raw_end != std::string::npos) {
        lex_raw(start, raw_end);
      } else if (open == '#') {
        lex_comment(p);
      } else {
        lex_tag(open, p);
      }
    }
    tokens_.push_back({TokenKind::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) {
    LATTICE_FAIL() << name_ << " line " << line << ": " << what;
  }

  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // Emits src_[from, to) as text. `sign` is the whitespace control of the tag that follows: '-' strips all
  // whitespace before it; otherwise, for block tags and comments (lstrip_blocks), spaces and tabs between the
  // start of the line and the tag go. Advances pos_ to `to` and counts lines over the unstripped text.
  void add_text(size_t from, size_t to, char sign, bool lstrip = false) {
    size_t end = to;
    if (sign == '-') {
      while (end > from && is_space(src_[end - 1])) --end;
    } else if (sign != '+' && lstrip) {
      size_t line_begin = from;
      for (size_t i = to; i > from; --i) {
        if (src_[i - 1] == '\n') {
          line_begin = i;
          break;
        }
      }
      if (line_begin > from || line_starting_) {
        bool blank = true;
        for (size_t i = line_begin; i < to && blank; ++i) blank = is_space(src_[i]);
        if (blank) end = line_begin;
      }
    }
    if (end > from) tokens_.push_back({TokenKind::kText, src_.substr(from, end - from), line_});
    line_ += count_newlines(src_, from, to);
    pos_ = to;
  }

  size_t skip_spaces(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    return p;
  }

  // The end of the tag that closes a block ("%}", "-%}", "+%}") at p, or npos. trim_blocks: a plain "%}" also
  // takes the newline after it; "-%}" takes all whitespace after it.
  size_t match_block_end(size_t p) const {
    if (src_.compare(p, 3, "-%}") == 0) return skip_spaces(p + 3);
    if (src_.compare(p, 3, "+%}") == 0) return p + 3;
    if (src_.compare(p, 2, "%}") == 0) return p + 2 + (p + 2 < src_.size() && src_[p + 2] == '\n');
    return std::string::npos;
  }

  // `{% raw %}` at the tag start (p is after "{%"): the end of the tag, or npos. Unlike other block tags its
  // "%}" does not take the newline after it.
  size_t match_raw_begin(size_t p) const {
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_spaces(p);
    if (src_.compare(p, 3, "raw") != 0) return std::string::npos;
    p = skip_spaces(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_spaces(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  void finish_tag(size_t start, size_t end) {
    line_ += count_newlines(src_, start, end);
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    pos_ = end;
  }

  void lex_raw(size_t start, size_t body) {
    finish_tag(start, body);
    for (size_t q = src_.find("{%", body); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t p = q + 2;
      char sign = (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ? src_[p++] : 0;
      p = skip_spaces(p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      size_t end = match_block_end(skip_spaces(p + 6));
      if (end == std::string::npos) continue;
      add_text(body, q, sign, true);
      finish_tag(q, end);
      return;
    }
    fail(line_, "missing end of raw directive");
  }

  void lex_comment(size_t body) {
    size_t q = src_.find("#}", body);
    if (q == std::string::npos) fail(line_, "missing end of comment tag");
    size_t end = q + 2;
    if (q > body && src_[q - 1] == '-') {
      end = skip_spaces(end);
    } else if (!(q > body && src_[q - 1] == '+')) {
      end += end < src_.size() && src_[end] == '\n';  // trim_blocks
    }
    finish_tag(pos_, end);
  }

  // The tokens of a {{ }} or {% %} tag; p is after the opening delimiter and its sign.
  void lex_tag(char open, size_t p) {
    const size_t tag_start = pos_;
    int line = line_;
    tokens_.push_back({open == '%' ? TokenKind::kBlockBegin : TokenKind::kVarBegin, "", line});
    std::string brackets;  // the closing brackets expected, innermost last
    for (;;) {
      if (p >= src_.size())
        fail(line,
             open == '%' ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      if (brackets.empty()) {  // an end delimiter counts only outside brackets, as in jinja2
        size_t end = std::string::npos;
        if (open == '%') {
          end = match_block_end(p);
        } else if (src_.compare(p, 3, "-}}") == 0) {
          end = skip_spaces(p + 3);
        } else if (src_.compare(p, 2, "}}") == 0) {
          end = p + 2;
        }
        if (end != std::string::npos) {
          tokens_.push_back({open == '%' ? TokenKind::kBlockEnd : TokenKind::kVarEnd, "", line});
          finish_tag(tag_start, end);
          return;
        }
      }
      char c = src_[p];
      if (is_space(c)) {
        line += c == '\n';
        ++p;
        continue;
      }
      size_t q;
      if (p > 0 && src_[p - 1] != '.' && (q = match_float(p)) != std::string::npos) {
        add_number(TokenKind::kFloat, p, q, line);
      } else if ((q = match_int(p)) != std::string::npos) {
        add_number(TokenKind::kInt, p, q, line);
      } else if (is_name_start(c)) {
        for (q = p + 1; q < src_.size() && is_name_char(src_[q]);) ++q;
        tokens_.push_back({TokenKind::kName, src_.substr(p, q - p), line});
      } else if (c == '\'' || c == '"') {
        q = lex_string(p, line);
      } else {
        q = lex_operator(p, line, brackets);
      }
      p = q;
    }
  }

  void add_number(TokenKind kind, size_t from, size_t to, int line) {
    std::string text;
    for (size_t i = from; i < to; ++i)
      if (src_[i] != '_') text += src_[i];
    tokens_.push_back({kind, text, line});
  }

  // (\d+_)*\d+ at p: its end, or npos.
  size_t match_digits(size_t p) const {
    if (p >= src_.size() || !is_digit(src_[p])) return std::string::npos;
    while (p < src_.size() && is_digit(src_[p])) ++p;
    while (p + 1 < src_.size() && src_[p] == '_' && is_digit(src_[p + 1])) {
      ++p;
      while (p < src_.size() && is_digit(src_[p])) ++p;
    }
    return p;
  }

  // jinja2's float: digits, then a fraction and/or an exponent.
  size_t match_float(size_t p) const {
    size_t q = match_digits(p);
    if (q == std::string::npos) return q;
    size_t frac = std::string::npos;
    if (q < src_.size() && src_[q] == '.') frac = match_digits(q + 1);
    size_t after = frac != std::string::npos ? frac : q;
    if (after < src_.size() && (src_[after] == 'e' || src_[after] == 'E')) {
      size_t e = after + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      size_t exp_end = match_digits(e);
      if (exp_end != std::string::npos) return exp_end;
    }
    return frac;
  }

  // jinja2's integer: 0b.., 0o.., 0x.., or decimal (no leading zeros except zeros).
  size_t match_int(size_t p) const {
    if (p >= src_.size() || !is_digit(src_[p])) return std::string::npos;
    auto digits_of_base = [&](size_t q, int base) {
      auto ok = [&](char c) { return hex_value(c) >= 0 && hex_value(c) < base; };
      size_t start = q;
      while (q < src_.size()) {
        if (ok(src_[q])) {
          ++q;
        } else if (src_[q] == '_' && q + 1 < src_.size() && ok(src_[q + 1])) {
          q += 2;
        } else {
          break;
        }
      }
      return q > start ? q : std::string::npos;
    };
    if (src_[p] == '0' && p + 1 < src_.size()) {
      char b = char(std::tolower(static_cast<unsigned char>(src_[p + 1])));
      int base = b == 'b' ? 2 : b == 'o' ? 8 : b == 'x' ? 16 : 0;
      if (base) {
        size_t q = digits_of_base(p + 2, base);
        if (q != std::string::npos) return q;
      }
    }
    if (src_[p] == '0') {  // 0(_?0)*
      size_t q = p + 1;
      while (q < src_.size() && (src_[q] == '0' || (src_[q] == '_' && q + 1 < src_.size() && src_[q + 1] == '0')))
        q += src_[q] == '_' ? 2 : 1;
      return q;
    }
    return digits_of_base(p, 10);
  }

  size_t lex_string(size_t p, int& line) {
    char quote = src_[p];
    size_t q = p + 1;
    while (q < src_.size() && src_[q] != quote) q += src_[q] == '\\' ? 2 : 1;
    if (q >= src_.size()) fail(line, std::string("unexpected char '") + quote + "' (unterminated string)");
    std::string value;
    if (!decode_escapes(std::string_view(src_).substr(p + 1, q - p - 1), value))
      fail(line, "invalid escape in string literal");
    tokens_.push_back({TokenKind::kString, std::move(value), line});
    line += count_newlines(src_, p, q);
    return q + 1;
  }

  size_t lex_operator(size_t p, int line, std::string& brackets) {
    static const char* kTwoChar[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwoChar) {
      if (src_.compare(p, 2, op) == 0) {
        tokens_.push_back({TokenKind::kOperator, op, line});
        return p + 2;
      }
    }
    char c = src_[p];
    if (std::string_view("+-/*%~[](){}<>=.:|,;").find(c) == std::string_view::npos)
      fail(line, std::string("unexpected char '") + c + "'");
    if (c == '(' || c == '[' || c == '{') brackets += c == '(' ? ')' : c == '[' ? ']' : '}';
    if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail(line, std::string("unexpected '") + c + "'");
      if (brackets.back() != c) fail(line, std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
      brackets.pop_back();
    }
    tokens_.push_back({TokenKind::kOperator, std::string(1, c), line});
    return p + 1;
  }

  std::string src_;
  const std::string& name_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;  // the last tag ended with a newline (or nothing came yet): for lstrip_blocks
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const std::string& name) { return Lexer(source, name).run(); }

std::string describe(const Token& token) {
  switch (token.kind) {
    case TokenKind::kText:
      return "template data";
    case TokenKind::kVarBegin:
      return "begin of print statement";
    case TokenKind::kVarEnd:
      return "end of print statement";
    case TokenKind::kBlockBegin:
      return "begin of statement block";
    case TokenKind::kBlockEnd:
      return "end of statement block";
    case TokenKind::kString:
      return "string";
    case TokenKind::kInt:
      return "integer";
    case TokenKind::kFloat:
      return "float";
    case TokenKind::kEof:
      return "end of template";
    default:
      return "'" + token.value + "'";
  }
}

}  // namespace lattice::jinja
