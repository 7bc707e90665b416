// Tensor::load_stored: a stored tensor's bytes read from its file on first use (core/ir.h).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "core/half_floats.h"
#include "core/ir.h"

namespace pt {
namespace {

std::mutex load_mutex;
std::atomic<int64_t> loaded_bytes{0};

// Reads length bytes from offset of `file` into out; false on any failure or a short file.
bool read_range(const std::string& file, int64_t offset, int64_t length, std::byte* out) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  int64_t done = 0;
  while (done < length) {
    const ssize_t got = ::pread(fd, out + done, static_cast<size_t>(length - done), static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += got;
  }
  ::close(fd);
  return done == length;
}

template <class T>
int64_t first_nan(const std::vector<std::byte>& data) {
  const T* x = reinterpret_cast<const T*>(data.data());
  const int64_t n = static_cast<int64_t>(data.size() / sizeof(T));
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(x[i])) return i;
  return -1;
}

}  // namespace

int64_t stored_bytes_loaded() { return loaded_bytes.load(); }

void read_stored_bytes(const StoredBytes& s, std::byte* out) {
  if (!read_range(s.file, s.offset, s.length, out))
    throw UserError(s.where, "cannot read " + std::to_string(s.length) + " bytes from byte " + std::to_string(s.offset) +
                                 " of its external data file '" + s.file + "' (changed or truncated since import)",
                    "keep the data file beside the model, as it was exported");
}

void Tensor::skip_load() {
  std::lock_guard<std::mutex> lock(load_mutex);
  if (resident()) return;
  data.assign(static_cast<size_t>(type.bytes()), std::byte{0});
  loaded.set.store(true, std::memory_order_release);
}

void read_stored_tensor(const StoredBytes& s, const TensorType& type, std::vector<std::byte>* bytes) {
  const DType held = s.file_dtype == DType::kUndefined ? type.dtype : s.file_dtype;
  PT_CHECK(s.length == type.numel() * static_cast<int64_t>(dtype_size(held)),
           s.where + ": stored length does not match " + type.str());
  if (held == type.dtype) {
    bytes->resize(static_cast<size_t>(s.length));
    read_stored_bytes(s, bytes->data());
    return;
  }
  PT_CHECK(type.dtype == DType::kFloat32, s.where + ": " + dtype_name(held) + " stored for " + type.str());
  std::vector<std::byte> half(static_cast<size_t>(s.length));  // one tensor's file bytes at a time
  read_stored_bytes(s, half.data());
  bytes->resize(static_cast<size_t>(type.bytes()));
  widen_halves(held, half.data(), type.numel(), reinterpret_cast<float*>(bytes->data()));
}

void Tensor::load_stored() const {
  std::lock_guard<std::mutex> lock(load_mutex);
  if (resident()) return;  // another thread loaded it meanwhile
  const StoredBytes& s = *stored;
  // The tensor is const to its readers; its bytes are filled once, here, under the lock.
  auto& bytes = const_cast<std::vector<std::byte>&>(data);
  try {
    read_stored_tensor(s, type, &bytes);
  } catch (const UserError&) {
    std::vector<std::byte>().swap(bytes);
    throw;
  }
  const int64_t nan = type.dtype == DType::kFloat32   ? first_nan<float>(bytes)
                      : type.dtype == DType::kFloat64 ? first_nan<double>(bytes)
                                                      : -1;
  if (nan >= 0) {
    std::vector<std::byte>().swap(bytes);
    throw UserError(s.where, "holds NaN (element " + std::to_string(nan) + " of " + type.str() + ")",
                    "export the model again from finite weights");
  }
  loaded_bytes += s.length;
  loaded.set.store(true, std::memory_order_release);
}

}  // namespace pt
