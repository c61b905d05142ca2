#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "flashtq/error.hpp"

namespace flashtq::core {

AtomicFile::AtomicFile(const std::string& path) : path_(path) {
  std::random_device rd;
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    temp_ = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) throw Error("path", "cannot create a file beside '" + path + "': " + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& what) {
  const int err = errno;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_.c_str());
  throw Error("path",
              what + " '" + path_ + "' failed: " + std::strerror(err) + " (the previous file, if any, is kept)");
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing");
    p += n;
    bytes -= std::size_t(n);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("flushing");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("closing");
  if (std::rename(temp_.c_str(), path_.c_str()) != 0) fail("renaming the new file onto");
  committed_ = true;
}

}  // namespace flashtq::core
