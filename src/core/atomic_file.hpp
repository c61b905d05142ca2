// Writes a file so that it is either complete or absent: the bytes go to a new temporary file in
// the target's directory, every write, the fsync and the close are checked, and only then is it
// renamed over the target. On any failure the temporary file is removed, the target is left as it
// was, and an Error naming the path and the system's reason is thrown.
#pragma once

#include <cstddef>
#include <string>

namespace flashtq::core {

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();  // removes the temporary file unless commit() succeeded
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t bytes);
  void commit();  // fsync, close, rename over the target

 private:
  [[noreturn]] void fail(const std::string& what);
  std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace flashtq::core
