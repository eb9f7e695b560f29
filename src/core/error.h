// Errors: LATTICE_CHECK for invariants, lattice::Error for user-facing problems.
// Every message is one line that names the file, flag or tensor and what is wrong.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace lattice {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A buffer the device (host memory, or a GPU's) cannot hold. Thrown by device_alloc; the
// owners of the large buffers rethrow it naming what they allocate (with_context), and the
// command line adds what a user can change.
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& msg) : Error(msg) {}
  // "WHAT: <this message>", still an OutOfMemory.
  OutOfMemory with_context(const std::string& what) const {
    std::string msg = what;
    msg += ": ";
    msg += this->what();
    return OutOfMemory(msg);
  }
};
// "12.35 GB", or with exact "12.35 GB (12345678901 bytes)"
inline std::string describe_bytes(size_t bytes, bool exact = true) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << double(bytes) / 1e9 << " GB";
  if (exact) os << " (" << bytes << " bytes)";
  return os.str();
}

namespace detail {
// Collects a message with operator<< and throws lattice::Error when destroyed.
class ErrorBuilder {
 public:
  ErrorBuilder(const char* file, int line, const char* cond) {
    if (cond) os_ << "check failed: " << cond << " (" << file << ":" << line << "): ";
  }
  template <typename T>
  ErrorBuilder& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  [[noreturn]] ~ErrorBuilder() noexcept(false) { throw Error(os_.str()); }

 private:
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace lattice

// LATTICE_CHECK(cond) << "context";  throws lattice::Error when cond is false.
#define LATTICE_CHECK(cond) \
  if (cond) {               \
  } else                    \
    ::lattice::detail::ErrorBuilder(__FILE__, __LINE__, #cond)

// LATTICE_FAIL() << "message";  throws lattice::Error with the message alone (user-facing).
#define LATTICE_FAIL() ::lattice::detail::ErrorBuilder(__FILE__, __LINE__, nullptr)
