#include "exec/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace pt {
namespace fs = std::filesystem;
namespace {

constexpr const char* kMagic = "pipetrain checkpoint 1";

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld.ckpt", static_cast<long long>(step));
  return buf;
}

// Writes `bytes` to path through a temporary file, fsyncs it, renames it into place and fsyncs
// the folder, so the name holds either the old content or all of the new.
void write_durably(const fs::path& path, const std::string& head, const std::vector<const Tensor*>& body) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(path.parent_path().string(), "cannot write a checkpoint there", "check the folder's permissions");
  bool ok = true;
  const auto put = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (ok && n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w <= 0) {
        ok = false;
        break;
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  put(head.data(), head.size());
  for (const Tensor* t : body) put(t->data.data(), t->data.size());
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  std::error_code ec;
  if (!ok) {
    fs::remove(tmp, ec);
    throw UserError(path.string(), "writing the checkpoint failed (disk full?)", "free space and run again");
  }
  fs::rename(tmp, path, ec);
  if (ec) throw UserError(path.string(), "cannot be replaced: " + ec.message(), "check the folder's permissions");
  const int dfd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

const Tensor* Checkpoint::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

void write_checkpoint(const std::string& dir, const Checkpoint& c) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir, "cannot create the checkpoint folder: " + ec.message(), "choose another checkpoint.dir");
  nlohmann::json h;
  h["step"] = c.step;
  h["data_position"] = c.data_position;
  h["meta"] = c.meta;
  nlohmann::json list = nlohmann::json::array();
  size_t offset = 0;
  std::vector<const Tensor*> body;
  for (const auto& [name, t] : c.tensors) {
    list.push_back({{"name", name}, {"dtype", static_cast<int>(t.type.dtype)}, {"shape", t.type.shape},
                    {"offset", offset}, {"bytes", t.data.size()}});
    offset += t.data.size();
    body.push_back(&t);
  }
  h["tensors"] = list;
  const std::string head = std::string(kMagic) + "\n" + h.dump() + "\n";
  const fs::path file = fs::path(dir) / step_name(c.step);
  write_durably(file, head, body);
  write_durably(fs::path(dir) / "latest", step_name(c.step) + "\n", {});
  // Keep the two newest.
  std::vector<fs::path> old;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0 && e.path().extension() == ".ckpt") old.push_back(e.path());
  }
  std::sort(old.begin(), old.end());
  for (size_t i = 0; i + 2 < old.size(); ++i) fs::remove(old[i], ec);
}

Checkpoint read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "cannot read the checkpoint", "check checkpoint.dir");
  std::string magic, header;
  std::getline(in, magic);
  std::getline(in, header);
  if (magic != kMagic) throw UserError(path, "is not a pipetrain checkpoint", "point checkpoint.dir at a folder `pipetrain train` wrote");
  Checkpoint c;
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(header);
    c.step = h.at("step").get<int64_t>();
    c.data_position = h.at("data_position").get<int64_t>();
    c.meta = h.at("meta").get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, std::string("damaged checkpoint header: ") + e.what(), "resume from another checkpoint");
  }
  const std::streamoff base = in.tellg();
  for (const auto& e : h.at("tensors")) {
    Tensor t;
    t.type.dtype = static_cast<DType>(e.at("dtype").get<int>());
    t.type.shape = e.at("shape").get<std::vector<int64_t>>();
    const size_t bytes = e.at("bytes").get<size_t>();
    if (static_cast<int64_t>(bytes) != t.type.bytes())
      throw UserError(path, "damaged checkpoint: tensor '" + e.at("name").get<std::string>() + "' has the wrong size", "resume from another checkpoint");
    t.data.resize(bytes);
    in.seekg(base + static_cast<std::streamoff>(e.at("offset").get<size_t>()));
    in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(bytes));
    if (!in) throw UserError(path, "damaged checkpoint: the file is short", "resume from another checkpoint");
    c.tensors.emplace_back(e.at("name").get<std::string>(), std::move(t));
  }
  return c;
}

std::optional<Checkpoint> read_latest_checkpoint(const std::string& dir) {
  std::ifstream latest(fs::path(dir) / "latest");
  if (!latest) return std::nullopt;
  std::string name;
  std::getline(latest, name);
  return read_checkpoint((fs::path(dir) / name).string());
}

}  // namespace pt
