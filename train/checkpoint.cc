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
  std::vector<std::pair<const std::string*, const Tensor*>> all;
  for (const auto& [name, t] : c.tensors) all.emplace_back(&name, &t);
  for (const auto& [name, t] : c.borrowed) all.emplace_back(&name, t);
  for (const auto& [name_of, t_of] : all) {
    const std::string& name = *name_of;
    const Tensor& t = *t_of;
    t.load();  // a parameter no device of this process read is still in its external-data file
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

Tensor* Checkpoint::find(const std::string& name) {
  return const_cast<Tensor*>(static_cast<const Checkpoint&>(*this).find(name));
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

namespace {

// A whole number of a checkpoint header (a JSON float or a number past int64 is damage).
int64_t whole(const nlohmann::json& v, const std::string& path) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}))
    throw UserError(path, "damaged checkpoint header: " + v.dump() + " where a whole number belongs",
                    "resume from another checkpoint");
  return v.get<int64_t>();
}

// One tensor's entry of a checkpoint header, checked against the file: a known dtype, sizes from 0
// up, the byte count its type needs, and bytes that lie inside the file (`data` of them after the
// header). Throws UserError naming the file.
Tensor read_tensor(std::istream& in, const nlohmann::json& e, std::streamoff base, int64_t data,
                   const std::string& path, const TensorFilter& wanted, const TensorPlace& place) {
  const std::string name = e.at("name").get<std::string>();
  auto damaged = [&](const std::string& what) {
    return UserError(path, "damaged checkpoint: tensor '" + name + "' " + what, "resume from another checkpoint");
  };
  Tensor t;
  const int64_t dtype = whole(e.at("dtype"), path);
  t.type.dtype = static_cast<DType>(dtype);
  if (dtype < 0 || dtype > INT32_MAX || dtype_size(t.type.dtype) == 0) throw damaged("has no known dtype");
  if (!e.at("shape").is_array()) throw damaged("has no shape");
  for (const auto& d : e.at("shape")) t.type.shape.push_back(whole(d, path));
  int64_t need = static_cast<int64_t>(dtype_size(t.type.dtype));
  for (int64_t d : t.type.shape)
    if (d < 0 || __builtin_mul_overflow(need, d, &need)) throw damaged("has an impossible shape");
  const int64_t bytes = whole(e.at("bytes"), path), offset = whole(e.at("offset"), path);
  if (bytes != need) throw damaged("has the wrong size");
  if (offset < 0 || offset > data || bytes > data - offset)
    throw UserError(path, "damaged checkpoint: the file is short", "resume from another checkpoint");
  if (wanted && !wanted(name)) return t;
  std::byte* at = place ? place(name, t.type) : nullptr;
  if (!at) {
    t.data.resize(static_cast<size_t>(bytes));
    at = t.data.data();
  }
  in.seekg(base + static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(at), static_cast<std::streamsize>(bytes));
  if (!in) throw UserError(path, "damaged checkpoint: the file is short", "resume from another checkpoint");
  return t;
}

// A checkpoint file; a manifest (`part` false) may name parts, a part names none.
Checkpoint read_file(const std::string& path, bool part, const TensorFilter& wanted, const TensorPlace& place) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "cannot read the checkpoint", "check checkpoint.dir");
  std::string magic, header;
  std::getline(in, magic);
  std::getline(in, header);
  if (magic != kMagic) throw UserError(path, "is not a pipetrain checkpoint", "point checkpoint.dir at a folder `pipetrain train` wrote");
  const std::streamoff base = in.tellg();
  std::error_code ec;
  const int64_t data = static_cast<int64_t>(fs::file_size(path, ec)) - static_cast<int64_t>(base);
  if (ec || base < 0) throw UserError(path, "damaged checkpoint: the file is short", "resume from another checkpoint");
  Checkpoint c;
  std::vector<std::string> parts;
  try {
    const nlohmann::json h = nlohmann::json::parse(header);
    c.step = whole(h.at("step"), path);
    c.data_position = whole(h.at("data_position"), path);
    c.meta = h.at("meta").get<std::map<std::string, std::string>>();
    for (const auto& e : h.at("tensors")) {
      Tensor t = read_tensor(in, e, base, data, path, wanted, place);
      c.tensors.emplace_back(e.at("name").get<std::string>(), std::move(t));
    }
    parts = h.value("parts", std::vector<std::string>{});
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, std::string("damaged checkpoint header: ") + e.what(), "resume from another checkpoint");
  }
  // The parts the ranks wrote, beside this file: names of the form step_N.rankR.part, nothing else.
  if (part && !parts.empty())
    throw UserError(path, "damaged checkpoint: a part that names parts", "resume from another checkpoint");
  for (const std::string& name : parts) {
    if (step_of(name, true) < 0 || fs::path(name).filename() != name)
      throw UserError(path, "damaged checkpoint: names a part '" + name + "', not a step_N.rankR.part beside it",
                      "resume from another checkpoint");
    const fs::path file = fs::path(path).parent_path() / name;
    if (!fs::exists(file, ec))
      throw UserError(file.string(), "is missing: a part of checkpoint " + fs::path(path).filename().string(),
                      "give every rank a checkpoint.dir all of them see (a shared file system), or resume from "
                      "another checkpoint");
    Checkpoint p = read_file(file.string(), true, wanted, place);
    if (p.step != c.step)
      throw UserError(file.string(), "belongs to step " + std::to_string(p.step) + ", not " + std::to_string(c.step),
                      "resume from another checkpoint");
    for (auto& t : p.tensors) c.tensors.push_back(std::move(t));
  }
  return c;
}

}  // namespace

Checkpoint read_checkpoint(const std::string& path, const TensorFilter& wanted, const TensorPlace& place) {
  return read_file(path, false, wanted, place);
}

std::optional<Checkpoint> read_latest_checkpoint(const std::string& dir, const TensorFilter& wanted, const TensorPlace& place) {
  std::ifstream latest(fs::path(dir) / "latest");
  if (!latest) return std::nullopt;
  std::string name;
  std::getline(latest, name);
  if (step_of(name, false) < 0 || fs::path(name).filename() != name)
    throw UserError((fs::path(dir) / "latest").string(), "names '" + name + "', not a step_N.ckpt beside it",
                    "remove it, or resume from a checkpoint file by name");
  return read_checkpoint((fs::path(dir) / name).string(), wanted, place);
}

}  // namespace pt
