// Helpers shared by the unit tests that work with files.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace lattice::test_util {

// GPT-2's bytes_to_unicode() of one byte as UTF-8, transcribed from OpenAI's encoder.py (the
// tests' own copy of the byte-level alphabet vocab.json, merges.txt and tokenizer.json spell
// tokens in): printable Latin-1 bytes as themselves, the others as 256 + k.
inline std::string byte_char(int b) {
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
  int cp = b;
  if (!printable(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += printable(c) ? 0 : 1;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

// A byte string spelt in that alphabet.
inline std::string spell(const std::string& bytes) {
  std::string s;
  for (unsigned char c : bytes) s += byte_char(c);
  return s;
}

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

// The message of the lattice::Error that f() throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace lattice::test_util
