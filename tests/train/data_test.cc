// Data loaders: the order samples are read in (epochs, shuffles, wrapping, seek), the split, the
// three kinds of data, and the user errors for bad files.
#include "train/data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>

#include "core/error.h"
#include "core/half_floats.h"
#include "exec/npy.h"

namespace pt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() / ("pt_data_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

// Removes this process's temporary files after the last test.
class RemoveTempDir : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(temp_dir()); }
};
const auto* const kRemoveTempDir = ::testing::AddGlobalTestEnvironment(new RemoveTempDir);

template <class T>
Tensor tensor(std::vector<int64_t> shape, const std::vector<T>& values) {
  Tensor t;
  t.type = {dtype_of<T>(), std::move(shape)};
  t.data.resize(values.size() * sizeof(T));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

template <class T>
std::vector<T> values(const Tensor& t) {
  return {t.as<T>(), t.as<T>() + t.type.numel()};
}

// n samples of a float32[per] input whose every element is the sample's index, and int64 targets
// equal to the index: reading a batch back tells which samples it holds.
struct IndexedNpy {
  std::string x, y;
  IndexedNpy(int64_t n, int64_t per = 3, const std::string& prefix = "") {
    const fs::path d = temp_dir();
    std::vector<float> xs;
    std::vector<int64_t> ys;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < per; ++k) xs.push_back(static_cast<float>(i));
      ys.push_back(i);
    }
    x = (d / (prefix + "x.npy")).string();
    y = (d / (prefix + "y.npy")).string();
    write_npy(tensor<float>({n, per}, xs), x);
    write_npy(tensor<int64_t>({n}, ys), y);
  }
};

DataOptions npy_options(const IndexedNpy& files, bool shuffle, double eval_fraction = 0) {
  DataOptions o;
  o.kind = "npy";
  o.inputs = {{"x", files.x}};
  o.targets = files.y;
  o.shuffle = shuffle;
  o.eval_fraction = eval_fraction;
  o.seed = 7;
  o.where = [](const std::string& key) { return "train.yaml:5: " + key; };
  return o;
}

DataLoader indexed_loader(const IndexedNpy& files, int64_t rows, bool shuffle,
                          double eval_fraction = 0) {
  return DataLoader(npy_options(files, shuffle, eval_fraction),
                    {{"x", {DType::kFloat32, {rows, 3}}}}, {"target", {DType::kInt64, {rows}}});
}

