// train/data.h: training data for `pipetrain train`. In: the config's data section (DataOptions) and
// the model's feeds, each typed per micro-batch; out: every step, the global batch as one feed map
// per micro-batch, and the held-out split in micro-batches.
//
// A data set is N samples; a sample is one row (axis 0) of every feed. Three kinds:
//   npy        every input has a .npy file and the targets one; each holds N samples along axis 0,
//              and per sample the exact dtype and shape of the feed (the feed's type minus axis 0).
//   tokens     one file of raw little-endian token ids; with T the token input's axis-1 length,
//              sample i is tokens [i*T, i*T+T) as input and [i*T+1, i*T+T+1) as target
//              (non-overlapping windows, N = (count - 1) / T). The width of a token id comes from
//              the file's extension: .u16 -> uint16; .u8 and .txt -> uint8 (one byte each); any
//              other (.bin, none) -> uint8 when the token input's limit is at most 256, else
//              uint16. A token >= the limit (the embedding's rows) is an error naming its offset.
//   synthetic  `samples` samples drawn from the seed: float feeds standard normal, integer feeds
//              uniform in [0, limit). Sample i depends only on (seed, feed, i).
//
// Split: the last round(eval_fraction * N) samples are held out, the rest is the train split.
// Order: the train samples are read as a stream of whole epochs; with shuffle each epoch is a
// permutation of the train split drawn from (seed, epoch) (splitmix64 + Fisher-Yates, identical on
// every platform), without shuffle it is the split in order. Step s reads stream positions
// [s*G, (s+1)*G), G = micro_batches * rows, so a batch may end one epoch and begin the next, and
// position() / seek() (samples consumed) are all a checkpoint needs to resume the exact stream.
//
// Every problem is a UserError located by DataOptions::where at its key (data.inputs.<name>,
// data.targets, data.file, data.kind, data.eval_fraction), saying what is wrong and the fix.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

// One tensor the loader feeds: a model input, or the loss target.
struct FeedSpec {
  std::string name;
  TensorType type;  // per micro-batch; axis 0 is the micro-batch's rows
  int64_t limit =
      0;  // integer feeds: values lie in [0, limit) (embedding rows, classes); 0: unknown
  // False where this process runs no chunk that takes the feed (a rank of a pipeline's middle):
  // its data is never read (npy: the file's header only, for its type and sample count; tokens:
  // the file's size, when no feed of it is read) and the feed stays zeros.
  bool read = true;
};

struct DataOptions {
  std::string kind = "synthetic";             // synthetic | npy | tokens
  std::map<std::string, std::string> inputs;  // npy: model input name -> .npy file
  std::string targets;                        // npy: .npy file
  std::string file;                           // tokens: file of token ids
  int64_t samples = 256;                      // synthetic: samples in the data set
  bool shuffle = true;
  double eval_fraction = 0;  // held out, in [0, 1)
  uint64_t seed = 0;
  // Where a dotted key sits, for errors: "train.yaml:7: data.inputs.x" (TrainConfig::where).
  // Empty: the key itself.
  std::function<std::string(const std::string& key)> where;
  // Where a relative path at a key starts, for a missing file's message (TrainConfig::path_rule).
  // Empty: "relative paths are from the working folder".
  std::function<std::string(const std::string& key)> path_rule;
};

using FeedMap = std::map<std::string, Tensor>;

class DataSource;  // where sample bytes come from (data.cc)

class DataLoader {
 public:
  // inputs: every model input; target: the loss target (int64 class ids for cross_entropy, float
  // for mse), fed under target.name ("target" when empty). All feeds share axis 0, the rows of a
  // micro-batch. Reads and checks the files (npy, tokens) here, once.
  DataLoader(const DataOptions& options, std::vector<FeedSpec> inputs, FeedSpec target);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t samples() const { return train_samples_ + eval_samples_; }
  int64_t train_samples() const { return train_samples_; }
  int64_t eval_samples() const { return eval_samples_; }
  int64_t rows() const { return rows_; }  // samples per micro-batch

  // The next global batch as `micro_batches` feed maps; map m holds stream positions
  // [position() + m*rows, position() + (m+1)*rows). Advances position() by micro_batches * rows.
  std::vector<FeedMap> next(int micro_batches);

  // The held-out split in micro-batches of rows(); a partial last one is dropped.
  int64_t eval_batches() const { return eval_samples_ / rows_; }
  FeedMap eval_batch(int64_t i) const;

  // Train samples consumed so far; seek(p) puts the loader where it was after consuming p.
  int64_t position() const { return position_; }
  void seek(int64_t position);

  // The train sample (index into the data set) at a stream position: which epoch's permutation,
  // and where in it. Exposed for tests and for logging the epoch.
  int64_t sample_at(int64_t position);
  int64_t epoch() const { return position_ / train_samples_; }

 private:
  FeedMap make_feeds() const;  // empty tensors of every feed's type
  void copy_sample(int64_t sample, FeedMap& feeds, int64_t row) const;
  const std::vector<int64_t>& epoch_order(int64_t epoch);

  DataOptions options_;
  std::vector<FeedSpec> feeds_;  // the inputs, then the target
  std::unique_ptr<DataSource> source_;
  int64_t rows_ = 0;
  int64_t train_samples_ = 0, eval_samples_ = 0;
  int64_t position_ = 0;
  int64_t order_epoch_ = -1;  // the epoch order_ holds
  std::vector<int64_t> order_;
};

// A permutation of [0, n) drawn from (seed, stream) by Fisher-Yates on splitmix64: the same on
// every platform and compiler.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream);

}  // namespace pt
