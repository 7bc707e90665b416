#include "train/data.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <numeric>

#include "core/error.h"
#include "core/half_floats.h"
#include "exec/npy.h"

namespace pt {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): a 64-bit state stepped by a constant and finalised by a
// bijective mix; good enough for shuffles and synthetic data, and the same everywhere.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t combine(uint64_t a, uint64_t b) { return mix64(a + 0x9e3779b97f4a7c15ull * (b + 1)); }

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_ += 0x9e3779b97f4a7c15ull); }
  // Uniform in [0, n), unbiased: draws below 2^64 mod n are rejected.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t x = next();
      if (x >= threshold) return x % n;
    }
  }
  double open01() { return (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53; }  // (0, 1]
  double half01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }          // [0, 1)

 private:
  uint64_t state_;
};

uint64_t name_hash(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool is_integer(DType t) {
  switch (t) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kUInt16:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kUInt32:
    case DType::kUInt64:
    case DType::kBool:
      return true;
    default:
      return false;
  }
}

// Element i of an integer (or bool) tensor, and storing one.
int64_t load_int(DType t, const std::byte* p, int64_t i) {
  switch (t) {
    case DType::kUInt8:
      return reinterpret_cast<const uint8_t*>(p)[i];
    case DType::kBool:
      return reinterpret_cast<const uint8_t*>(p)[i] != 0;
    case DType::kInt8:
      return reinterpret_cast<const int8_t*>(p)[i];
    case DType::kUInt16:
      return reinterpret_cast<const uint16_t*>(p)[i];
    case DType::kInt16:
      return reinterpret_cast<const int16_t*>(p)[i];
    case DType::kInt32:
      return reinterpret_cast<const int32_t*>(p)[i];
    case DType::kUInt32:
      return reinterpret_cast<const uint32_t*>(p)[i];
    case DType::kInt64:
      return reinterpret_cast<const int64_t*>(p)[i];
    case DType::kUInt64:
      return static_cast<int64_t>(reinterpret_cast<const uint64_t*>(p)[i]);
    default:
      PT_CHECK(false, std::string("not an integer dtype: ") + dtype_name(t));
  }
  return 0;
}

void store_int(DType t, std::byte* p, int64_t i, int64_t v) {
  switch (t) {
    case DType::kUInt8:
    case DType::kBool:
      reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DType::kInt8:
      reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case DType::kUInt16:
      reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v);
      break;
    case DType::kInt16:
      reinterpret_cast<int16_t*>(p)[i] = static_cast<int16_t>(v);
      break;
    case DType::kInt32:
      reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::kUInt32:
      reinterpret_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v);
      break;
    case DType::kInt64:
      reinterpret_cast<int64_t*>(p)[i] = v;
      break;
    case DType::kUInt64:
      reinterpret_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v);
      break;
    default:
      PT_CHECK(false, std::string("not an integer dtype: ") + dtype_name(t));
  }
}

TensorType per_sample(const TensorType& t) {
  return {t.dtype, std::vector<int64_t>(t.shape.begin() + 1, t.shape.end())};
}

// "float32[N,3,8,8]": the array a .npy file of N samples for feed type t holds.
std::string with_n(const TensorType& t) {
  std::string s = std::string(dtype_name(t.dtype)) + "[N";
  for (size_t i = 1; i < t.shape.size(); ++i) (s += ',') += std::to_string(t.shape[i]);
  return s + "]";
}

std::string base_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

std::string where_of(const DataOptions& o, const std::string& key) {
  return o.where ? o.where(key) : key;
}

std::string names_of(const std::vector<FeedSpec>& feeds) {
  std::string s;
  for (const FeedSpec& f : feeds) s += (s.empty() ? "" : ", ") + f.name;
  return s;
}

}  // namespace

// Where the bytes of sample s come from. read() writes one row of feed f (the loader's feed order:
// the inputs, then the target) in the feed's dtype.
class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual int64_t samples() const = 0;
  virtual void read(int64_t sample, size_t feed, std::byte* dst) const = 0;
};

