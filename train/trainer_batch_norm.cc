// The Trainer's BatchNorm running statistics (train/trainer.h) across devices, processes and
// replicas: where each BatchNorm's buffers live, and their update after each step.
//
// A BatchNorm's running mean and variance live with the device whose chunk computes its batch
// statistics (the executor's side outputs of that chunk's F), on that device's rank, as a
// parameter lives with its first reader (first_device_, owner_of): that rank updates them,
// writes them into its checkpoint part and resumes them, reads them in its own chunk of the
// evaluation (train/evaluator.h), and sends them to rank 0's writer for the outputs
// (Trainer::write_trained). No other rank reads or updates them, so across processes they are
// the bits of one process.
//
// Data parallelism (parallel.data: D replicas of M micro-batches each): every replica updates
// its buffers with the batch statistics of every micro-batch of the global batch, in global
// order (replica k's micro-batch m is k * M + m), the statistics gathered over the replicas
// exactly. Every replica then holds the same buffers, and they are what one process training
// the same global batch (D x M micro-batches) computes from the same parameters; num_batches_
// tracked counts D x M forwards a step (batch_norm_updates_per_step). This is pipetrain's own
// contract, the one the gradients keep: D changes what the running statistics average over no
// more than it changes the gradients. PyTorch's DDP does otherwise: each replica updates its own
// buffers from its own micro-batches, rank 0's are broadcast to the others before each forward
// (broadcast_buffers=True) and rank 0 saves the model, so the running statistics it saves have
// seen rank 0's 1/D of every global batch (M updates a step, not D x M). Both are estimates of
// the same statistics; the one kept here does not depend on how the batch was split.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "train/trainer.h"

namespace pt {

// The buffers' devices, the BatchNorms of this rank's devices, and (replicas) the tensors every
// replica's statistics land in: sized once, before the first step.
void Trainer::place_batch_norms(const std::vector<int>& placement) {
  for (size_t i = 0; i < form_.batch_norms.size(); ++i) {
    const BatchNormStats& bn = form_.batch_norms[i];
    // The first chunk whose F outputs its batch statistics: the one the executor copies them from.
    size_t c = 0;
    const auto makes = [&](const Graph& f) {
      const ValueId v = f.find(bn.batch_mean);
      return v != kNoValue && std::count(f.outputs.begin(), f.outputs.end(), v) > 0;
    };
    while (c < chunks_.size() && !makes(chunks_[c].forward)) ++c;
    PT_CHECK(c < chunks_.size(), "no chunk's forward outputs '" + bn.batch_mean + "'");
    first_device_[bn.running_mean] = first_device_[bn.running_var] = placement[c];
    if (here(static_cast<size_t>(placement[c]))) local_batch_norms_.push_back(i);
  }
  if (ranks_.replicas() == 1 || local_batch_norms_.empty()) return;
  const int M = schedule_.micro_batches, D = ranks_.replicas();
  replica_side_.assign(static_cast<size_t>(D * M), executor_->side_outputs(0));
  size_t bytes = 0;
  for (size_t i : local_batch_norms_)
    for (size_t j : {2 * i, 2 * i + 1}) bytes += replica_side_[0][j].data.size();
  replica_side_bytes_.assign(bytes * static_cast<size_t>(D * M), std::byte{0});
}

// After the pipelined step: the BatchNorms of this rank's devices take the batch statistics of
// every micro-batch of the global batch, in order, as torch updates its buffers forward by forward.
void Trainer::update_batch_norm_statistics() {
  if (local_batch_norms_.empty()) return;
  gather_batch_statistics();
  for (int g = 0; g < batch_norm_updates_per_step(); ++g) {
    const std::vector<Tensor>& side = batch_statistics(g);
    for (size_t i : local_batch_norms_) {
      const BatchNormStats& bn = form_.batch_norms[i];
      update_running_statistics(mutable_initializer(bn.running_mean), mutable_initializer(bn.running_var),
                                side[2 * i], side[2 * i + 1], bn.momentum);
    }
  }
}

// Replicas: this replica's statistics into its run of the bytes, the runs gathered over the
// replicas (an all-gather among the ranks at this position, which hold the same BatchNorms),
// then every replica's into replica_side_. Copies only: the bits each replica computed.
void Trainer::gather_batch_statistics() {
  if (replica_side_.empty()) return;
  const size_t M = static_cast<size_t>(schedule_.micro_batches), D = static_cast<size_t>(ranks_.replicas());
  const size_t run = replica_side_bytes_.size() / D;
  // f(side output j, its bytes of global micro-batch g), over this rank's BatchNorms.
  const auto each_side = [&](size_t g, const auto& f) {
    std::byte* at = replica_side_bytes_.data() + g * (run / M);
    for (size_t i : local_batch_norms_)
      for (size_t j : {2 * i, 2 * i + 1}) at += f(j, at);
  };
  const size_t first = static_cast<size_t>(ranks_.replica()) * M;
  for (size_t m = 0; m < M; ++m) {
    const std::vector<Tensor>& mine = executor_->side_outputs(static_cast<int>(m));
    each_side(first + m, [&](size_t j, std::byte* at) {
      std::memcpy(at, mine[j].data.data(), mine[j].data.size());
      return mine[j].data.size();
    });
  }
  ranks_.gather_shards(replica_side_bytes_.data(), std::vector<size_t>(D, run));
  for (size_t g = 0; g < D * M; ++g)
    each_side(g, [&](size_t j, const std::byte* at) {
      std::vector<std::byte>& t = replica_side_[g][j].data;
      std::memcpy(t.data(), at, t.size());
      return t.size();
    });
}

// Global micro-batch g's batch statistics: the executor's own without replicas.
const std::vector<Tensor>& Trainer::batch_statistics(int g) const {
  return replica_side_.empty() ? executor_->side_outputs(g) : replica_side_[static_cast<size_t>(g)];
}

}  // namespace pt
