#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace etlab {
namespace {

constexpr const char* kTmpPrefix = ".etlab-tmp-";

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string temporary_name(const std::string& path) {
  return parent_dir(path) + "/" + kTmpPrefix + base_name(path) + "." + std::to_string(getpid());
}

[[noreturn]] void fail(const std::string& path, int error_number) {
  throw IoError("cannot write " + path + ": " + std::strerror(error_number));
}

void reject_directory(const std::string& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) fail(path, EISDIR);
}

}  // namespace

void write_file_atomically(const std::string& path, const void* content, size_t size) {
  reject_directory(path);
  const std::string tmp = temporary_name(path);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, errno);
  const auto* cursor = static_cast<const char*>(content);
  size_t left = size;
  while (left > 0) {
    const ssize_t written = write(fd, cursor, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      close(fd);
      unlink(tmp.c_str());
      fail(path, saved);
    }
    cursor += written;
    left -= static_cast<size_t>(written);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    const int saved = errno;
    unlink(tmp.c_str());
    fail(path, saved);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    unlink(tmp.c_str());
    fail(path, saved);
  }
  // Make the rename itself durable; failure here is not worth failing the run for.
  const int dir_fd = open(parent_dir(path).c_str(), O_RDONLY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
}

void write_file_atomically(const std::string& path, const std::string& content) {
  write_file_atomically(path, content.data(), content.size());
}

void check_writable(const std::string& path) {
  reject_directory(path);
  const std::string tmp = temporary_name(path);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, errno);
  close(fd);
  unlink(tmp.c_str());
}

}  // namespace etlab
