// Helpers shared by the unit tests that work with files.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace lattice::test_util {

// The directories temp_dir made, removed when the test process exits (ctest runs each test
// in a process of its own) unless a test failed: then they stay for a look.
class TempDirs {
 public:
  static void add(const std::string& dir) { instance().dirs_.push_back(dir); }

 private:
  static TempDirs& instance() {
    static TempDirs dirs;
    return dirs;
  }
  ~TempDirs() {
    if (!::testing::UnitTest::GetInstance()->Passed()) return;
    for (const std::string& d : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
  std::vector<std::string> dirs_;
};

// A fresh, empty directory named after the running test (and the process id).
inline std::string temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path d =
      std::filesystem::path(::testing::TempDir()) /
      ("lattice_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  TempDirs::add(d.string());
  return d.string();
}

// Writes `text` to `path` byte for byte (replacing the file).
inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

}  // namespace lattice::test_util
