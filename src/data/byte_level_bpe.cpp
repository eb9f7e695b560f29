// The byte-level BPE engine: vocabulary, merges, the merge loop and the per-thread piece cache.
#include "data/byte_level_bpe.h"

#include <algorithm>
#include <atomic>

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

bool byte_alphabet_to_bytes(std::string_view s, std::string* out) {
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

ByteLevelBpe::ByteLevelBpe() : instance_(g_instances.fetch_add(1)) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
}

void ByteLevelBpe::add_token(int32_t id, const std::string& bytes) {
  if (size_t(id) >= id_to_bytes_.size()) {
    id_to_bytes_.resize(size_t(id) + 1);
    has_id_.resize(size_t(id) + 1, false);
  }
  id_to_bytes_[size_t(id)] = bytes;
  has_id_[size_t(id)] = true;
  bytes_to_id_.emplace(bytes, id);
}

int32_t ByteLevelBpe::find(std::string_view bytes) const {
  auto it = bytes_to_id_.find(bytes);
  return it == bytes_to_id_.end() ? -1 : it->second;
}

bool ByteLevelBpe::add_merge(int32_t left, int32_t right, int32_t merged) {
  const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  if (!merges_.emplace(key, (next_rank_ << 32) | uint32_t(merged)).second) return false;
  ++next_rank_;
  return true;
}

bool ByteLevelBpe::add_merge_ranked(int32_t left, int32_t right, int32_t merged, uint32_t rank) {
  const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  return merges_.emplace(key, (uint64_t(rank) << 32) | uint32_t(merged)).second;
}

int ByteLevelBpe::index_bytes() {
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = find(std::string(1, char(b)));
    if (byte_ids_[b] < 0) return b;
  }
  return -1;
}

void ByteLevelBpe::bpe(std::string_view piece, std::vector<int32_t>* out) const {
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

void ByteLevelBpe::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.size() == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (whole_piece_first_) {
    if (auto it = bytes_to_id_.find(piece); it != bytes_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (piece.size() > PieceCache::kMaxPieceBytes) {
    bpe(piece, out);
    return;
  }
  PieceCache& cache = t_cache;
  if (cache.owner != instance_ || cache.index.size() >= PieceCache::kMaxEntries ||
      cache.pool.size() >= PieceCache::kMaxPoolIds) cache.reset(instance_);
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

}  // namespace lattice
