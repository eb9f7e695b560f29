#include "train/progress_log.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace lattice {
namespace {

constexpr const char* kProgressFile = "progress.txt";

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(line);
  while (std::getline(in, cur, '\t')) out.push_back(cur);
  return out;
}

// The value after "Key: " in a field; false when the field has no ": ".
bool field_value(const std::string& field, std::string* value) {
  const size_t at = field.find(": ");
  if (at == std::string::npos) return false;
  *value = field.substr(at + 2);
  return true;
}

}  // namespace

void append_progress_line(const std::string& dir, int world, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / kProgressFile).string();
  std::ofstream out(path, std::ios::app);
  if (!out) LATTICE_FAIL() << path << ": cannot open for --log-progress";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  const char* job = std::getenv("SLURM_JOB_ID");
  out << stamp << "\tJob ID: " << (job ? job : "") << "\t# GPUs: " << world << "\t" << text << "\n";
  out.flush();
  if (!out) LATTICE_FAIL() << path << ": write failed (--log-progress)";
}

std::string saved_checkpoint_progress(int64_t iteration, double job_tflops_per_gpu, double cumulative_tflops_per_gpu,
                                      double flops, double tokens) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "Saved checkpoint\tIteration: %lld\tJob throughput: %.1f TFLOP/s/GPU\tCumulative throughput: %.1f "
                "TFLOP/s/GPU\tFloating-point operations: %.2e\tTokens (in billions): %.2f",
                (long long)iteration, job_tflops_per_gpu, cumulative_tflops_per_gpu, flops, tokens / 1e9);
  return buf;
}

ProgressStart progress_start(const std::string& dir, int world) {
  ProgressStart start;
  std::ifstream in((std::filesystem::path(dir) / kProgressFile).string());
  double latest_flops = 0;
  std::string line;
  while (in && std::getline(in, line)) {
    const std::vector<std::string> f = split_tabs(line);
    std::string gpus;
    if (f.size() < 4 || !field_value(f[2], &gpus)) continue;
    std::string v;
    if (f[3] == "Saved checkpoint" && f.size() >= 8 && field_value(f[7], &v)) latest_flops = std::atof(v.c_str());
    if (std::atoi(gpus.c_str()) != world) {  // another world size: the search starts again
      start = ProgressStart{};
      continue;
    }
    if (f[3] == "Starting job" && !start.found) {
      std::tm tm{};
      if (!strptime(f[0].c_str(), "%Y-%m-%d %H:%M:%S", &tm)) continue;
      tm.tm_isdst = -1;
      start = ProgressStart{true, std::mktime(&tm), latest_flops};
    }
  }
  return start;
}

}  // namespace lattice
