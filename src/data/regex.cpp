// Regex on PCRE2 (8-bit, UTF + UCP, JIT-compiled when the platform has PCRE2's JIT).
#include "data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace lattice {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buf), size_t(n));
}

// Per-thread match state: the match data (one ovector pair) and a JIT stack larger than PCRE2's
// 32 KB default, so long runs of white space under look-ahead do not exhaust it.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() {
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where, bool literal) : pattern_(pattern), where_(where) {
  int code = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options =
      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // UCP is refused with LITERAL
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &code, &offset, nullptr);
  if (!code_)
    LATTICE_FAIL() << where << ": regex '" << pattern << "' does not compile at offset " << offset << ": "
                   << pcre2_message(code);
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT is unavailable
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const {
  thread_local MatchState st;
  LATTICE_CHECK(st.data && st.context) << "PCRE2: out of memory";
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    const int rc = pcre2_match(code_, subject, text.size(), start, 0, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0)
      LATTICE_FAIL() << where_ << ": regex '" << pattern_ << "' failed on the text at byte " << start << ": "
                     << pcre2_message(rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t s = ov[0], e = ov[1];
    if (e > s) {
      out->emplace_back(s, e);
      start = e;
    } else {  // an empty match: skip it, and the character it sits before
      start = s + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
}

}  // namespace lattice
