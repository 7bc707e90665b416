// train/train_ranks.h: the processes one `pipetrain train` runs in. Alone by default (no MPI at
// run time); as one of several ranks when mpirun or srun started it (launched_as_rank, exec/
// ranks.h), in a build with MPI (train/mpi_comm.h). Rank r runs the pipeline devices
// rank_of_devices gives it; every rank reads the same config, data and model and makes the same
// plan.
//
// The collectives here are exact, so a run on N ranks gives the bits of the run in one process:
// each value is held by one rank and read as zero by the others (sum: x + 0 is x; share: the
// owner's bytes OR zeros). Alone they do nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/ranks.h"

namespace pt {

class MpiWorld;

class TrainRanks {
 public:
  // MPI when launched as one of several ranks, else alone. UserError when launched so but the
  // build has no MPI.
  TrainRanks();
  ~TrainRanks();
  TrainRanks(const TrainRanks&) = delete;
  TrainRanks& operator=(const TrainRanks&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the ranks on this host
  // (rank, process id) of every rank on this host; empty alone.
  const std::vector<std::pair<int, int>>& host_ranks() const { return host_ranks_; }
  bool alone() const { return size_ == 1; }
  // Data parallelism: `replicas` replicas of the pipeline over the ranks (train/ranks.h); a
  // UserError at `where` when they do not divide the ranks.
  void split(int replicas, const std::string& where);
  int replicas() const { return replicas_; }
  int replica() const { return rank_ / (size_ / replicas_); }
  // Which (world) rank runs each of `devices` pipeline devices of this rank's replica.
  std::vector<int> rank_of_devices(int devices) const;

  void sum(std::vector<double>& values, Over over = Over::kWorld) const;
  void max(std::vector<int64_t>& values, Over over = Over::kWorld) const;
  void share(void* data, size_t bytes, bool mine, Over over = Over::kWorld) const;
  void sum_in_replica_order(float* values, size_t count) const;
  void sum_shard_in_replica_order(float* values, const std::vector<size_t>& counts) const;
  void gather_shards(std::byte* data, const std::vector<size_t>& bytes) const;
  // Groups of ranks within the replica (the holders of a tied parameter, train/ties.h): every rank
  // of the replica makes each, in the same order; the number on its members, -1 elsewhere.
  int make_group(bool member) const;
  void share_in_group(int group, void* data, size_t bytes, bool mine) const;
  void check_same(uint64_t value, const std::string& what) const;
  [[noreturn]] void abort(int code) const;
  // This rank failed (MpiWorld::report_failure): whether it writes the job's one line (alone:
  // always). Then end_failed ends the job: at once where this rank wrote the line; else it waits
  // for the rank that writes it to end the job, and ends it itself if that has not come in 10 s.
  bool report_failure() const;
  [[noreturn]] void end_failed(int code, bool wrote_line) const;

 private:
  std::unique_ptr<MpiWorld> world_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, replicas_ = 1;
  std::vector<std::pair<int, int>> host_ranks_;
};

// FNV-1a, 64 bits: the same on every rank for the same text (std::hash promises no such thing).
uint64_t fnv1a(const std::string& text, uint64_t h = 1469598103934665603ull);

}  // namespace pt
