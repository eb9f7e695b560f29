// Helpers shared by the unit tests that work with files.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace lattice::test_util {

// A fresh, empty directory named after the running test (and the process id).
inline std::string temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path d =
      std::filesystem::path(::testing::TempDir()) /
      ("lattice_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

// Writes `text` to `path` byte for byte (replacing the file).
inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

}  // namespace lattice::test_util