namespace {

// npy: one tensor per feed, N samples along axis 0, already checked against the feed's type.
class NpySource : public DataSource {
 public:
  explicit NpySource(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {}
  int64_t samples() const override { return tensors_[0].type.shape[0]; }
  void read(int64_t sample, size_t feed, std::byte* dst) const override {
    const Tensor& t = tensors_[feed];
    const size_t row = t.data.size() / static_cast<size_t>(t.type.shape[0]);
    std::memcpy(dst, t.data.data() + row * static_cast<size_t>(sample), row);
  }

 private:
  std::vector<Tensor> tensors_;
};

// tokens: the raw file (uint8 or uint16 ids); sample i of feed 0 is ids [i*T, i*T+T), of feed 1
// (the target) ids [i*T+1, i*T+T+1).
class TokenSource : public DataSource {
 public:
  // bytes: the file, or nothing where no feed of it is read (count: its ids all the same).
  TokenSource(std::vector<std::byte> bytes, int64_t count, int width, int64_t window, DType input, DType target)
      : bytes_(std::move(bytes)), count_(count), width_(width), window_(window), dtypes_{input, target} {}
  int64_t count() const { return count_; }
  int64_t token(int64_t i) const {
    const auto* p = reinterpret_cast<const uint8_t*>(bytes_.data()) + i * width_;
    return width_ == 1 ? p[0] : p[0] | (p[1] << 8);  // little-endian
  }
  int64_t samples() const override { return (count() - 1) / window_; }
  void read(int64_t sample, size_t feed, std::byte* dst) const override {
    const int64_t first = sample * window_ + static_cast<int64_t>(feed);
    for (int64_t k = 0; k < window_; ++k) store_int(dtypes_[feed], dst, k, token(first + k));
  }

 private:
  std::vector<std::byte> bytes_;
  int64_t count_;
  int width_;
  int64_t window_;
  DType dtypes_[2];
};

// synthetic: sample i of a feed drawn from (seed, feed name, i) alone, so it never depends on
// which samples were read before it.
class SyntheticSource : public DataSource {
 public:
  SyntheticSource(int64_t samples, uint64_t seed, std::vector<FeedSpec> feeds)
      : samples_(samples), seed_(seed), feeds_(std::move(feeds)) {}
  int64_t samples() const override { return samples_; }
  void read(int64_t sample, size_t feed, std::byte* dst) const override {
    const FeedSpec& f = feeds_[feed];
    SplitMix64 rng(combine(combine(seed_ ^ 0x5eedda7a5eedda7aull, name_hash(f.name)),
                           static_cast<uint64_t>(sample)));
    const int64_t n = per_sample(f.type).numel();
    if (is_integer(f.type.dtype)) {
      const auto limit = static_cast<uint64_t>(f.type.dtype == DType::kBool ? 2 : f.limit);
      for (int64_t k = 0; k < n; ++k)
        store_int(f.type.dtype, dst, k, static_cast<int64_t>(rng.below(limit)));
      return;
    }
    for (int64_t k = 0; k < n; k += 2) {  // Box-Muller: two standard normals per two uniforms
      const double r = std::sqrt(-2.0 * std::log(rng.open01()));
      const double a = 2.0 * std::numbers::pi * rng.half01();
      const double z[2] = {r * std::cos(a), r * std::sin(a)};
      for (int64_t j = 0; j < 2 && k + j < n; ++j) {
        if (f.type.dtype == DType::kFloat32)
          reinterpret_cast<float*>(dst)[k + j] = static_cast<float>(z[j]);
        else
          reinterpret_cast<double*>(dst)[k + j] = z[j];
      }
    }
  }

 private:
  int64_t samples_;
  uint64_t seed_;
  std::vector<FeedSpec> feeds_;
};

// --- building a source, with every check on the user's data --------------------------------

struct Builder {
  const DataOptions& o;
  const std::vector<FeedSpec>& feeds;  // inputs, then the target (last)
  size_t inputs() const { return feeds.size() - 1; }

  [[noreturn]] void fail(const std::string& key, const std::string& what,
                         const std::string& todo) const {
    throw UserError(where_of(o, key), what, todo);
  }

