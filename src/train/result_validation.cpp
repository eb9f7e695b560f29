#include "train/result_validation.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "train/train_step.h"

namespace lattice {
namespace {

std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Python's str(datetime.now()): "2026-12-06 23:59:01.123456".
std::string timestamp_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const long micro =
      long(std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s.%06ld", buf, micro);
  return out;
}

std::string host_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) return "localhost";
  return host;
}

// "FILE: REASON" when the file cannot be opened for appending, "" when it can.
std::string append_line(const std::string& path, const std::string& line) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return std::strerror(errno);
  const bool ok = std::fputs((line + "\n").c_str(), f) >= 0;
  const bool closed = std::fclose(f) == 0;
  return ok && closed ? "" : "write failed";
}

}  // namespace

bool LargeValueTracker::is_unexpectedly_large(double value) {
  const double v = std::fabs(value);
  if (!std::isfinite(v)) return false;
  if (count_ < samples_) {
    ++count_;
    max_ = std::max(max_, v);
    return false;
  }
  return v >= max_ * threshold_;
}

ResultValidator::ResultValidator(ResultValidationConfig cfg) : cfg_(std::move(cfg)) {
  // Megatron's check at start-up: the file must take appends (it is created if missing).
  if (cfg_.write_tracker && !cfg_.tracker_file.empty()) {
    std::FILE* f = std::fopen(cfg_.tracker_file.c_str(), "a");
    if (!f)
      LATTICE_FAIL() << "--result-rejected-tracker-filename " << cfg_.tracker_file
                     << ": cannot be appended to: " << std::strerror(errno);
    std::fclose(f);
  }
}

void ResultValidator::validate(const StepResult& r, int64_t iteration) {
  if (r.skipped) return;
  if (cfg_.check_for_nan && !(std::isfinite(r.lm_loss) && std::isfinite(r.grad_norm))) {
    const bool loss_bad = !std::isfinite(r.lm_loss);
    const double bad = loss_bad ? r.lm_loss : r.grad_norm;
    reject(iteration, bad,
           std::string(std::isnan(bad) ? "found NaN" : "found Inf") + (loss_bad ? " in the loss" : " in the grad norm"),
           std::string("the ") + (loss_bad ? "loss" : "gradient norm") + " is not finite (loss " +
               number_text(r.lm_loss) + ", gradient norm " + number_text(r.grad_norm) +
               "); stopped before its update (--no-check-for-nan-in-loss-and-grad trains on)");
  }
  if (cfg_.check_for_spiky_loss) {
    for (size_t m = 0; m < r.micro_batch_loss_sums.size(); ++m) {
      const double v = r.micro_batch_loss_sums[m];
      if (loss_.is_unexpectedly_large(v))
        reject(iteration, v, "Spiky loss",
               "micro-batch " + std::to_string(m) + "'s loss (the sum of its token losses) " + number_text(v) +
                   " is " + number_text(loss_.threshold()) + " or more times the largest of the first " +
                   std::to_string(loss_.samples()) + " micro-batches' (" + number_text(loss_.max()) +
                   ") (--check-for-spiky-loss); stopped before its update");
    }
  }
  if (cfg_.check_for_large_grads && grads_.is_unexpectedly_large(r.grad_norm))
    reject(iteration, r.grad_norm, "found unexpected large grads",
           "the gradient norm " + number_text(r.grad_norm) + " is " + number_text(grads_.threshold()) +
               " or more times the largest of the first " + std::to_string(grads_.samples()) + " steps' (" +
               number_text(grads_.max()) + ") (--check-for-large-grads); stopped before its update");
}