// The sample indices of one global batch, micro-batch after micro-batch, checking that the input
// and the target of each row come from the same sample.
std::vector<int64_t> batch_samples(const std::vector<FeedMap>& batch) {
  std::vector<int64_t> out;
  for (const FeedMap& m : batch) {
    const auto x = values<float>(m.at("x"));
    const auto y = values<int64_t>(m.at("target"));
    for (size_t r = 0; r < y.size(); ++r) {
      EXPECT_EQ(x[r * 3], static_cast<float>(y[r])) << "row " << r << " mixes two samples";
      out.push_back(y[r]);
    }
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  std::sort(v.begin(), v.end());
  std::vector<int64_t> want(static_cast<size_t>(n));
  std::iota(want.begin(), want.end(), int64_t{0});
  return v == want;
}

TEST(SeededPermutation, IsAPermutationFixedBySeedAndStream) {
  const auto p = seeded_permutation(1000, 3, 0);
  EXPECT_TRUE(is_permutation_of_range(p, 1000));
  EXPECT_EQ(p, seeded_permutation(1000, 3, 0));
  EXPECT_NE(p, seeded_permutation(1000, 3, 1));
  EXPECT_NE(p, seeded_permutation(1000, 4, 0));
  // Pinned: checkpoints resume the stream by position alone, so the permutation of (seed, epoch)
  // must never change between builds or platforms.
  EXPECT_EQ(seeded_permutation(8, 0, 0), (std::vector<int64_t>{1, 0, 6, 4, 3, 5, 2, 7}));
}

TEST(SeededPermutation, EveryElementReachesEveryPlace) {
  // Fisher-Yates with an unbiased draw: over many streams, element 0 lands in each of 5 places
  // about 1/5 of the time.
  std::vector<int> count(5);
  for (uint64_t s = 0; s < 5000; ++s) {
    const auto p = seeded_permutation(5, 1, s);
    ++count[std::find(p.begin(), p.end(), 0) - p.begin()];
  }
  for (int c : count) EXPECT_NEAR(c, 1000, 120);
}

TEST(DataLoader, WithoutShuffleStepsReadTheTrainSplitInOrderAndWrap) {
  const IndexedNpy files(10);
  DataLoader d = indexed_loader(files, /*rows=*/2, /*shuffle=*/false);
  ASSERT_EQ(d.train_samples(), 10);
  // Global batch 2 micro-batches x 2 rows; micro-batch m holds rows [2m, 2m+2) of the batch.
  EXPECT_EQ(batch_samples(d.next(2)), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(batch_samples(d.next(2)), (std::vector<int64_t>{4, 5, 6, 7}));
  // Epoch 0 ends inside this batch; epoch 1 starts again at sample 0.
  EXPECT_EQ(batch_samples(d.next(2)), (std::vector<int64_t>{8, 9, 0, 1}));
  EXPECT_EQ(d.position(), 12);
  EXPECT_EQ(d.epoch(), 1);
}

TEST(DataLoader, MicroBatchesHaveTheFeedsTypes) {
  const IndexedNpy files(10);
  DataLoader d = indexed_loader(files, 2, true);
  const auto batch = d.next(3);
  ASSERT_EQ(batch.size(), 3u);
  for (const FeedMap& m : batch) {
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m.at("x").type.str(), "float32[2,3]");
    EXPECT_EQ(m.at("target").type.str(), "int64[2]");
  }
}

TEST(DataLoader, ShuffledEpochsArePermutationsThatDiffer) {
  const IndexedNpy files(10);
  DataLoader d = indexed_loader(files, 2, true);
  // 15 steps of 4 samples = 6 whole epochs, read across batch boundaries.
  std::vector<int64_t> stream;
  for (int s = 0; s < 15; ++s) {
    const auto b = batch_samples(d.next(2));
    stream.insert(stream.end(), b.begin(), b.end());
  }
  std::set<std::vector<int64_t>> orders;
  for (int e = 0; e < 6; ++e) {
    const std::vector<int64_t> epoch(stream.begin() + e * 10, stream.begin() + (e + 1) * 10);
    EXPECT_TRUE(is_permutation_of_range(epoch, 10)) << "epoch " << e;
    orders.insert(epoch);
  }
  EXPECT_EQ(orders.size(), 6u) << "some epochs repeat the same order";
  std::vector<int64_t> in_order(10);
  std::iota(in_order.begin(), in_order.end(), int64_t{0});
  EXPECT_FALSE(orders.count(in_order));
}

TEST(DataLoader, SameSeedSameStreamOtherSeedOtherStream) {
  const IndexedNpy files(50);
  DataLoader a = indexed_loader(files, 4, true);
  DataLoader b = indexed_loader(files, 4, true);
  DataOptions o = npy_options(files, true);
  o.seed = 8;
  DataLoader c(o, {{"x", {DType::kFloat32, {4, 3}}}}, {"target", {DType::kInt64, {4}}});
  const auto sa = batch_samples(a.next(4));
  EXPECT_EQ(sa, batch_samples(b.next(4)));
  EXPECT_NE(sa, batch_samples(c.next(4)));
}

TEST(DataLoader, SeekReproducesTheBatchesThatFollowed) {
  const IndexedNpy files(10);
  DataLoader a = indexed_loader(files, 2, true);
  for (int s = 0; s < 3; ++s) a.next(3);  // 18 samples: into epoch 1
  const int64_t p = a.position();
  ASSERT_EQ(p, 18);
  std::vector<std::vector<int64_t>> after;
  for (int s = 0; s < 4; ++s) after.push_back(batch_samples(a.next(3)));

  DataLoader b = indexed_loader(files, 2, true);  // a fresh loader resumed from a checkpoint
  b.seek(p);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(batch_samples(b.next(3)), after[s]) << "step " << s;
  a.seek(p);  // and the same loader sent back across two epochs
  for (int s = 0; s < 4; ++s) EXPECT_EQ(batch_samples(a.next(3)), after[s]) << "step " << s;
  EXPECT_EQ(a.position(), p + 4 * 6);
}

TEST(DataLoader, EvalSplitIsTheLastSamplesAndNeverTrained) {
  const IndexedNpy files(23);
  DataLoader d = indexed_loader(files, 2, true, /*eval_fraction=*/0.2);
  EXPECT_EQ(d.eval_samples(), 5);  // round(4.6)
  EXPECT_EQ(d.train_samples(), 18);
  ASSERT_EQ(d.eval_batches(), 2);  // samples 18..21; the partial batch {22} is dropped
  EXPECT_EQ(batch_samples({d.eval_batch(0)}), (std::vector<int64_t>{18, 19}));
  EXPECT_EQ(batch_samples({d.eval_batch(1)}), (std::vector<int64_t>{20, 21}));
  std::vector<int64_t> seen;
  for (int s = 0; s < 9; ++s) {  // 9 steps of 4 = 2 epochs
    const auto b = batch_samples(d.next(2));
    seen.insert(seen.end(), b.begin(), b.end());
  }
  EXPECT_TRUE(is_permutation_of_range({seen.begin(), seen.begin() + 18}, 18));
  EXPECT_TRUE(is_permutation_of_range({seen.begin() + 18, seen.end()}, 18));
}

TEST(DataLoader, EvalFractionLeavingNothingToTrainIsAnError) {
  const IndexedNpy files(3);
  const std::string e = error_of([&] { indexed_loader(files, 1, true, 0.9); });
  EXPECT_THAT(e, HasSubstr("train.yaml:5: data.eval_fraction: holding out 3 of 3 samples"));
}

TEST(DataLoader, SyntheticIsDeterministicAndDistributedAsPromised) {
  DataOptions o;
  o.kind = "synthetic";
  o.samples = 512;
  o.seed = 1;
  const std::vector<FeedSpec> inputs = {{"img", {DType::kFloat32, {8, 4, 4}}},
                                        {"ids", {DType::kInt64, {8, 6}}, 5}};
  const FeedSpec target{"target", {DType::kInt64, {8}}, 3};
  DataLoader a(o, inputs, target), b(o, inputs, target);
  o.seed = 2;
  DataLoader c(o, inputs, target);
  std::vector<double> xs;
  std::vector<int> ids(5), classes(3);
  for (int s = 0; s < 8; ++s) {
    const auto ba = a.next(8), bb = b.next(8), bc = c.next(8);
    for (int m = 0; m < 8; ++m) {
      EXPECT_EQ(ba[m].at("img").data, bb[m].at("img").data);
      EXPECT_EQ(ba[m].at("ids").data, bb[m].at("ids").data);
      EXPECT_NE(ba[m].at("img").data, bc[m].at("img").data);
      for (float v : values<float>(ba[m].at("img"))) xs.push_back(v);
      for (int64_t v : values<int64_t>(ba[m].at("ids"))) {
        ASSERT_TRUE(v >= 0 && v < 5) << v;
        ++ids[v];
      }
      for (int64_t v : values<int64_t>(ba[m].at("target"))) {
        ASSERT_TRUE(v >= 0 && v < 3) << v;
        ++classes[v];
      }
    }
  }
  // 512 samples x 16 floats: mean 0, variance 1 within a few standard errors.
  const double mean = std::accumulate(xs.begin(), xs.end(), 0.0) / xs.size();
  double var = 0;
  for (double v : xs) var += (v - mean) * (v - mean);
  var /= xs.size();
  EXPECT_NEAR(mean, 0, 0.05);
  EXPECT_NEAR(var, 1, 0.06);
  for (int c : ids) EXPECT_NEAR(c, 512 * 6 / 5, 120);
  for (int c : classes) EXPECT_NEAR(c, 512 / 3, 50);
}

TEST(DataLoader, SyntheticSampleDependsOnItsIndexOnly) {
  DataOptions o;
  o.kind = "synthetic";
  o.samples = 20;
  o.shuffle = false;
  const std::vector<FeedSpec> in1 = {{"x", {DType::kFloat32, {1, 5}}}};
  const std::vector<FeedSpec> in4 = {{"x", {DType::kFloat32, {4, 5}}}};
  DataLoader one(o, in1, {"target", {DType::kFloat32, {1, 2}}});
  DataLoader four(o, in4, {"target", {DType::kFloat32, {4, 2}}});
  std::vector<std::byte> a, b;
  for (int s = 0; s < 20; ++s) {
    const auto t = one.next(1)[0].at("x").data;
    a.insert(a.end(), t.begin(), t.end());
  }
  for (int s = 0; s < 5; ++s) {
    const auto t = four.next(1)[0].at("x").data;
    b.insert(b.end(), t.begin(), t.end());
  }
  EXPECT_EQ(a, b) << "the same samples read with another micro-batch size differ";
}

TEST(DataLoader, SyntheticIntegerInputNeedsItsRange) {
  DataOptions o;
  o.kind = "synthetic";
  o.where = [](const std::string& key) { return "c.yaml:3: " + key; };
  const std::string e = error_of([&] {
    DataLoader(o, {{"ids", {DType::kInt64, {2, 6}}}}, {"target", {DType::kInt64, {2}}, 4});
  });
  EXPECT_EQ(e,
            "c.yaml:3: data.kind: synthetic cannot draw values for 'ids' (int64[2,6]) without "
            "knowing their range; use data.kind npy");
}

// --- tokens -------------------------------------------------------------------------------------

std::string write_bytes(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string p = (temp_dir() / name).string();
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return p;
}

DataOptions token_options(const std::string& file) {
  DataOptions o;
  o.kind = "tokens";
  o.file = file;
  o.shuffle = false;
  o.where = [](const std::string& key) { return "train.yaml:9: " + key; };
  return o;
}

TEST(DataLoader, TokenWindowsAreNonOverlappingWithTheNextTokenAsTarget) {
  std::vector<uint8_t> text(27);
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<uint8_t>(100 + i);
  const std::string f = write_bytes("text.txt", text);
  // T = 4: (27 - 1) / 4 = 6 windows; the last full window needs token 24 as its last target.
  DataLoader d(token_options(f), {{"input", {DType::kInt64, {2, 4}}, 256}},
               {"target", {DType::kInt64, {2, 4}}, 256});
  ASSERT_EQ(d.train_samples(), 6);
  const auto batch = d.next(3);
  for (int m = 0; m < 3; ++m) {
    const auto x = values<int64_t>(batch[m].at("input"));
    const auto y = values<int64_t>(batch[m].at("target"));
    for (int r = 0; r < 2; ++r)
      for (int k = 0; k < 4; ++k) {
        const int64_t i = (m * 2 + r) * 4 + k;  // sample m*2+r, position k
        EXPECT_EQ(x[r * 4 + k], 100 + i);
        EXPECT_EQ(y[r * 4 + k], 100 + i + 1);
      }
  }
}

TEST(DataLoader, TokenWidthComesFromTheExtensionAndTheVocabulary) {
  // Little-endian uint16 ids: i for even i, 256 + i for odd i, i = 0..40.
  std::vector<uint8_t> bytes;
  for (int i = 0; i <= 40; ++i) {
    const int v = i % 2 ? 256 + i : i;
    bytes.push_back(static_cast<uint8_t>(v & 0xff));
    bytes.push_back(static_cast<uint8_t>(v >> 8));
  }
  const FeedSpec target{"target", {DType::kInt64, {1, 5}}, 300};
  for (const char* name : {"ids.u16", "ids.bin"}) {
    DataLoader d(token_options(write_bytes(name, bytes)), {{"input", {DType::kInt32, {1, 5}}, 300}},
                 target);
    EXPECT_EQ(d.train_samples(), 8) << name;  // 41 ids -> (41 - 1) / 5
    d.seek(1);
    const auto b = d.next(1)[0];
    EXPECT_EQ(b.at("input").type.dtype, DType::kInt32);
    EXPECT_EQ(values<int32_t>(b.at("input")), (std::vector<int32_t>{261, 6, 263, 8, 265})) << name;
    EXPECT_EQ(values<int64_t>(b.at("target")), (std::vector<int64_t>{6, 263, 8, 265, 10})) << name;
  }
  // .u8 reads the same file as bytes: 82 ids.
  DataLoader d(token_options(write_bytes("ids.u8", bytes)),
               {{"input", {DType::kInt64, {1, 5}}, 256}}, {"target", {DType::kInt64, {1, 5}}, 256});
  EXPECT_EQ(d.train_samples(), 16);
}

TEST(DataLoader, TokenAtOrPastTheVocabularyIsAnErrorWithItsOffset) {
  std::vector<uint8_t> bytes;
  for (int v : {3, 0, 1, 0, 9, 0, 2, 0}) bytes.push_back(static_cast<uint8_t>(v));
  const std::string f = write_bytes("bad.u16", bytes);
  const std::string e = error_of([&] {
    DataLoader(token_options(f), {{"input", {DType::kInt64, {1, 2}}, 8}},
               {"target", {DType::kInt64, {1, 2}}, 8});
  });
  EXPECT_EQ(e,
            "train.yaml:9: data.file: bad.u16 holds token 9 at offset 2 (byte 4), but the model's "
            "'input' takes ids below 8; use ids below 8 or a .u8 file of bytes");
}

TEST(DataLoader, TokenFileErrors) {
  const FeedSpec in{"input", {DType::kInt64, {1, 8}}, 256};
  const FeedSpec target{"target", {DType::kInt64, {1, 8}}, 256};
  EXPECT_EQ(error_of([&] { DataLoader(token_options("/nonexistent/t.txt"), {in}, target); }),
            "train.yaml:9: data.file: file '/nonexistent/t.txt' does not exist; check the path "
            "(relative paths are from the working folder)");
  const std::string shortf = write_bytes("short.txt", std::vector<uint8_t>(8, 65));
  EXPECT_THAT(error_of([&] { DataLoader(token_options(shortf), {in}, target); }),
              HasSubstr("data.file: short.txt holds 8 tokens, fewer than one window of 8 + 1"));
  const std::string odd = write_bytes("odd.u16", std::vector<uint8_t>(41, 1));
  EXPECT_THAT(error_of([&] { DataLoader(token_options(odd), {in}, target); }),
              HasSubstr("odd.u16 has an odd number of bytes"));
  const std::string ok = write_bytes("ok.txt", std::vector<uint8_t>(100, 65));
  EXPECT_THAT(error_of([&] {
                DataLoader(token_options(ok), {{"input", {DType::kFloat32, {1, 8}}}}, target);
              }),
              HasSubstr("data.kind: tokens feeds one integer input of shape [rows, T]"));
  EXPECT_THAT(error_of([&] {
                DataLoader(token_options(ok), {in}, {"target", {DType::kFloat32, {1, 8}}});
              }),
              HasSubstr("but the loss target is float32[1,8]; use loss.kind cross_entropy"));
}

// --- npy errors ---------------------------------------------------------------------------------

TEST(DataLoader, NpyShapeOrDtypeMismatchNamesTheKeyTheFileAndTheFix) {
  const IndexedNpy files(10);  // x.npy: float32[10,3]
  const DataOptions o = npy_options(files, true);
  const FeedSpec target{"target", {DType::kInt64, {2}}};
  EXPECT_EQ(
      error_of([&] {
        DataLoader(o, {{"x", {DType::kFloat32, {2, 4}}}}, target);
      }),
      "train.yaml:5: data.inputs.x: x.npy holds float32[3] per sample (float32[10,3]), but the "
      "model's 'x' takes float32[4] per sample (float32[2,4] per micro-batch of 2); give an array "
      "of "
      "float32[N,4] (N samples)");
  EXPECT_THAT(
      error_of([&] {
        DataLoader(o, {{"x", {DType::kFloat64, {2, 3}}}}, target);
      }),
      HasSubstr(
          "data.inputs.x: x.npy holds float32[3] per sample (float32[10,3]), but the model's 'x' "
          "takes float64[3] per sample"));
  EXPECT_THAT(
      error_of([&] {
        DataLoader(o, {{"x", {DType::kFloat32, {2, 3}}}}, {"target", {DType::kInt64, {2, 5}}});
      }),
      HasSubstr("data.targets: y.npy holds int64[] per sample (int64[10]), but the model's "
                "'target' takes "
                "int64[5] per sample"));
}

// A half model's data (float16, as x.half() is in PyTorch) feeds its input, which import widened
// to float32 with the weights: the values widened exactly.
TEST(DataLoader, Float16NpyFeedsAFloat32InputWidened) {
  const IndexedNpy files(4);
  const fs::path half = temp_dir() / "x_half.npy";
  const std::vector<uint16_t> bits = {0x3c00, 0xc000, 0x3555, 0x7bff, 0x0001, 0x0000,  // 1, -2, ~1/3, 65504, 2^-24, 0
                                      0x3c00, 0x3c00, 0x3c00, 0x4000, 0x4000, 0x4000};
  Tensor t;
  t.type = {DType::kFloat16, {4, 3}};
  t.data.resize(bits.size() * 2);
  std::memcpy(t.data.data(), bits.data(), t.data.size());
  write_npy(t, half.string());
  DataOptions o = npy_options(files, false);
  o.inputs = {{"x", half.string()}};
  DataLoader loader(o, {{"x", {DType::kFloat32, {2, 3}}}}, {"target", {DType::kInt64, {2}}});
  const std::vector<FeedMap> batch = loader.next(2);
  EXPECT_EQ(batch[0].at("x").type, (TensorType{DType::kFloat32, {2, 3}}));
  std::vector<float> want;
  for (uint16_t b : bits) want.push_back(float16_to_float(b));
  std::vector<float> got = values<float>(batch[0].at("x"));
  const std::vector<float> more = values<float>(batch[1].at("x"));
  got.insert(got.end(), more.begin(), more.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(want[4], std::ldexp(1.f, -24));
}

TEST(DataLoader, NpyMissingOrUnmatchedFilesAreOneLineErrors) {
  const IndexedNpy files(10);
  const FeedSpec x{"x", {DType::kFloat32, {2, 3}}};
  const FeedSpec target{"target", {DType::kInt64, {2}}};
  DataOptions o = npy_options(files, true);
  o.inputs["x"] = "/nonexistent/x.npy";
  EXPECT_EQ(error_of([&] { DataLoader(o, {x}, target); }),
            "train.yaml:5: data.inputs.x: file '/nonexistent/x.npy' does not exist; check the path "
            "(relative paths are from the working folder)");
  o = npy_options(files, true);
  o.targets = "/nonexistent/y.npy";
  EXPECT_THAT(error_of([&] { DataLoader(o, {x}, target); }),
              HasSubstr("data.targets: file '/nonexistent/y.npy' does not exist"));
  o = npy_options(files, true);
  EXPECT_EQ(
      error_of([&] {
        DataLoader(o, {x, {"mask", {DType::kFloat32, {2, 3}}}}, target);
      }),
      "train.yaml:5: data.inputs: the model's input 'mask' has no file; give data.inputs.mask: "
      "FILE.npy holding float32[N,3] (N samples)");
  o.inputs["y"] = files.x;
  EXPECT_EQ(error_of([&] { DataLoader(o, {x}, target); }),
            "train.yaml:5: data.inputs.y: the model has no input 'y'; its inputs are: x");
  const std::string notnpy = write_bytes("not.npy", {1, 2, 3});
  o = npy_options(files, true);
  o.inputs["x"] = notnpy;
  EXPECT_THAT(error_of([&] { DataLoader(o, {x}, target); }),
              HasSubstr("train.yaml:5: data.inputs.x: " + notnpy + ": is not a .npy file"));
}

TEST(DataLoader, NpyFilesMustHoldTheSameNumberOfSamples) {
  const IndexedNpy files(10);
  const IndexedNpy fewer(9, 3, "nine_");
  DataOptions o = npy_options(files, true);
  o.targets = fewer.y;
  EXPECT_THAT(error_of([&] {
                DataLoader(o, {{"x", {DType::kFloat32, {2, 3}}}}, {"target", {DType::kInt64, {2}}});
              }),
              HasSubstr("data.targets: nine_y.npy holds 9 samples, but data.inputs.x (x.npy) holds "
                        "10; give every "
                        "file the same number of samples on axis 0"));
}

TEST(DataLoader, NpyIntegerInputOutsideItsRangeIsAnError) {
  const fs::path d = temp_dir();
  write_npy(tensor<int64_t>({3, 2}, {0, 1, 2, 3, 7, 4}), (d / "ids.npy").string());
  write_npy(tensor<int64_t>({3}, {0, 1, 0}), (d / "cls.npy").string());
  DataOptions o;
  o.kind = "npy";
  o.inputs = {{"ids", (d / "ids.npy").string()}};
  o.targets = (d / "cls.npy").string();
  EXPECT_THAT(
      error_of([&] {
        DataLoader(o, {{"ids", {DType::kInt64, {1, 2}}, 5}}, {"target", {DType::kInt64, {1}}, 2});
      }),
      HasSubstr("data.inputs.ids: ids.npy holds 7 at sample 2 (element 0), outside [0, 5) of the "
                "model's 'ids'"));
}

// Across processes a rank reads only the feeds its chunks take (FeedSpec::read): a feed not read
// stays zeros, and its file is not read (a value that would be an error goes unseen); the sample
// count still comes from its header (npy) or its size (tokens).
TEST(DataLoader, AFeedNotReadHereStaysZerosAndItsDataIsNotRead) {
  const fs::path d = temp_dir();
  write_npy(tensor<int64_t>({3, 2}, {1, 1, 2, 2, 7, 4}), (d / "unread_ids.npy").string());
  write_npy(tensor<int64_t>({3}, {0, 1, 0}), (d / "unread_cls.npy").string());
  DataOptions o;
  o.kind = "npy";
  o.shuffle = false;
  o.inputs = {{"ids", (d / "unread_ids.npy").string()}};
  o.targets = (d / "unread_cls.npy").string();
  FeedSpec ids{"ids", {DType::kInt64, {1, 2}}, 5};
  ids.read = false;  // 7 lies outside [0, 5): read, it is an error
  DataLoader npy(o, {ids}, {"target", {DType::kInt64, {1}}, 2});
  EXPECT_EQ(npy.train_samples(), 3);
  const auto batch = npy.next(3);
  for (int m = 0; m < 3; ++m) {
    EXPECT_EQ(values<int64_t>(batch[m].at("ids")), (std::vector<int64_t>{0, 0}));
    EXPECT_EQ(values<int64_t>(batch[m].at("target")), (std::vector<int64_t>{m % 2}));
  }
  // Its shape is still checked, from the header.
  ids.type.shape = {1, 3};
  EXPECT_THAT(error_of([&] { DataLoader(o, {ids}, {"target", {DType::kInt64, {1}}, 2}); }),
              HasSubstr("data.inputs.ids: unread_ids.npy holds int64[2] per sample"));

  // tokens: neither feed read, so not the file either (token 9 is past the vocabulary of 8).
  std::vector<uint8_t> bytes;
  for (int v : {3, 0, 1, 0, 9, 0, 2, 0, 5, 0}) bytes.push_back(static_cast<uint8_t>(v));
  FeedSpec in{"input", {DType::kInt64, {1, 2}}, 8}, target{"target", {DType::kInt64, {1, 2}}, 8};
  in.read = target.read = false;
  DataLoader tokens(token_options(write_bytes("unread.u16", bytes)), {in}, target);
  EXPECT_EQ(tokens.train_samples(), 2);  // 5 ids -> (5 - 1) / 2
  const auto b = tokens.next(1)[0];
  EXPECT_EQ(values<int64_t>(b.at("input")), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(values<int64_t>(b.at("target")), (std::vector<int64_t>{0, 0}));
}

}  // namespace
}  // namespace pt
