// Progress of `lattice preprocess` on stderr: documents, MB read, MB/s and ETA. On a terminal a
// bar redrawn in place a few times a second (erased at the end, so the summary line is all that
// stays); otherwise (a log file) one line every 30 s, so short runs print nothing.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace lattice {

class PreprocessProgress {
 public:
  // total_file_bytes: size of the input on disk.
  PreprocessProgress(int64_t total_file_bytes, bool enabled);
  ~PreprocessProgress();  // erases the bar

  // Called after each chunk is written; cheap when nothing is due. bytes: input bytes written;
  // read_bytes / read_file_bytes: how far the reader is, uncompressed and on disk, which gives the
  // expected uncompressed total of a .gz file (for a plain file the two are equal).
  void update(int64_t documents, int64_t bytes, int64_t read_bytes, int64_t read_file_bytes);
  void finish();  // erases the bar (idempotent)

  // "1,234,567": documents and token counts in the summary and the bar.
  static std::string group_thousands(int64_t v);

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_;
  bool enabled_, tty_, drawn_ = false;
  Clock::time_point start_, last_;
};

// Peak resident memory of this process so far, in MB (getrusage).
double peak_rss_mb();

}  // namespace lattice
