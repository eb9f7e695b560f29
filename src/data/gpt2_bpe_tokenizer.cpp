// GPT-2 byte-level BPE: loading vocab.json/merges.txt, encode with a per-thread piece cache, decode.
#include "data/gpt2_bpe_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/gpt2_pretokenizer.h"

namespace lattice {

namespace {

// GPT-2's bytes_to_unicode(): byte b is written as code point kByteChar[b] in vocab and merges
// (printable Latin-1 bytes as themselves, the others shifted to 256 + k).
struct ByteAlphabet {
  uint32_t byte_char[256];
  int16_t char_byte[512];  // code point -> byte, -1 if not in the alphabet
  ByteAlphabet() {
    std::fill(std::begin(char_byte), std::end(char_byte), int16_t(-1));
    bool printable[256] = {};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      byte_char[b] = printable[b] ? uint32_t(b) : uint32_t(256 + shifted++);
      char_byte[byte_char[b]] = int16_t(b);
    }
  }
};
const ByteAlphabet kAlphabet;

// A token as written in vocab/merges (UTF-8 of alphabet characters) -> its raw bytes; false if a
// character is not in GPT-2's byte alphabet.
bool alphabet_to_bytes(std::string_view s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    uint32_t cp = 0;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = (uint32_t(b0 & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;  // the alphabet ends at U+0143: every character is 1 or 2 UTF-8 bytes
    }
    if (cp >= 512 || kAlphabet.char_byte[cp] < 0) return false;
    out->push_back(char(kAlphabet.char_byte[cp]));
  }
  return true;
}

std::string read_file(const std::string& flag, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) LATTICE_FAIL() << flag << " " << path << ": cannot open: " << std::strerror(errno);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) LATTICE_FAIL() << flag << " " << path << ": read failed";
  return ss.str();
}

std::atomic<uint64_t> g_instances{0};

// Per-thread cache of piece -> ids, flat: ids live in one pool. Cleared when it belongs to another
// tokenizer or grows past its bound, so memory stays bounded whatever the input.
struct PieceCache {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  uint64_t owner = ~uint64_t(0);
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, Hash, std::equal_to<>> index;  // -> (start, n)
  std::vector<int32_t> pool;

  static constexpr size_t kMaxEntries = size_t(1) << 18;
  static constexpr size_t kMaxPoolIds = size_t(1) << 22;  // 16 MB of ids per thread at most
  static constexpr size_t kMaxPieceBytes = 64;  // longer pieces are rare; not worth a slot

  void reset(uint64_t new_owner) {
    owner = new_owner;
    index.clear();
    pool.clear();
  }
};
thread_local PieceCache t_cache;

}  // namespace

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file)
    : instance_(g_instances.fetch_add(1)) {
  load_vocab(vocab_file);
  load_merges(merge_file);
}

void GPT2BPETokenizer::load_vocab(const std::string& vocab_file) {
  const std::string where = "--vocab-file " + vocab_file;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file("--vocab-file", vocab_file));
  } catch (const nlohmann::json::parse_error& e) {
    LATTICE_FAIL() << where << ": not valid JSON (byte " << e.byte << "); expected GPT-2's vocab.json";
  }
  if (!j.is_object() || j.empty())
    LATTICE_FAIL() << where << ": expected a JSON object of token -> id (GPT-2's vocab.json)";
  id_to_bytes_.assign(j.size(), std::string());
  std::vector<bool> seen(j.size(), false);
  std::string bytes;
  for (const auto& [token, value] : j.items()) {
    if (!value.is_number_integer())
      LATTICE_FAIL() << where << ": id of token '" << token << "' is " << value.type_name() << ", expected an integer";
    const int64_t id = value.get<int64_t>();
    if (id < 0 || id >= int64_t(j.size()))
      LATTICE_FAIL() << where << ": id " << id << " of token '" << token << "' is outside 0.." << j.size() - 1
                     << " (ids must be 0..N-1 for N entries)";
    if (seen[size_t(id)]) LATTICE_FAIL() << where << ": id " << id << " is used twice (token '" << token << "')";
    seen[size_t(id)] = true;
    if (token == "<|endoftext|>") {
      eod_ = int32_t(id);
      bytes = token;
    } else if (!alphabet_to_bytes(token, &bytes)) {
      LATTICE_FAIL() << where << ": token '" << token << "' (id " << id
                     << ") has a character outside GPT-2's byte-to-unicode alphabet";
    }
    id_to_bytes_[size_t(id)] = bytes;
    // The special token's text is also a byte string ordinary tokens could spell; keep the first.
    bytes_to_id_.emplace(bytes, int32_t(id));
  }
  if (eod_ < 0) LATTICE_FAIL() << where << ": no '<|endoftext|>' token (the end-of-document id)";
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id_.find(std::string(1, char(b)));
    if (it == bytes_to_id_.end())
      LATTICE_FAIL() << where << ": no token for byte " << b << " (a byte-level BPE vocab has all 256)";
    byte_ids_[b] = it->second;
  }
}

