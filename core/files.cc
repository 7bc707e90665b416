#include "core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace pt {

std::string read_file(const std::string& path, const std::string& todo) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "cannot be read", todo);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file_atomic(const std::string& path, const std::function<bool(int fd)>& write_to,
                       const std::string& todo) {
  namespace fs = std::filesystem;
  // A temporary name of this writer's own: two writers of one path (two runs, two threads) each
  // rename a whole file into place, the last one winning, and never write into each other's.
  static std::atomic<unsigned> writes{0};
  const std::string tmp = path + "." + std::to_string(::getpid()) + "." + std::to_string(writes++) + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(path, "cannot be written", todo);
  std::error_code ec;
  bool ok = false;
  try {
    ok = write_to(fd);
  } catch (...) {
    ::close(fd);
    fs::remove(tmp, ec);
    throw;
  }
  ok = ::fsync(fd) == 0 && ok;
  ::close(fd);
  if (!ok) {
    fs::remove(tmp, ec);
    throw UserError(path, "writing failed (disk full?)", todo);
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw UserError(path, "cannot be written: " + why, todo);
  }
  const fs::path folder = fs::path(path).parent_path();
  const int dfd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, size_t count, const std::function<std::string_view(size_t i)>& part,
                       const std::string& todo) {
  write_file_atomic(
      path,
      [&](int fd) {
        for (size_t i = 0; i < count; ++i) {
          const std::string_view bytes = part(i);
          for (const char* p = bytes.data(); p < bytes.data() + bytes.size();) {
            const ssize_t w = ::write(fd, p, static_cast<size_t>(bytes.data() + bytes.size() - p));
            if (w <= 0) return false;
            p += w;
          }
        }
        return true;
      },
      todo);
}

void write_file_atomic(const std::string& path, std::span<const std::string_view> parts,
                       const std::string& todo) {
  write_file_atomic(path, parts.size(), [&](size_t i) { return parts[i]; }, todo);
}

void write_file_atomic(const std::string& path, std::string_view text, const std::string& todo) {
  write_file_atomic(path, std::span<const std::string_view>(&text, 1), todo);
}

void make_parent(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
}

}  // namespace pt
