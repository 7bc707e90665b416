#include "train/checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/files.h"

namespace pt {
namespace fs = std::filesystem;
namespace {

constexpr const char* kMagic = "pipetrain checkpoint 1";

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld.ckpt", static_cast<long long>(step));
  return buf;
}

// step_<N>.ckpt -> N (parts: false), step_<N>.rank<R>.part -> N (parts: true); -1 for any other
// name.
int64_t step_of(const fs::path& p, bool parts) {
  const std::string n = p.filename().string();
  if (n.rfind("step_", 0) != 0 || p.extension() != (parts ? ".part" : ".ckpt")) return -1;
  try {
    size_t used = 0;
    const int64_t step = std::stoll(n.substr(5), &used);
    if (step < 0) return -1;
    if (!parts) return used + 10 == n.size() ? step : -1;
    const std::string rest = n.substr(5 + used);  // ".rank<R>.part"
    size_t digits = 0;
    if (rest.rfind(".rank", 0) != 0 || std::stoi(rest.substr(5), &digits) < 0) return -1;
    return 5 + digits + 5 == rest.size() ? step : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

// Every step_<N>.ckpt (or every part) in dir with its N, ascending.
std::vector<std::pair<int64_t, fs::path>> checkpoint_files(const std::string& dir, bool parts = false) {
  std::vector<std::pair<int64_t, fs::path>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (const int64_t s = step_of(e.path(), parts); s >= 0) files.emplace_back(s, e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// The file's content: the magic line, the JSON header (with `parts` when given), the bytes.
void write_file(const fs::path& path, const Checkpoint& c, const std::vector<std::string>& parts) {
  nlohmann::json h;
  h["step"] = c.step;
  h["data_position"] = c.data_position;
  h["meta"] = c.meta;
  if (!parts.empty()) h["parts"] = parts;
  nlohmann::json list = nlohmann::json::array();
  size_t offset = 0;
  std::vector<std::string_view> pieces(1);  // the header, then every tensor's bytes
  for (const auto& [name, t] : c.tensors) {
    list.push_back({{"name", name}, {"dtype", static_cast<int>(t.type.dtype)}, {"shape", t.type.shape},
                    {"offset", offset}, {"bytes", t.data.size()}});
    offset += t.data.size();
    pieces.emplace_back(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  h["tensors"] = list;
  const std::string head = std::string(kMagic) + "\n" + h.dump() + "\n";
  pieces[0] = head;
  write_file_atomic(path.string(), pieces, "check the free space and permissions of checkpoint.dir");
}

void make_folder(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir, "cannot create the checkpoint folder: " + ec.message(), "choose another checkpoint.dir");
}

}  // namespace

const Tensor* Checkpoint::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

void write_checkpoint(const std::string& dir, const Checkpoint& c, const std::vector<std::string>& parts) {
  make_folder(dir);
  write_file(fs::path(dir) / step_name(c.step), c, parts);
  write_file_atomic((fs::path(dir) / "latest").string(), step_name(c.step) + "\n",
                    "check the free space and permissions of checkpoint.dir");
  // Keep this one and the newest below it, with their parts; anything else (older, or a later
  // step of another series) would only confuse `latest`.
  int64_t previous = -1;
  for (const auto& [s, p] : checkpoint_files(dir))
    if (s < c.step) previous = s;
  std::error_code ec;
  for (bool part : {false, true})
    for (const auto& [s, p] : checkpoint_files(dir, part))
      if (s != c.step && s != previous) fs::remove(p, ec);
}

std::string checkpoint_part_name(int64_t step, int rank) {
  const std::string ckpt = step_name(step);
  return ckpt.substr(0, ckpt.size() - 5) + ".rank" + std::to_string(rank) + ".part";
}

void write_checkpoint_part(const std::string& dir, const Checkpoint& c, int rank) {
  make_folder(dir);
  write_file(fs::path(dir) / checkpoint_part_name(c.step, rank), c, {});
}

std::vector<int64_t> checkpoint_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  for (const auto& [s, p] : checkpoint_files(dir)) steps.push_back(s);
  return steps;
}

void clear_checkpoints(const std::string& dir) {
  for (bool part : {false, true})
    for (const auto& [s, p] : checkpoint_files(dir, part)) {
      std::error_code ec;
      fs::remove(p, ec);
      if (ec) throw UserError(p.string(), "cannot be removed: " + ec.message(), "remove it by hand, or choose another checkpoint.dir");
    }
  std::error_code ec;
  fs::remove(fs::path(dir) / "latest", ec);
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
  // The parts the ranks wrote, beside this file.
  for (const auto& name : h.value("parts", nlohmann::json::array())) {
    const fs::path part = fs::path(path).parent_path() / name.get<std::string>();
    if (!fs::exists(part))
      throw UserError(part.string(), "is missing: a part of checkpoint " + fs::path(path).filename().string(),
                      "give every rank a checkpoint.dir all of them see (a shared file system), or resume from "
                      "another checkpoint");
    Checkpoint p = read_checkpoint(part.string());
    if (p.step != c.step)
      throw UserError(part.string(), "belongs to step " + std::to_string(p.step) + ", not " + std::to_string(c.step),
                      "resume from another checkpoint");
    for (auto& t : p.tensors) c.tensors.push_back(std::move(t));
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
