// See state_file.h.
#include "controller/state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ina::ctl {
namespace {

Status io_error(const std::string& what, const std::string& path, int err) {
  return Status(StatusCode::kUnavailable,
                "cannot " + what + " " + path + ": " + std::strerror(err));
}

// The directory part of a path ("." when it has none).
std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Result<std::string> read_state_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status(StatusCode::kNotFound, path + " does not exist");
    return io_error("open", path, errno);
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return io_error("read", path, err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

Status write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("create", tmp, errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return io_error("write", tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return io_error("fsync", tmp, err);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return io_error("close", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Status(StatusCode::kUnavailable,
                  "cannot rename " + tmp + " to " + path + ": " + std::strerror(err));
  }
  // The rename is durable once the directory is.
  const std::string dir = dir_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return io_error("open directory", dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) return io_error("fsync directory", dir, err);
  return ok_status();
}

Status check_writable(const std::string& path) {
  const std::string tmp = path + ".tmp";
  const std::string dir = dir_of(path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return io_error("create", tmp, errno);
  if (!S_ISDIR(st.st_mode)) return io_error("create", tmp, ENOTDIR);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return io_error("create", tmp, errno);
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status(StatusCode::kUnavailable,
                  "cannot rename " + tmp + " to " + path + ": " + std::strerror(EISDIR));
  }
  return ok_status();
}

}  // namespace ina::ctl
