// `lattice merge-datasets`: concatenation of indexed datasets (see merge_datasets.h).
#include "data/merge_datasets.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "data/indexed_dataset.h"

namespace lattice {

namespace fs = std::filesystem;

std::vector<std::string> merge_input_prefixes(const std::vector<std::string>& inputs) {
  if (inputs.empty()) LATTICE_FAIL() << "--input: give at least one dataset prefix (or a directory)";
  if (inputs.size() == 1 && fs::is_directory(inputs[0])) {
    std::vector<std::string> prefixes;
    for (const auto& e : fs::directory_iterator(inputs[0]))
      if (e.is_regular_file() && e.path().extension() == ".idx")
        prefixes.push_back((e.path().parent_path() / e.path().stem()).string());
    if (prefixes.empty()) LATTICE_FAIL() << "--input " << inputs[0] << ": directory holds no .idx files";
    std::sort(prefixes.begin(), prefixes.end());
    return prefixes;
  }
  return inputs;
}

MergeStats merge_datasets(const std::vector<std::string>& prefixes, const std::string& output_prefix) {
  if (prefixes.empty()) LATTICE_FAIL() << "--input: no datasets to merge";
  // Open (and so validate) every input before writing anything.
  std::vector<std::unique_ptr<IndexedDataset>> inputs;
  for (const std::string& p : prefixes) {
    inputs.push_back(std::make_unique<IndexedDataset>(p));
    const IndexDTypeCode code = inputs.back()->dtype_code();
    if (code != inputs.front()->dtype_code())
      LATTICE_FAIL() << "--input " << p << ": token dtype code " << int(code) << " differs from "
                     << prefixes.front() << "'s (" << int(inputs.front()->dtype_code())
                     << "); datasets made with different tokenizers cannot be merged";
    if (inputs.back()->token_bytes() > 4)
      LATTICE_FAIL() << "--input " << p << ": token dtype code " << int(code) << " is not a token id type";
  }
  IndexedDatasetBuilder out(output_prefix, inputs.front()->dtype_code());
  MergeStats stats;
  std::vector<int32_t> tokens;
  for (const auto& ds : inputs) {
    const std::vector<int64_t>& docs = ds->document_indices();
    const std::vector<int32_t>& lengths = ds->sequence_lengths();
    for (size_t d = 0; d + 1 < docs.size(); ++d) {
      for (int64_t s = docs[d]; s < docs[d + 1]; ++s) {
        tokens.resize(size_t(lengths[size_t(s)]));
        ds->get(s, 0, int64_t(tokens.size()), tokens.data());
        out.add_item(tokens.data(), int64_t(tokens.size()));
        stats.tokens += int64_t(tokens.size());
      }
      out.end_document();
    }
    stats.documents += ds->num_documents();
    stats.sequences += ds->num_sequences();
    ++stats.datasets;
  }
  out.finalize();
  return stats;
}

namespace {
const char* kUsage =
    "usage: lattice merge-datasets --input PREFIX [PREFIX ...] --output-prefix P\n"
    "       lattice merge-datasets --input DIR --output-prefix P   (every PREFIX.idx in DIR, by name)\n"
    "writes P.bin/.idx: the documents of every input, in order (Megatron's tools/merge_datasets.py)\n";
}  // namespace

int run_merge_datasets(int argc, char** argv) {
  try {
    std::vector<std::string> inputs;
    std::string output_prefix;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--help" || flag == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (flag == "--input") {
        while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) inputs.push_back(argv[++i]);
        if (inputs.empty()) LATTICE_FAIL() << "--input: missing value";
      } else if (flag == "--output-prefix") {
        if (i + 1 >= argc || std::strncmp(argv[i + 1], "--", 2) == 0) LATTICE_FAIL() << "--output-prefix: missing value";
        output_prefix = argv[++i];
      } else {
        LATTICE_FAIL() << "unknown flag '" << flag << "' (see lattice merge-datasets --help)";
      }
    }
    if (inputs.empty()) LATTICE_FAIL() << "--input is required";
    if (output_prefix.empty()) LATTICE_FAIL() << "--output-prefix is required";
    const MergeStats s = merge_datasets(merge_input_prefixes(inputs), output_prefix);
    std::fprintf(stderr, "lattice merge-datasets: %lld datasets, %lld documents, %lld sequences, %lld tokens -> %s.{bin,idx}\n",
                 (long long)s.datasets, (long long)s.documents, (long long)s.sequences, (long long)s.tokens,
                 output_prefix.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lattice merge-datasets: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace lattice
