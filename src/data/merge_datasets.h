// `lattice merge-datasets`: concatenates indexed datasets (.bin/.idx) into one, as Megatron's
// tools/merge_datasets.py. The documents of each input follow those of the one before, in the
// order given; all inputs must hold the same token dtype.
//   lattice merge-datasets --input P1 [P2 ...] --output-prefix P
//   lattice merge-datasets --input DIR --output-prefix P   (every prefix in DIR, by name, as Megatron)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lattice {

struct MergeStats {
  int64_t datasets = 0, documents = 0, sequences = 0, tokens = 0;
};

// Input prefixes: the given ones, or, for a single directory, its *.idx prefixes sorted by name.
std::vector<std::string> merge_input_prefixes(const std::vector<std::string>& inputs);

// Writes output_prefix.bin/.idx (through temporary files: an existing pair is replaced only on
// success). Throws lattice::Error naming the input on a missing/corrupt dataset or a dtype mismatch.
MergeStats merge_datasets(const std::vector<std::string>& prefixes, const std::string& output_prefix);

// The subcommand; argv[0] is "merge-datasets". Prints a summary (or the error) on stderr.
int run_merge_datasets(int argc, char** argv);

}  // namespace lattice
