#include "train/train_ranks.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/error.h"
#include "train/ranks.h"
#ifdef PT_HAVE_MPI
#include "train/mpi_comm.h"
#endif

namespace pt {

TrainRanks::TrainRanks() {
  if (!launched_as_rank()) return;
#ifdef PT_HAVE_MPI
  world_ = std::make_unique<MpiWorld>();
  rank_ = world_->rank();
  size_ = world_->size();
  local_rank_ = world_->local_rank();
  host_ranks_ = world_->host_ranks();
#else
  throw UserError("mpirun", "this build has no MPI, so its ranks would each train the whole model alone",
                  "install libopenmpi-dev and rebuild (scripts/setup.sh), or start one process");
#endif
}

TrainRanks::~TrainRanks() = default;

std::vector<int> TrainRanks::rank_of_devices(int devices) const {
  const int per = size_ / replicas_;
  std::vector<int> ranks = pt::rank_of_devices(devices, per);
  for (int& r : ranks) r += replica() * per;
  return ranks;
}

void TrainRanks::split(int replicas, const std::string& where) {
  if (replicas == 1) return;
  if (size_ % replicas != 0)
    throw UserError(where, std::to_string(replicas) + " replicas do not split " + std::to_string(size_) + " process(es)",
                    size_ == 1 ? "start them with mpirun -n " + std::to_string(replicas) + " (or a multiple)"
                               : "start a multiple of " + std::to_string(replicas) + " processes");
  replicas_ = replicas;
#ifdef PT_HAVE_MPI
  world_->split(replicas);
#endif
}

#ifdef PT_HAVE_MPI
void TrainRanks::sum(std::vector<double>& v, Over over) const { if (world_) world_->sum(v, over); }
void TrainRanks::max(std::vector<int64_t>& v, Over over) const { if (world_) world_->max(v, over); }
void TrainRanks::share(void* data, size_t bytes, bool mine, Over over) const {
  if (world_) world_->share(data, bytes, mine, over);
}
void TrainRanks::sum_in_replica_order(float* values, size_t count) const {
  if (world_) world_->sum_in_replica_order(values, count);
}
void TrainRanks::sum_shard_in_replica_order(float* values, const std::vector<size_t>& counts) const {
  if (world_) world_->sum_shard_in_replica_order(values, counts);
}
void TrainRanks::gather_shards(std::byte* data, const std::vector<size_t>& bytes) const {
  if (world_) world_->gather_shards(data, bytes);
}
int TrainRanks::make_group(bool member) const { return world_ ? world_->make_group(member) : member ? 0 : -1; }
void TrainRanks::share_in_group(int group, void* data, size_t bytes, bool mine) const {
  if (world_) world_->share_in_group(group, data, bytes, mine);
}
void TrainRanks::check_same(uint64_t value, const std::string& what) const { if (world_) world_->check_same(value, what); }
void TrainRanks::abort(int code) const {
  if (world_) world_->abort(code);
  std::_Exit(code);
}
bool TrainRanks::report_failure() const { return world_ ? world_->report_failure() : true; }
#else
void TrainRanks::sum(std::vector<double>&, Over) const {}
void TrainRanks::max(std::vector<int64_t>&, Over) const {}
void TrainRanks::share(void*, size_t, bool, Over) const {}
void TrainRanks::sum_in_replica_order(float*, size_t) const {}
void TrainRanks::sum_shard_in_replica_order(float*, const std::vector<size_t>&) const {}
void TrainRanks::gather_shards(std::byte*, const std::vector<size_t>&) const {}
int TrainRanks::make_group(bool member) const { return member ? 0 : -1; }
void TrainRanks::share_in_group(int, void*, size_t, bool) const {}
void TrainRanks::check_same(uint64_t, const std::string&) const {}
void TrainRanks::abort(int code) const { std::_Exit(code); }
bool TrainRanks::report_failure() const { return true; }
#endif

void TrainRanks::end_failed(int code, bool wrote_line) const {
  if (!wrote_line) std::this_thread::sleep_for(std::chrono::seconds(10));
  abort(code);
}

uint64_t fnv1a(const std::string& text, uint64_t h) {
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace pt