  void need_file(const std::string& key, const std::string& path) const {
    if (!std::filesystem::is_regular_file(path))
      fail(key, "file '" + path + "' does not exist",
           "check the path (" + (o.path_rule ? o.path_rule(key) : "relative paths are from the working folder") + ")");
  }

  // The file's tensor (only its type where the feed is not read), checked against the feed.
  Tensor read_checked(const std::string& key, const std::string& path, const FeedSpec& f) const {
    need_file(key, path);
    Tensor t;
    try {
      if (f.read) t = read_npy(path);
      else t.type = read_npy_type(path);
    } catch (const UserError& e) {
      fail(key, e.what(), "");
    }
    // float16 data for a float32 feed (a half model's input, widened with its weights at import,
    // onnx_import/widen_halves.h): widened exactly as the weights are.
    if (t.type.dtype == DType::kFloat16 && f.type.dtype == DType::kFloat32) {
      if (f.read) t = widened(t);
      else t.type.dtype = DType::kFloat32;
    }
    const TensorType want = per_sample(f.type);
    const int64_t rows = f.type.shape[0];
    if (t.type.shape.empty() || per_sample(t.type) != want) {
      const std::string holds =
          t.type.shape.empty() ? "a scalar " + t.type.str()
                               : per_sample(t.type).str() + " per sample (" + t.type.str() + ")";
      fail(key,
           base_name(path) + " holds " + holds + ", but the model's '" + f.name + "' takes " +
               want.str() + " per sample (" + f.type.str() + " per micro-batch of " +
               std::to_string(rows) + ")",
           "give an array of " + with_n(f.type) + " (N samples)");
    }
    if (t.type.shape[0] < 1) fail(key, base_name(path) + " holds no samples", "give at least one");
    return t;
  }

  // Integer inputs feed Gathers: every value must index the embedding.
  void check_range(const std::string& key, const std::string& path, const Tensor& t,
                   const FeedSpec& f) const {
    if (f.limit <= 0 || !is_integer(t.type.dtype) || t.type.dtype == DType::kBool) return;
    const int64_t n = t.type.numel(), per = per_sample(t.type).numel();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = load_int(t.type.dtype, t.data.data(), i);
      if (v < 0 || v >= f.limit)
        fail(key,
             base_name(path) + " holds " + std::to_string(v) + " at sample " +
                 std::to_string(i / per) + " (element " + std::to_string(i % per) +
                 "), outside [0, " + std::to_string(f.limit) + ") of the model's '" + f.name + "'",
             "give values in [0, " + std::to_string(f.limit) + ")");
    }
  }

  std::unique_ptr<DataSource> npy() const {
    for (const auto& [name, path] : o.inputs) {
      bool known = false;
      for (size_t i = 0; i < inputs(); ++i) known |= feeds[i].name == name;
      if (!known)
        fail("data.inputs." + name, "the model has no input '" + name + "'",
             "its inputs are: " + names_of({feeds.begin(), feeds.end() - 1}));
    }
    std::vector<Tensor> tensors;
    std::vector<std::string> keys, paths;
    for (size_t i = 0; i <= inputs(); ++i) {
      const FeedSpec& f = feeds[i];
      const bool target = i == inputs();
      std::string key = target ? "data.targets" : "data.inputs." + f.name;
      std::string path = target ? o.targets : (o.inputs.count(f.name) ? o.inputs.at(f.name) : "");
      if (path.empty())
        fail(target ? "data" : "data.inputs",
             target ? "no data.targets file" : "the model's input '" + f.name + "' has no file",
             "give " + key + ": FILE.npy holding " + with_n(f.type) + " (N samples)");
      tensors.push_back(read_checked(key, path, f));
      if (!target && f.read) check_range(key, path, tensors.back(), f);
      keys.push_back(key);
      paths.push_back(path);
    }
    for (size_t i = 1; i < tensors.size(); ++i)
      if (tensors[i].type.shape[0] != tensors[0].type.shape[0])
        fail(keys[i],
             base_name(paths[i]) + " holds " + std::to_string(tensors[i].type.shape[0]) +
                 " samples, but " + keys[0] + " (" + base_name(paths[0]) + ") holds " +
                 std::to_string(tensors[0].type.shape[0]),
             "give every file the same number of samples on axis 0");
    return std::make_unique<NpySource>(std::move(tensors));
  }

