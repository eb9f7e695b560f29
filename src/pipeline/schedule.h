// Pipeline-parallel layouts and schedules (Megatron's): which layers each stage holds,
// and the order in which a stage runs the forward and backward passes of the
// micro-batches — 1F1B, or interleaved 1F1B with V model chunks (virtual stages) per
// stage. Pure functions: the trainer runs them, `lattice train --dry-run` prints them.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lattice {

struct PipelineLayout {
  int stages = 1;                   // P = --pipeline-model-parallel-size
  int virtual_stages = 1;           // V chunks per stage (interleaved when > 1)
  int64_t num_layers = 0;
  int64_t first_stage_layers = 0;   // --decoder-first-pipeline-num-layers (0: even split)
  int64_t last_stage_layers = 0;    // --decoder-last-pipeline-num-layers (0: even split)
  // --account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split: the
  // embedding (before layer 0) and the loss (after the last layer) each count as one layer
  // in the split, so the first (last) chunk holds one decoder layer fewer (Megatron-Core's
  // get_num_layers_to_build and get_transformer_layer_offset).
  bool embedding_in_split = false;
  bool loss_in_split = false;
  // The layers the split divides: num_layers, plus one for each of the two above.
  int64_t split_layers() const { return num_layers + (embedding_in_split ? 1 : 0) + (loss_in_split ? 1 : 0); }
  // --pipeline-model-parallel-layout: the decoder layers of each virtual stage, in the order
  // v*P + r (stage r's chunk v), P*V entries; empty when the flags above split the layers.
  std::vector<int64_t> chunk_layers = {};
  // --microbatch-group-size-per-virtual-pipeline-stage: how many consecutive micro-batches the
  // interleaved schedule runs through one chunk before the next (0: Megatron's default, P).
  int64_t microbatch_group_size = 0;
  int64_t microbatch_group() const { return microbatch_group_size > 0 ? microbatch_group_size : stages; }
};

// The layout for the flags, or a one-line error naming the flag to change:
// layers_per_virtual_stage = --num-layers-per-virtual-pipeline-stage (0: not interleaved);
// embedding_in_split, loss_in_split: the --account-for-...-in-pipeline-split flags (with
// pipeline parallelism only, not with --decoder-first/last-pipeline-num-layers).
PipelineLayout make_pipeline_layout(int64_t num_layers, int stages, int64_t layers_per_virtual_stage,
                                    int64_t first_stage_layers, int64_t last_stage_layers,
                                    bool embedding_in_split = false, bool loss_in_split = false);

// Megatron's --pipeline-model-parallel-layout: the virtual stages in order v*P + r, split by '|',
// each a string of E (the embedding), t (a decoder layer), m (a multi-token prediction depth) and
// L (the output layer and the loss); "(...)*n" repeats a group and "x*n" one letter, commas are
// ignored (e.g. "Et*3|(tt|)*2,t*2L"). E opens the first stage and L closes the last, each once;
// the t's are --num-layers; the m's are --mtp-num-layers, after every t, in the stage that holds L
// (where lattice runs the depths); the stage count is a multiple of P (V = count / P; an
// interleaved one needs P > 1). Stages may hold no decoder layer. A one-line error naming the flag
// otherwise.
PipelineLayout parse_pipeline_layout(const std::string& text, int64_t num_layers, int stages, int64_t mtp_num_layers);

// Global layer ranges [begin, end) of stage `stage`'s chunks, in chunk order. Even: L/P
// consecutive layers per stage; uneven: the first and last stage take their counts and
// the middle stages split the rest evenly; interleaved: stage r's chunk v holds the
// (v*P + r)-th block of L/(P*V) layers. With the embedding (loss) in the split, L counts
// it as a layer before layer 0 (after the last) and the chunk that holds it has one
// decoder layer fewer, possibly none ([b, b)). With chunk_layers: the counts, in virtual-stage order.
std::vector<std::pair<int64_t, int64_t>> stage_layers(const PipelineLayout& layout, int stage);

struct PipelineOp {
  bool forward = true;
  int64_t micro_batch = 0;
  int chunk = 0;
};

// Checks micro-batches against the layout (interleaving needs P <= N <= M for the micro-batch
// group N, and M % N either 0 or at least P, as Megatron), with an error that says what to change.
void check_micro_batches(const PipelineLayout& layout, int64_t num_micro_batches);

// Stage `stage`'s ops in order. 1F1B: warmup = min(P - r - 1, M) forwards, then pairs
// of one forward and one backward, then the remaining backwards. Interleaved (Megatron's
// get_schedule_table): the M*V virtual micro-batches are the micro-batches in groups of N
// (the last group holds the rest), each group run through chunk 0, then chunk 1, ...; virtual
// micro-batch k is entry k's micro-batch, of its chunk in forward and of chunk V - 1 - that in
// backward; warmup = min((P - r - 1)*2 + (V - 1)*N, M*V) (all of them when M == N == P).
std::vector<PipelineOp> pipeline_schedule(const PipelineLayout& layout, int64_t num_micro_batches, int stage);

// The most micro-batches any one chunk of `stage` holds activations for at once.
int max_in_flight(const std::vector<PipelineOp>& ops);
// Forwards run before the first backward (the schedule's warmup, plus the first pair).
int64_t warmup_forwards(const std::vector<PipelineOp>& ops);

// Simulated execution of every stage's schedule with unit-time forwards and backwards
// and the data dependencies between stages.
struct PipelineTimeline {
  std::vector<std::vector<std::string>> cells;  // [stage][time step]: "F3", "B3" (chunk: "F3.1") or ""
  int64_t steps = 0;
  double bubble_fraction = 0;                   // idle cells / all cells
};
PipelineTimeline simulate_pipeline(const PipelineLayout& layout, int64_t num_micro_batches);

// The theoretical bubble: (P - 1) / (M + P - 1), and (P - 1) / (V*M + P - 1) interleaved.
double theoretical_bubble(const PipelineLayout& layout, int64_t num_micro_batches);

// The timeline as text, one row per stage, for --dry-run.
std::string format_timeline(const PipelineLayout& layout, int64_t num_micro_batches);

}  // namespace lattice
