#include "pipeline/schedule.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <string>

#include "core/error.h"

namespace lattice {

namespace {

// "--num-layers L" and, when the split counts the embedding or the loss, what it adds.
std::string split_layers_text(const PipelineLayout& l) {
  std::string s = "--num-layers " + std::to_string(l.num_layers);
  if (l.embedding_in_split) s += " + 1 (--account-for-embedding-in-pipeline-split)";
  if (l.loss_in_split) s += " + 1 (--account-for-loss-in-pipeline-split)";
  return s;
}

}  // namespace

PipelineLayout make_pipeline_layout(int64_t L, int P, int64_t per_virtual, int64_t first, int64_t last,
                                    bool embedding_in_split, bool loss_in_split) {
  PipelineLayout l;
  l.stages = P;
  l.num_layers = L;
  l.embedding_in_split = embedding_in_split;
  l.loss_in_split = loss_in_split;
  if (P < 1) LATTICE_FAIL() << "--pipeline-model-parallel-size must be >= 1, got " << P;
  if (first < 0 || last < 0)
    LATTICE_FAIL() << "--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers must be >= 0";
  if (per_virtual < 0) LATTICE_FAIL() << "--num-layers-per-virtual-pipeline-stage must be >= 0";
  if (embedding_in_split || loss_in_split) {  // Megatron-Core's TransformerConfig checks
    const char* flag = embedding_in_split ? "--account-for-embedding-in-pipeline-split"
                                          : "--account-for-loss-in-pipeline-split";
    if (P < 2) LATTICE_FAIL() << flag << " needs --pipeline-model-parallel-size > 1";
    if (first > 0 || last > 0)
      LATTICE_FAIL() << flag << " cannot be combined with --decoder-first/last-pipeline-num-layers";
  }
  const int64_t Ls = l.split_layers();
  if (per_virtual > 0) {
    if (P < 2) LATTICE_FAIL() << "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1";
    if (first > 0 || last > 0)
      LATTICE_FAIL() << "--num-layers-per-virtual-pipeline-stage cannot be combined with "
                        "--decoder-first/last-pipeline-num-layers";
    if (Ls % (int64_t(P) * per_virtual) != 0)
      LATTICE_FAIL() << split_layers_text(l) << " is not divisible by --pipeline-model-parallel-size " << P
                     << " x --num-layers-per-virtual-pipeline-stage " << per_virtual;
    l.virtual_stages = int(Ls / (int64_t(P) * per_virtual));
    if (l.virtual_stages < 2)
      LATTICE_FAIL() << "--num-layers-per-virtual-pipeline-stage " << per_virtual << " gives one chunk per stage ("
                     << Ls << " layers / " << P << " stages); use at most " << Ls / (2 * int64_t(P))
                     << " for interleaving";
    return l;
  }
  if ((first > 0 || last > 0) && P < 2)
    LATTICE_FAIL() << "--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1";
  l.first_stage_layers = first;
  l.last_stage_layers = last;
  int64_t rest = Ls, middle = P;
  if (first > 0) rest -= first, --middle;
  if (last > 0) rest -= last, --middle;
  if (rest < 0 || (middle == 0 && rest != 0))
    LATTICE_FAIL() << "--decoder-first-pipeline-num-layers " << first << " and --decoder-last-pipeline-num-layers "
                   << last << " do not fit --num-layers " << L << " on " << P << " stages";
  if (middle > 0 && rest % middle != 0)
    LATTICE_FAIL() << split_layers_text(l) << " is not divisible by --pipeline-model-parallel-size " << P
                   << (first > 0 || last > 0 ? " (the layers left for the middle stages after "
                                               "--decoder-first/last-pipeline-num-layers must split evenly)"
                                             : "");
  if (middle > 0 && rest / middle == 0)
    LATTICE_FAIL() << split_layers_text(l) << " leaves a pipeline stage without layers (--pipeline-model-parallel-size "
                   << P << ")";
  return l;
}

namespace {

// The layout string with its repetitions written out: "(group)*n" first, then "x*n" (Megatron's
// two passes; groups do not nest), commas dropped.
std::string unroll_layout(const std::string& text) {
  const char* flag = "--pipeline-model-parallel-layout";
  std::string s;
  for (char ch : text)
    if (ch != ',') s += ch;
  auto count_at = [&](const std::string& in, size_t& i) {  // the digits at in[i], i moved past them
    size_t j = i;
    while (j < in.size() && std::isdigit(static_cast<unsigned char>(in[j]))) ++j;
    if (j == i) LATTICE_FAIL() << flag << " '" << text << "': '*' needs a count after it";
    const std::string digits = in.substr(i, j - i);
    if (digits.size() > 6) LATTICE_FAIL() << flag << " '" << text << "': repetition " << digits << " is too large";
    i = j;
    return std::stoll(digits);
  };
  std::string groups;  // pass 1: "(...)*n"
  for (size_t i = 0; i < s.size();) {
    if (s[i] == ')') LATTICE_FAIL() << flag << " '" << text << "': ')' without '('";
    if (s[i] != '(') {
      groups += s[i++];
      continue;
    }
    const size_t close = s.find(')', i);
    if (close == std::string::npos) LATTICE_FAIL() << flag << " '" << text << "': '(' without ')'";
    const std::string inner = s.substr(i + 1, close - i - 1);
    if (inner.empty() || inner.find('(') != std::string::npos)
      LATTICE_FAIL() << flag << " '" << text << "': a group must hold layers and not nest";
    if (close + 1 >= s.size() || s[close + 1] != '*')
      LATTICE_FAIL() << flag << " '" << text << "': a group '(" << inner << ")' needs '*n' after it";
    i = close + 2;
    for (int64_t k = count_at(s, i); k > 0; --k) groups += inner;
    if (groups.size() > (size_t(1) << 20)) LATTICE_FAIL() << flag << " '" << text << "' is too long written out";
  }
  std::string out;  // pass 2: "x*n"
  for (size_t i = 0; i < groups.size();) {
    if (groups[i] == '*') LATTICE_FAIL() << flag << " '" << text << "': '*' needs a layer before it";
    const char ch = groups[i++];
    if (i < groups.size() && groups[i] == '*') {  // a letter or '|' n times
      ++i;
      out.append(size_t(count_at(groups, i)), ch);
      if (out.size() > (size_t(1) << 20)) LATTICE_FAIL() << flag << " '" << text << "' is too long written out";
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

PipelineLayout parse_pipeline_layout(const std::string& text, int64_t num_layers, int P, int64_t mtp_num_layers) {
  const char* flag = "--pipeline-model-parallel-layout";
  const std::string s = unroll_layout(text);
  std::vector<std::string> stages(1);
  for (char ch : s) {
    if (ch == '|') {
      stages.emplace_back();
    } else if (ch == 'E' || ch == 't' || ch == 'm' || ch == 'L') {
      stages.back() += ch;
    } else {
      char shown[16];  // the character, or its byte in hex when it is not printable ASCII
      if (std::isprint(static_cast<unsigned char>(ch)) && static_cast<unsigned char>(ch) < 128)
        std::snprintf(shown, sizeof shown, "'%c'", ch);
      else
        std::snprintf(shown, sizeof shown, "byte 0x%02x", static_cast<unsigned>(static_cast<unsigned char>(ch)));
      LATTICE_FAIL() << flag << " '" << text << "': unknown layer " << shown
                     << " (E embedding, t decoder layer, m prediction depth, L loss; '|' between stages)";
    }
  }
  auto count = [&](char ch) { return int64_t(std::count(s.begin(), s.end(), ch)); };
  if (count('E') != 1 || stages.front().empty() || stages.front().front() != 'E')
    LATTICE_FAIL() << flag << " '" << text << "': E (the embedding) must open the first stage, once";
  if (count('L') != 1 || stages.back().empty() || stages.back().back() != 'L')
    LATTICE_FAIL() << flag << " '" << text << "': L (the loss) must close the last stage, once";
  if (count('t') != num_layers)
    LATTICE_FAIL() << flag << " '" << text << "' holds " << count('t') << " decoder layers (t), --num-layers is "
                   << num_layers;
  if (count('m') != mtp_num_layers)
    LATTICE_FAIL() << flag << " '" << text << "' holds " << count('m') << " prediction depths (m), --mtp-num-layers is "
                   << mtp_num_layers;
  if (count('m') > 0) {
    const std::string& last = stages.back();
    if (int64_t(std::count(last.begin(), last.end(), 'm')) != count('m') || last.find('t', last.find('m')) != std::string::npos)
      LATTICE_FAIL() << flag << " '" << text << "': the prediction depths (m) must follow every t in the last stage, "
                        "with L (where lattice runs them)";
  }
  if (P < 1) LATTICE_FAIL() << "--pipeline-model-parallel-size must be >= 1, got " << P;
  const int64_t n = int64_t(stages.size());
  if (n % P != 0)
    LATTICE_FAIL() << flag << " '" << text << "' has " << n << " stages, not a multiple of --pipeline-model-parallel-size "
                   << P;
  PipelineLayout l;
  l.stages = P;
  l.num_layers = num_layers;
  l.virtual_stages = int(n / P);
  if (l.virtual_stages > 1 && P < 2)
    LATTICE_FAIL() << flag << " '" << text << "' has " << n
                   << " stages: interleaving them needs --pipeline-model-parallel-size > 1";
  for (const std::string& st : stages) l.chunk_layers.push_back(int64_t(std::count(st.begin(), st.end(), 't')));
  return l;
}

std::vector<std::pair<int64_t, int64_t>> stage_layers(const PipelineLayout& l, int r) {
  const int P = l.stages;
  if (!l.chunk_layers.empty()) {  // --pipeline-model-parallel-layout: virtual stage v*P + r in order
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int v = 0; v < l.virtual_stages; ++v) {
      const size_t k = size_t(v * P + r);
      int64_t b = 0;
      for (size_t j = 0; j < k; ++j) b += l.chunk_layers[j];
      out.push_back({b, b + l.chunk_layers[k]});
    }
    return out;
  }
  // The split's layer range [b, e) as decoder layers: the embedding is split layer 0.
  const int64_t shift = l.embedding_in_split ? 1 : 0;
  auto decoder = [&](int64_t b, int64_t e) {
    return std::pair<int64_t, int64_t>{std::clamp<int64_t>(b - shift, 0, l.num_layers),
                                       std::clamp<int64_t>(e - shift, 0, l.num_layers)};
  };
  if (l.virtual_stages > 1) {
    const int64_t per = l.split_layers() / (int64_t(P) * l.virtual_stages);
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int v = 0; v < l.virtual_stages; ++v) {
      const int64_t b = (int64_t(v) * P + r) * per;
      out.push_back(decoder(b, b + per));
    }
    return out;
  }
  int64_t rest = l.split_layers(), middle = P;
  if (l.first_stage_layers > 0) rest -= l.first_stage_layers, --middle;
  if (l.last_stage_layers > 0) rest -= l.last_stage_layers, --middle;
  const int64_t per = middle > 0 ? rest / middle : 0;
  auto count = [&](int s) {
    if (s == 0 && l.first_stage_layers > 0) return l.first_stage_layers;
    if (s == P - 1 && l.last_stage_layers > 0) return l.last_stage_layers;
    return per;
  };
  int64_t b = 0;
  for (int s = 0; s < r; ++s) b += count(s);
  return {decoder(b, b + count(r))};
}

void check_micro_batches(const PipelineLayout& l, int64_t M) {
  if (l.virtual_stages == 1) return;
  const int64_t N = l.microbatch_group();
  if (N < l.stages || N > M)  // Megatron's range [P, M]
    LATTICE_FAIL() << "interleaved pipelining runs groups of "
                   << (l.microbatch_group_size > 0 ? "--microbatch-group-size-per-virtual-pipeline-stage "
                                                   : "--pipeline-model-parallel-size ")
                   << N << " micro-batches through each chunk: it must be between --pipeline-model-parallel-size "
                   << l.stages << " and the number of micro-batches " << M
                   << " (--global-batch-size / (--micro-batch-size x data-parallel size))";
  // A last group of fewer than P micro-batches would leave the stages waiting on each other (Megatron's check).
  if (const int64_t rest = M % N; rest > 0 && rest < l.stages)
    LATTICE_FAIL() << "interleaved pipelining: the last group of " << rest << " micro-batches (" << M
                   << " micro-batches in groups of " << N << ") is smaller than --pipeline-model-parallel-size "
                   << l.stages << "; give a number of micro-batches or a "
                   << "--microbatch-group-size-per-virtual-pipeline-stage that leaves 0 or at least " << l.stages;
}

std::vector<PipelineOp> pipeline_schedule(const PipelineLayout& l, int64_t M, int r) {
  const int P = l.stages, V = l.virtual_stages;
  std::vector<PipelineOp> ops;
  if (V == 1) {
    const int64_t warmup = std::min<int64_t>(P - r - 1, M);
    for (int64_t m = 0; m < warmup; ++m) ops.push_back({true, m, 0});
    for (int64_t i = 0; i < M - warmup; ++i) {
      ops.push_back({true, warmup + i, 0});
      ops.push_back({false, i, 0});
    }
    for (int64_t m = M - warmup; m < M; ++m) ops.push_back({false, m, 0});
    return ops;
  }
  check_micro_batches(l, M);
  const int64_t total = M * V, N = l.microbatch_group();
  // Megatron's schedule table: (micro-batch, chunk) of each virtual micro-batch.
  std::vector<std::pair<int64_t, int>> table;
  table.reserve(size_t(total));
  for (int64_t first = 0; first < M; first += N)
    for (int c = 0; c < V; ++c)
      for (int64_t m = first; m < std::min(first + N, M); ++m) table.push_back({m, c});
  const int64_t warmup =
      M == P && N == P ? total : std::min<int64_t>((P - r - 1) * 2 + int64_t(V - 1) * N, total);
  auto micro = [&](int64_t k) { return table[size_t(k)].first; };
  auto chunk = [&](int64_t k, bool fwd) {
    const int c = table[size_t(k)].second;
    return fwd ? c : V - 1 - c;
  };
  for (int64_t k = 0; k < warmup; ++k) ops.push_back({true, micro(k), chunk(k, true)});
  for (int64_t k = 0; k < total - warmup; ++k) {
    ops.push_back({true, micro(warmup + k), chunk(warmup + k, true)});
    ops.push_back({false, micro(k), chunk(k, false)});
  }
  for (int64_t k = total - warmup; k < total; ++k) ops.push_back({false, micro(k), chunk(k, false)});
  return ops;
}

int max_in_flight(const std::vector<PipelineOp>& ops) {
  std::map<int, int> live, peak;
  for (const PipelineOp& op : ops) {
    int& n = live[op.chunk];
    n += op.forward ? 1 : -1;
    peak[op.chunk] = std::max(peak[op.chunk], n);
  }
  int m = 1;
  for (auto [c, p] : peak) m = std::max(m, p);
  return m;
}

int64_t warmup_forwards(const std::vector<PipelineOp>& ops) {
  int64_t n = 0;
  while (n < int64_t(ops.size()) && ops[size_t(n)].forward) ++n;
  return n;
}

PipelineTimeline simulate_pipeline(const PipelineLayout& l, int64_t M) {
  const int P = l.stages, V = l.virtual_stages;
  const int S = P * V;  // virtual stages
  std::vector<std::vector<PipelineOp>> ops(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) ops[size_t(r)] = pipeline_schedule(l, M, r);
  // done[kind][m][s]: the step at which the op finished (-1: not yet).
  std::vector<std::vector<int64_t>> fdone(static_cast<size_t>(M), std::vector<int64_t>(size_t(S), -1));
  std::vector<std::vector<int64_t>> bdone = fdone;
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  PipelineTimeline t;
  t.cells.assign(size_t(P), {});
  size_t remaining = 0;
  for (auto& o : ops) remaining += o.size();
  for (int64_t step = 0; remaining > 0; ++step) {
    std::vector<std::pair<int, PipelineOp>> ran;
    for (int r = 0; r < P; ++r) {
      std::string cell;
      if (next[size_t(r)] < ops[size_t(r)].size()) {
        const PipelineOp& op = ops[size_t(r)][next[size_t(r)]];
        const int s = op.chunk * P + r;
        const size_t m = size_t(op.micro_batch);
        const bool ready = op.forward ? (s == 0 || (fdone[m][size_t(s - 1)] >= 0 && fdone[m][size_t(s - 1)] < step))
                                      : (s == S - 1 ? fdone[m][size_t(s)] >= 0 && fdone[m][size_t(s)] < step
                                                    : bdone[m][size_t(s + 1)] >= 0 && bdone[m][size_t(s + 1)] < step);
        if (ready) {
          ran.push_back({r, op});
          ++next[size_t(r)];
          --remaining;
          cell.assign(1, op.forward ? 'F' : 'B');
          cell += std::to_string(op.micro_batch);
          if (V > 1) {
            cell += '.';
            cell += std::to_string(op.chunk);
          }
        }
      }
      t.cells[size_t(r)].push_back(cell);
    }
    LATTICE_CHECK(!ran.empty()) << "pipeline schedule deadlocks at step " << step;
    for (auto& [r, op] : ran) (op.forward ? fdone : bdone)[size_t(op.micro_batch)][size_t(op.chunk * P + r)] = step;
    t.steps = step + 1;
  }
  int64_t idle = 0;
  for (auto& row : t.cells)
    for (auto& c : row) idle += c.empty();
  t.bubble_fraction = double(idle) / double(int64_t(P) * t.steps);
  return t;
}

double theoretical_bubble(const PipelineLayout& l, int64_t M) {
  const double P = l.stages, V = l.virtual_stages;
  return (P - 1) / (V * double(M) + P - 1);
}

std::string format_timeline(const PipelineLayout& l, int64_t M) {
  const PipelineTimeline t = simulate_pipeline(l, M);
  size_t w = 2;
  for (auto& row : t.cells)
    for (auto& c : row) w = std::max(w, c.size());
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "> pipeline schedule: %d stages, %d chunk(s) per stage, %lld micro-batches (%s); F = forward, "
                "B = backward, one column per unit step\n",
                l.stages, l.virtual_stages, (long long)M, l.virtual_stages > 1 ? "interleaved 1F1B" : "1F1B");
  out += buf;
  for (size_t r = 0; r < t.cells.size(); ++r) {
    std::snprintf(buf, sizeof buf, "  stage %zu |", r);
    out += buf;
    for (auto& c : t.cells[r]) {
      out += ' ';
      if (c.empty()) {
        out.append(w, '.');
      } else {
        out += c;
        out.append(w - c.size(), ' ');
      }
    }
    out += "\n";
  }
  std::snprintf(buf, sizeof buf,
                "> bubble fraction: %.3f (idle / all stage-steps, forward and backward one step each); "
                "theory (P-1)/(%sM+P-1) = %.3f\n",
                t.bubble_fraction, l.virtual_stages > 1 ? "V*" : "", theoretical_bubble(l, M));
  out += buf;
  return out;
}

}  // namespace lattice