void ResultValidator::reject(int64_t iteration, double result, const std::string& message, const std::string& why) {
  std::string unrecorded;
  if (cfg_.write_tracker && !cfg_.tracker_file.empty()) {
    const char* job = std::getenv("SLURM_JOBID");
    std::ostringstream line;
    // World rank 0 writes, for every rank (they all reject alike): its device is local GPU 0, or the CPU.
    line << "ts=" << timestamp_now() << " node=" << host_name() << " device=0"
         << " jobID=" << (job && *job ? job : "N/A") << " rank=0 iteration=" << iteration
         << " status=rerun_disabled result=" << number_text(result) << " message='" << message << "'";
    const std::string err = append_line(cfg_.tracker_file, line.str());
    if (!err.empty()) unrecorded = " (not recorded in " + cfg_.tracker_file + ": " + err + ")";
  }
  LATTICE_FAIL() << "iteration " << iteration + 1 << ": " << why << unrecorded;
}

nlohmann::json ResultValidator::state() const {
  return {{"large_value_counts", {{"loss", loss_.count()}, {"grads", grads_.count()}}},
          {"max_values", {{"loss", loss_.max()}, {"grads", grads_.max()}}}};
}

void ResultValidator::restore(const nlohmann::json& state, const std::string& where) {
  if (state.is_null()) return;
  auto one = [&](const char* context, LargeValueTracker& t) {
    const std::string at = where + ": rerun_state_machine";
    if (!state.is_object() || !state.contains("large_value_counts") || !state.contains("max_values"))
      LATTICE_FAIL() << at << " needs large_value_counts and max_values";
    const nlohmann::json& c = state["large_value_counts"];
    const nlohmann::json& m = state["max_values"];
    if (!c.is_object() || !m.is_object()) LATTICE_FAIL() << at << ": large_value_counts and max_values must be objects";
    if (!c.contains(context) && !m.contains(context)) return;  // not sampled yet
    if (!c.contains(context) || !c[context].is_number_integer() || c[context].get<int64_t>() < 0 ||
        !m.contains(context) || !m[context].is_number() || !std::isfinite(m[context].get<double>()) ||
        m[context].get<double>() < 0)
      LATTICE_FAIL() << at << ": '" << context << "' needs a count >= 0 and a finite maximum >= 0";
    t.restore(std::min(c[context].get<int64_t>(), t.samples()), m[context].get<double>());
  };
  one("loss", loss_);
  one("grads", grads_);
}

std::vector<int64_t> iterations_to_skip_from_tracker_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};  // no rejection recorded yet
  // Megatron's record; its status is written as the value (rerun_disabled) or, by newer Pythons, as
  // the member (RerunValidationStatus.RERUN_DISABLED).
  static const std::regex record(R"(^ts=.+ node=.+ device=.+ jobID=.+ rank=(\d+) iteration=(\d+) status=(\S+)( .*)?$)");
  std::set<std::pair<int64_t, int64_t>> seen;
  std::set<int64_t> skip;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::smatch m;
    if (!std::regex_match(line, m, record))
      LATTICE_FAIL() << "--result-rejected-tracker-filename " << path << " line " << n
                     << ": not a result-rejected record (ts=... node=... device=... jobID=... rank=R iteration=I "
                        "status=S ...)";
    int64_t rank = 0, iteration = 0;
    try {
      rank = std::stoll(m[1].str());
      iteration = std::stoll(m[2].str());
    } catch (const std::exception&) {
      LATTICE_FAIL() << "--result-rejected-tracker-filename " << path << " line " << n << ": rank or iteration out of range";
    }
    std::string status = m[3].str();
    if (status.rfind("RerunValidationStatus.", 0) == 0) status = status.substr(22);
    std::transform(status.begin(), status.end(), status.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (status == "rerun_disabled") {
      if (!seen.insert({rank, iteration}).second) skip.insert(iteration);
    } else if (status == "second_rerun_reproducible") {
      skip.insert(iteration);
    }
  }
  if (f.bad()) LATTICE_FAIL() << "--result-rejected-tracker-filename " << path << ": read failed";
  return {skip.begin(), skip.end()};
}

}  // namespace lattice