void GPT2BPETokenizer::load_merges(const std::string& merge_file) {
  const std::string where = "--merge-file " + merge_file;
  const std::string text = read_file("--merge-file", merge_file);
  std::string left, right;
  uint64_t rank = 0;
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      LATTICE_FAIL() << where << " line " << line_no << ": expected '<left> <right>', got '" << line << "'";
    const std::string_view l = line.substr(0, sp), r = line.substr(sp + 1);
    if (!alphabet_to_bytes(l, &left) || !alphabet_to_bytes(r, &right))
      LATTICE_FAIL() << where << " line " << line_no << ": '" << line
                     << "' has a character outside GPT-2's byte-to-unicode alphabet";
    auto id_of = [&](const std::string& bytes, std::string_view shown) {
      auto it = bytes_to_id_.find(bytes);
      if (it == bytes_to_id_.end())
        LATTICE_FAIL() << where << " line " << line_no << ": '" << shown << "' is not a token of --vocab-file"
                       << " (the vocab and merges files do not belong together)";
      return uint64_t(uint32_t(it->second));
    };
    const uint64_t a = id_of(left, l), b = id_of(right, r);
    const uint64_t merged = id_of(left + right, std::string(l) + std::string(r));
    if (!merges_.emplace((a << 32) | b, (rank << 32) | merged).second)
      LATTICE_FAIL() << where << " line " << line_no << ": merge '" << line << "' appears twice";
    ++rank;
  }
  if (merges_.empty()) LATTICE_FAIL() << where << ": no merges (expected GPT-2's merges.txt)";
}

void GPT2BPETokenizer::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  const int n = int(piece.size());
  if (n == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  // Symbols form a linked list over the piece's bytes; a symbol keeps the index of its first byte.
  // Candidate merges sit in a min-heap by (rank, position); stale entries (a side already merged
  // away) are skipped when popped. Popping in that order merges the lowest-ranked pair first and,
  // for that pair, left to right: the same result as encoder.py's pass over all occurrences.
  thread_local std::vector<int32_t> id, next, prev;
  struct Cand {
    uint64_t key;  // rank << 32 | position
    int32_t left, right, merged;
  };
  thread_local std::vector<Cand> heap;
  id.resize(size_t(n));
  next.resize(size_t(n));
  prev.resize(size_t(n));
  heap.clear();
  auto greater = [](const Cand& x, const Cand& y) { return x.key > y.key; };
  auto push = [&](int p) {
    const int q = next[size_t(p)];
    auto it = merges_.find((uint64_t(uint32_t(id[size_t(p)])) << 32) | uint32_t(id[size_t(q)]));
    if (it == merges_.end()) return;
    heap.push_back({(it->second & 0xFFFFFFFF00000000ull) | uint32_t(p), id[size_t(p)], id[size_t(q)],
                    int32_t(it->second & 0xFFFFFFFFu)});
    std::push_heap(heap.begin(), heap.end(), greater);
  };
  for (int i = 0; i < n; ++i) {
    id[size_t(i)] = byte_ids_[static_cast<unsigned char>(piece[size_t(i)])];
    next[size_t(i)] = i + 1;
    prev[size_t(i)] = i - 1;
  }
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), greater);
    const Cand c = heap.back();
    heap.pop_back();
    const int p = int(uint32_t(c.key));
    const int q = next[size_t(p)];
    if (id[size_t(p)] != c.left || q >= n || id[size_t(q)] != c.right) continue;  // stale
    id[size_t(p)] = c.merged;
    id[size_t(q)] = -1;
    next[size_t(p)] = next[size_t(q)];
    if (next[size_t(p)] < n) prev[size_t(next[size_t(p)])] = p;
    if (prev[size_t(p)] >= 0) push(prev[size_t(p)]);
    if (next[size_t(p)] < n) push(p);
  }
  for (int i = 0; i < n; i = next[size_t(i)]) out->push_back(id[size_t(i)]);
}

void GPT2BPETokenizer::encode_append(std::string_view text, std::vector<int32_t>* out) const {
  PieceCache& cache = t_cache;
  if (cache.owner != instance_ || cache.index.size() >= PieceCache::kMaxEntries ||
      cache.pool.size() >= PieceCache::kMaxPoolIds) cache.reset(instance_);
  for (size_t pos = 0, end = 0; pos < text.size(); pos = end) {
    end = gpt2_piece_end(text, pos);
    const std::string_view piece = text.substr(pos, end - pos);
    if (piece.size() == 1) {
      out->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    if (piece.size() > PieceCache::kMaxPieceBytes) {
      bpe(piece, out);
      continue;
    }
    auto it = cache.index.find(piece);
    if (it == cache.index.end()) {
      const size_t start = cache.pool.size();
      bpe(piece, &cache.pool);
      it = cache.index.emplace(std::string(piece), std::make_pair(uint32_t(start), uint32_t(cache.pool.size() - start)))
               .first;
    }
    const int32_t* ids = cache.pool.data() + it->second.first;
    out->insert(out->end(), ids, ids + it->second.second);
  }
}

std::vector<int32_t> GPT2BPETokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  encode_append(text, &ids);
  return ids;
}

std::string GPT2BPETokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || id >= int32_t(id_to_bytes_.size()))
      LATTICE_FAIL() << "GPT2BPETokenizer: token id " << id << " is outside the vocabulary (0.."
                     << id_to_bytes_.size() - 1 << ")";
    text += id_to_bytes_[size_t(id)];
  }
  return text;
}

}  // namespace lattice
