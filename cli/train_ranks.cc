#include "cli/train_ranks.h"

#include <cstdlib>

#include "core/error.h"
#include "exec/ranks.h"
#ifdef PT_HAVE_MPI
#include "exec/mpi_comm.h"
#endif

namespace pt {

TrainRanks::TrainRanks() {
  if (!launched_as_rank()) return;
#ifdef PT_HAVE_MPI
  world_ = std::make_unique<MpiWorld>();
  rank_ = world_->rank();
  size_ = world_->size();
#else
  throw UserError("mpirun", "this build has no MPI, so its ranks would each train the whole model alone",
                  "install libopenmpi-dev and rebuild (scripts/setup.sh), or start one process");
#endif
}

TrainRanks::~TrainRanks() = default;

std::vector<int> TrainRanks::rank_of_devices(int devices) const { return pt::rank_of_devices(devices, size_); }

#ifdef PT_HAVE_MPI
void TrainRanks::sum(std::vector<double>& v) const { if (world_) world_->sum(v); }
void TrainRanks::max(std::vector<int64_t>& v) const { if (world_) world_->max(v); }
void TrainRanks::share(void* data, size_t bytes, bool mine) const { if (world_) world_->share(data, bytes, mine); }
void TrainRanks::check_same(uint64_t value, const std::string& what) const { if (world_) world_->check_same(value, what); }
void TrainRanks::abort(int code) const {
  if (world_) world_->abort(code);
  std::_Exit(code);
}
#else
void TrainRanks::sum(std::vector<double>&) const {}
void TrainRanks::max(std::vector<int64_t>&) const {}
void TrainRanks::share(void*, size_t, bool) const {}
void TrainRanks::check_same(uint64_t, const std::string&) const {}
void TrainRanks::abort(int code) const { std::_Exit(code); }
#endif

uint64_t fnv1a(const std::string& text, uint64_t h) {
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace pt
