#include "checkpoint/durable_fs.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace fs = std::filesystem;

namespace lattice {
namespace {

std::string parent_of(const std::string& path) {
  fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

void write_all_or_fail(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      LATTICE_FAIL() << path << ": write failed: " << std::strerror(e);
    }
    p += w;
    n -= size_t(w);
  }
}

}  // namespace

void write_file_synced(const std::string& path, const void* data, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) LATTICE_FAIL() << path << ": cannot create: " << std::strerror(errno);
  write_all_or_fail(fd, data, n, path);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    LATTICE_FAIL() << path << ": fsync failed: " << std::strerror(e);
  }
  if (::close(fd) != 0) LATTICE_FAIL() << path << ": close failed: " << std::strerror(errno);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  try {
    write_file_synced(tmp, text.data(), text.size());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    LATTICE_FAIL() << path << ": cannot rename " << tmp << " into place: " << std::strerror(e);
  }
  fsync_dir(parent_of(path));
}

void fsync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) LATTICE_FAIL() << path << ": cannot open for fsync: " << std::strerror(errno);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    LATTICE_FAIL() << path << ": fsync failed: " << std::strerror(e);
  }
  ::close(fd);
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) LATTICE_FAIL() << dir << ": cannot open directory for fsync: " << std::strerror(errno);
  // Some filesystems refuse fsync on directories (EINVAL): nothing more can be done there.
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int e = errno;
    ::close(fd);
    LATTICE_FAIL() << dir << ": fsync failed: " << std::strerror(e);
  }
  ::close(fd);
}

void publish_dir(const std::string& staged, const std::string& target) {
  fsync_dir(staged);
  const std::string parent = parent_of(target);
  std::error_code ec;
  if (!fs::exists(target, ec)) {
    if (::rename(staged.c_str(), target.c_str()) != 0)
      LATTICE_FAIL() << target << ": cannot rename " << staged << " into place: " << std::strerror(errno);
    fsync_dir(parent);
    return;
  }
  // Re-saving an iteration that exists: swap atomically, so `target` is always complete.
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0)
    LATTICE_FAIL() << target << ": cannot exchange it with " << staged << ": " << std::strerror(errno);
  fsync_dir(parent);
  fs::remove_all(staged, ec);  // now the old directory
  if (ec) LATTICE_FAIL() << staged << ": cannot remove the replaced checkpoint: " << ec.message();
}

void remove_dir_durably(const std::string& dir, const std::string& trash) {
  if (::rename(dir.c_str(), trash.c_str()) != 0)
    LATTICE_FAIL() << dir << ": cannot rename to " << trash << " for removal: " << std::strerror(errno);
  fsync_dir(parent_of(dir));
  std::error_code ec;
  fs::remove_all(trash, ec);
  if (ec) LATTICE_FAIL() << trash << ": cannot remove: " << ec.message();
}

}  // namespace lattice