  // The width of a token id in `path` (see data.h).
  int token_width(const std::string& path, int64_t limit) const {
    const std::string ext = std::filesystem::path(path).extension().string();
    if (ext == ".u16") return 2;
    if (ext == ".u8" || ext == ".txt") return 1;
    return limit > 256 ? 2 : 1;
  }

  std::unique_ptr<DataSource> tokens() const {
    const FeedSpec& in = feeds[0];
    const FeedSpec& target = feeds.back();
    if (inputs() != 1 || !is_integer(in.type.dtype) || in.type.shape.size() != 2)
      fail("data.kind",
           "tokens feeds one integer input of shape [rows, T], but the model takes " +
               names_of({feeds.begin(), feeds.end() - 1}) + " (" + in.type.str() +
               (inputs() > 1 ? ", ..." : "") + ")",
           "use data.kind npy");
    const int64_t window = in.type.shape[1];
    if (!is_integer(target.type.dtype) || per_sample(target.type).numel() != window)
      fail("data.kind",
           "tokens gives next-token ids, " + std::to_string(window) +
               " per sample, but the loss target is " + target.type.str(),
           "use loss.kind cross_entropy on the logits of every position");
    need_file("data.file", o.file);
    const size_t size = std::filesystem::file_size(o.file);
    const bool read = in.read || target.read;  // else the file's size is all this process needs
    std::vector<std::byte> bytes(read ? size : 0);
    std::ifstream f;
    if (read) f.open(o.file, std::ios::binary);
    if (read && !f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
      fail("data.file", "'" + o.file + "' cannot be read", "check its permissions");
    const int64_t limit = in.limit > 0 && target.limit > 0 ? std::min(in.limit, target.limit)
                                                           : std::max(in.limit, target.limit);
    const int width = token_width(o.file, limit);
    if (size % width != 0)
      fail("data.file",
           base_name(o.file) + " has an odd number of bytes, but holds uint16 token ids",
           "write every id as two little-endian bytes");
    auto src = std::make_unique<TokenSource>(std::move(bytes), static_cast<int64_t>(size) / width, width, window,
                                             in.type.dtype, target.type.dtype);
    if (src->samples() < 1)
      fail("data.file",
           base_name(o.file) + " holds " + std::to_string(src->count()) +
               " tokens, fewer than one window of " + std::to_string(window) + " + 1",
           "give a longer file");
    for (int64_t i = 0; read && limit > 0 && i < src->count(); ++i)
      if (src->token(i) >= limit)
        fail("data.file",
             base_name(o.file) + " holds token " + std::to_string(src->token(i)) + " at offset " +
                 std::to_string(i) + " (byte " + std::to_string(i * width) +
                 "), but the model's '" + in.name + "' takes ids below " + std::to_string(limit),
             "use ids below " + std::to_string(limit) +
                 (width == 1 ? "" : " or a .u8 file of bytes"));
    return src;
  }

  std::unique_ptr<DataSource> synthetic() const {
    for (const FeedSpec& f : feeds) {
      const DType t = f.type.dtype;
      if (is_integer(t) && t != DType::kBool && f.limit <= 0)
        fail("data.kind",
             "synthetic cannot draw values for '" + f.name + "' (" + f.type.str() +
                 ") without knowing their range",
             "use data.kind npy");
      if (!is_integer(t) && t != DType::kFloat32 && t != DType::kFloat64)
        fail("data.kind",
             std::string("synthetic draws float32, float64 and integer data, not ") +
                 dtype_name(t) + " for '" + f.name + "'",
             "use data.kind npy");
    }
    return std::make_unique<SyntheticSource>(o.samples, o.seed, feeds);
  }
};

}  // namespace

DataLoader::DataLoader(const DataOptions& options, std::vector<FeedSpec> inputs, FeedSpec target)
    : options_(options), feeds_(std::move(inputs)) {
  if (target.name.empty()) target.name = "target";
  PT_CHECK(!feeds_.empty(), "the model has no inputs");
  for (const FeedSpec& f : feeds_)
    if (f.name == target.name)
      throw UserError(
          where_of(options_, "data"),
          "the model has an input named '" + f.name + "', the name the target is fed under",
          "rename the model's input");
  feeds_.push_back(std::move(target));
  rows_ = feeds_[0].type.shape.empty() ? 0 : feeds_[0].type.shape[0];
  for (const FeedSpec& f : feeds_)
    if (f.type.shape.empty() || f.type.shape[0] != rows_ || rows_ < 1)
      throw UserError(where_of(options_, "dims.batch"),
                      "'" + f.name + "' is " + f.type.str() +
                          ", but every feed needs the micro-batch's " + std::to_string(rows_) +
                          " rows on axis 0",
                      "bind the model's batch dim with dims.batch");

  const Builder b{options_, feeds_};
  if (options_.kind == "npy")
    source_ = b.npy();
  else if (options_.kind == "tokens")
    source_ = b.tokens();
  else if (options_.kind == "synthetic")
    source_ = b.synthetic();
  else
    throw UserError(where_of(options_, "data.kind"), "unknown kind '" + options_.kind + "'",
                    "use synthetic, npy or tokens");

  const int64_t n = source_->samples();
  eval_samples_ = std::llround(options_.eval_fraction * static_cast<double>(n));
  train_samples_ = n - eval_samples_;
  if (train_samples_ < 1)
    throw UserError(where_of(options_, "data.eval_fraction"),
                    "holding out " + std::to_string(eval_samples_) + " of " + std::to_string(n) +
                        " samples leaves none to train on",
                    "hold out less, or give more data");
}

DataLoader::~DataLoader() = default;

FeedMap DataLoader::make_feeds() const {
  FeedMap m;
  for (const FeedSpec& f : feeds_) {
    Tensor& t = m[f.name];
    t.type = f.type;
    t.data.resize(static_cast<size_t>(f.type.bytes()));
  }
  return m;
}

void DataLoader::copy_sample(int64_t sample, FeedMap& feeds, int64_t row) const {
  for (size_t i = 0; i < feeds_.size(); ++i) {
    if (!feeds_[i].read) continue;  // zeros: no chunk of this process takes it
    Tensor& t = feeds.at(feeds_[i].name);
    const size_t bytes = t.data.size() / static_cast<size_t>(rows_);
    source_->read(sample, i, t.data.data() + bytes * static_cast<size_t>(row));
  }
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  SplitMix64 rng(combine(seed, stream));
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(p[i], p[static_cast<size_t>(rng.below(static_cast<uint64_t>(i) + 1))]);
  return p;
}

const std::vector<int64_t>& DataLoader::epoch_order(int64_t epoch) {
  if (order_epoch_ != epoch) {
    order_ = seeded_permutation(train_samples_, options_.seed, static_cast<uint64_t>(epoch));
    order_epoch_ = epoch;
  }
  return order_;
}

int64_t DataLoader::sample_at(int64_t position) {
  PT_CHECK(position >= 0);
  const int64_t k = position % train_samples_;
  return options_.shuffle ? epoch_order(position / train_samples_)[static_cast<size_t>(k)] : k;
}

std::vector<FeedMap> DataLoader::next(int micro_batches) {
  PT_CHECK(micro_batches >= 1);
  std::vector<FeedMap> batch;
  for (int m = 0; m < micro_batches; ++m) {
    batch.push_back(make_feeds());
    for (int64_t r = 0; r < rows_; ++r)
      copy_sample(sample_at(position_ + m * rows_ + r), batch.back(), r);
  }
  position_ += micro_batches * rows_;
  return batch;
}

FeedMap DataLoader::eval_batch(int64_t i) const {
  PT_CHECK(i >= 0 && i < eval_batches());
  FeedMap feeds = make_feeds();
  for (int64_t r = 0; r < rows_; ++r) copy_sample(train_samples_ + i * rows_ + r, feeds, r);
  return feeds;
}

void DataLoader::seek(int64_t position) {
  PT_CHECK(position >= 0);
  position_ = position;
}

}  // namespace pt
