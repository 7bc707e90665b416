#include "train/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include <unistd.h>

#include "core/error.h"
#include "train/interrupt.h"

namespace pt {

struct MpiComm::Pending {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<std::byte> data;
};

struct MpiComm::Channel {
  MPI_Comm comm = MPI_COMM_WORLD;
  explicit Channel(bool own) {
    if (own) MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  }
  ~Channel() {
    if (comm != MPI_COMM_WORLD) MPI_Comm_free(&comm);
  }
};

// Before split() (one replica): the replica is every rank, a position holds this rank alone.
struct MpiWorld::Groups {
  MPI_Comm replica = MPI_COMM_WORLD, position = MPI_COMM_SELF;
  int replicas = 1;
  std::vector<MPI_Comm> made;  // make_group's, on this rank's groups (MPI_COMM_NULL elsewhere)
  ~Groups() {
    for (MPI_Comm& c : made)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    if (replicas == 1) return;  // the predefined communicators are not ours to free
    MPI_Comm_free(&replica);
    MPI_Comm_free(&position);
  }
  MPI_Comm of(Over over) const {
    return over == Over::kWorld ? MPI_COMM_WORLD : over == Over::kReplica ? replica : position;
  }
};

// Other ranks' failures, heard on a communicator of their own by a thread that polls for them
// (a blocking receive would spin a core for the whole run). A report is {rank, first}: first
// when that rank had heard of no failure before its own.
struct MpiWorld::FailureWatch {
  static constexpr int kTag = 1;
  MPI_Comm comm = MPI_COMM_NULL;
  std::atomic<bool> heard{false}, stop{false};
  std::atomic<int> lowest_first{std::numeric_limits<int>::max()};
  std::thread thread;
  int mine[2] = {0, 0};  // this rank's report, alive until the process ends
  std::vector<MPI_Request> sent;

  explicit FailureWatch(MPI_Comm world) {
    MPI_Comm_dup(world, &comm);
    thread = std::thread([this] { listen(); });
  }
  ~FailureWatch() {
    stop = true;
    thread.join();
    MPI_Comm_free(&comm);
  }
  void note(int rank, bool first) {
    heard = true;
    note_job_failed();
    int low = lowest_first.load();
    while (first && rank < low && !lowest_first.compare_exchange_weak(low, rank)) {
    }
  }
  void listen() {
    int report[2] = {0, 0};
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Irecv(report, 2, MPI_INT, MPI_ANY_SOURCE, kTag, comm, &request);
    while (!stop) {
      int done = 0;
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (!done) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      note(report[0], report[1] != 0);
      MPI_Irecv(report, 2, MPI_INT, MPI_ANY_SOURCE, kTag, comm, &request);
    }
    MPI_Cancel(&request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
};

MpiWorld::MpiWorld() {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw UserError("MPI", "the MPI library runs without MPI_THREAD_MULTIPLE",
                    "use an MPI built with thread support (Debian's OpenMPI 4.1 has it)");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host);
  MPI_Comm_rank(host, &local_rank_);
  int host_size = 1;
  MPI_Comm_size(host, &host_size);
  const int mine[2] = {rank_, static_cast<int>(::getpid())};
  std::vector<int> all(2 * static_cast<size_t>(host_size));
  MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, host);
  for (size_t i = 0; i < all.size(); i += 2) host_ranks_.emplace_back(all[i], all[i + 1]);
  MPI_Comm_free(&host);
  groups_ = std::make_unique<Groups>();
  watch_ = std::make_unique<FailureWatch>(MPI_COMM_WORLD);
}

MpiWorld::~MpiWorld() {
  watch_.reset();
  groups_.reset();
  MPI_Finalize();
}

bool MpiWorld::report_failure() {
  const bool first = !watch_->heard.load();
  watch_->note(rank_, first);  // marks the job failed here too (note_job_failed)
  watch_->mine[0] = rank_;
  watch_->mine[1] = first ? 1 : 0;
  watch_->sent.assign(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r)
    if (r != rank_)
      MPI_Isend(watch_->mine, 2, MPI_INT, r, FailureWatch::kTag, watch_->comm, &watch_->sent[static_cast<size_t>(r)]);
  // Ranks failing on one cause (a config every rank reads) fail within milliseconds of each
  // other; their reports cross in this time. The sends complete as the watch thread polls.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return first && watch_->lowest_first.load() == rank_;
}

void MpiWorld::split(int replicas) {
  PT_CHECK(replicas >= 1 && size_ % replicas == 0, "replicas must divide the ranks");
  PT_CHECK(groups_->made.empty(), "split after make_group");
  if (replicas == 1) return;
  auto g = std::make_unique<Groups>();
  g->replicas = replicas;
  const int per = size_ / replicas;
  MPI_Comm_split(MPI_COMM_WORLD, rank_ / per, rank_ % per, &g->replica);
  MPI_Comm_split(MPI_COMM_WORLD, rank_ % per, rank_ / per, &g->position);
  groups_ = std::move(g);
}

namespace {

// Counts and offsets as MPI takes them (ints), checked.
std::vector<int> as_ints(const std::vector<size_t>& v, const char* what) {
  std::vector<int> out;
  for (size_t x : v) {
    PT_CHECK(x <= static_cast<size_t>(std::numeric_limits<int>::max()), std::string(what) + " over 2^31");
    out.push_back(static_cast<int>(x));
  }
  return out;
}

std::vector<int> offsets_of(const std::vector<int>& counts) {
  std::vector<int> out(counts.size(), 0);
  for (size_t k = 1; k < counts.size(); ++k) out[k] = out[k - 1] + counts[k - 1];
  return out;
}

// out[i] = ((all[0][i] + all[1][i]) + all[2][i]) ...: `replicas` slices of `count` floats added
// in replica order, the same bits on every rank whatever MPI did to bring them.
void add_in_replica_order(const float* all, size_t count, int replicas, float* out) {
  for (size_t i = 0; i < count; ++i) {
    float s = all[i];
    for (int r = 1; r < replicas; ++r) s += all[static_cast<size_t>(r) * count + i];
    out[i] = s;
  }
}

// The owner's bytes to every rank of `group`: the others' zeros ORed with them, exactly.
void share_over(MPI_Comm group, void* data, size_t bytes, bool mine) {
  if (!mine && bytes) std::memset(data, 0, bytes);
  constexpr size_t kPiece = size_t{1} << 30;  // MPI counts are ints
  for (size_t at = 0; at < bytes; at += kPiece)
    MPI_Allreduce(MPI_IN_PLACE, static_cast<std::byte*>(data) + at, static_cast<int>(std::min(kPiece, bytes - at)),
                  MPI_BYTE, MPI_BOR, group);
}

}  // namespace

void MpiWorld::sum_in_replica_order(float* values, size_t count) const {
  const int replicas = groups_->replicas;
  if (replicas == 1 || count == 0) return;
  PT_CHECK(count <= static_cast<size_t>(std::numeric_limits<int>::max()), "a gradient over 2^31 values");
  std::vector<float> all(count * static_cast<size_t>(replicas));
  MPI_Allgather(values, static_cast<int>(count), MPI_FLOAT, all.data(), static_cast<int>(count), MPI_FLOAT,
                groups_->of(Over::kPosition));
  add_in_replica_order(all.data(), count, replicas, values);
}


void MpiWorld::sum_shard_in_replica_order(float* values, const std::vector<size_t>& counts) const {
  const int replicas = groups_->replicas;
  PT_CHECK(static_cast<int>(counts.size()) == replicas, "one segment per replica");
  if (replicas == 1) return;
  const int me = rank_ / (size_ / replicas);
  const std::vector<int> send = as_ints(counts, "a gradient shard"), send_at = offsets_of(send);
  const int mine = send[static_cast<size_t>(me)];
  const std::vector<int> recv(static_cast<size_t>(replicas), mine), recv_at = offsets_of(recv);
  std::vector<float> all(static_cast<size_t>(mine) * static_cast<size_t>(replicas));
  MPI_Alltoallv(values, send.data(), send_at.data(), MPI_FLOAT, all.data(), recv.data(), recv_at.data(), MPI_FLOAT,
                groups_->of(Over::kPosition));
  add_in_replica_order(all.data(), static_cast<size_t>(mine), replicas, values + send_at[static_cast<size_t>(me)]);
}

void MpiWorld::gather_shards(std::byte* data, const std::vector<size_t>& bytes) const {
  const int replicas = groups_->replicas;
  PT_CHECK(static_cast<int>(bytes.size()) == replicas, "one segment per replica");
  if (replicas == 1) return;
  const std::vector<int> counts = as_ints(bytes, "a parameter shard"), at = offsets_of(counts);
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), at.data(), MPI_BYTE,
                 groups_->of(Over::kPosition));
}

void MpiWorld::check_same(uint64_t value, const std::string& what) const {
  std::vector<unsigned long long> all(static_cast<size_t>(size_));
  unsigned long long mine = value;
  MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
  std::string differ;
  for (int r = 1; r < size_; ++r)
    if (all[static_cast<size_t>(r)] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    throw UserError("ranks " + differ, what + " differs from rank 0's",
                    "start every rank with the same model, config and overrides");
}

void MpiWorld::sum(std::vector<double>& values, Over over) const {
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM, groups_->of(over));
}

void MpiWorld::max(std::vector<int64_t>& values, Over over) const {
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_INT64_T, MPI_MAX, groups_->of(over));
}

void MpiWorld::share(void* data, size_t bytes, bool mine, Over over) const {
  share_over(groups_->of(over), data, bytes, mine);
}

int MpiWorld::make_group(bool member) {
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(groups_->replica, member ? 0 : MPI_UNDEFINED, rank_, &c);
  groups_->made.push_back(c);
  return member ? static_cast<int>(groups_->made.size()) - 1 : -1;
}

void MpiWorld::share_in_group(int group, void* data, size_t bytes, bool mine) const {
  PT_CHECK(group >= 0 && static_cast<size_t>(group) < groups_->made.size() &&
               groups_->made[static_cast<size_t>(group)] != MPI_COMM_NULL,
           "not a member of group " + std::to_string(group));
  share_over(groups_->made[static_cast<size_t>(group)], data, bytes, mine);
}

void MpiWorld::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

MpiComm::MpiComm(std::vector<int> rank_of_device, int rank, std::unique_ptr<Comm> local,
                 std::vector<Backend*> staged, bool own_communicator)
    : rank_of_(std::move(rank_of_device)),
      rank_(rank),
      channel_(std::make_unique<Channel>(own_communicator)),
      local_(local ? std::move(local) : std::make_unique<InProcessComm>()),
      staged_(std::move(staged)),
      landing_(rank_of_.size()) {
  PT_CHECK(staged_.empty() || staged_.size() == rank_of_.size(), "one staging backend per device");
}

// After an abort a peer may never take our sends (the job is ending: the caller aborts MPI);
// waiting for them would hang, so their buffers are left to the process's end.
MpiComm::~MpiComm() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) {
    new std::list<Pending>(std::move(pending_));  // kept for MPI until the process ends
    return;
  }
  collect(true);
}

bool MpiComm::here(int device) const {
  PT_CHECK(device >= 0 && device < static_cast<int>(rank_of_.size()), "device " + std::to_string(device) + " has no rank");
  return rank_of_[static_cast<size_t>(device)] == rank_;
}

Backend* MpiComm::staged(int device) const {
  return staged_.empty() ? nullptr : staged_[static_cast<size_t>(device)];
}

void MpiComm::plan(const std::vector<std::string>& message_names, int micro_batches) {
  local_->plan(message_names, micro_batches);
  std::vector<std::string> names = message_names;
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  index_.clear();
  for (size_t i = 0; i < names.size(); ++i) index_.emplace(names[i], static_cast<int>(i));
  micro_batches_ = std::max(1, micro_batches);
  int* upper = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper, &found);
  const int64_t tags = static_cast<int64_t>(names.size()) * micro_batches_;
  if (found && tags > *upper)
    throw UserError("pipeline", "needs " + std::to_string(tags) + " message tags, MPI offers " + std::to_string(*upper),
                    "use fewer micro-batches or fewer stages");
}

int MpiComm::tag_of(std::string_view name, int micro_batch) const {
  auto it = index_.find(name);
  PT_CHECK(it != index_.end(), "message '" + std::string(name) + "' is not in the plan");
  PT_CHECK(micro_batch >= 0 && micro_batch < micro_batches_, "micro-batch out of the plan");
  return it->second * micro_batches_ + micro_batch;
}

void MpiComm::collect(bool wait) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    int done = 0;
    if (wait) {
      MPI_Wait(&it->request, MPI_STATUS_IGNORE);
      done = 1;
    } else {
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    }
    it = done ? pending_.erase(it) : std::next(it);
  }
}

void MpiComm::send(std::string_view name, int micro_batch, int from, int to, const void* data, size_t bytes) {
  if (here(to)) return local_->send(name, micro_batch, from, to, data, bytes);
  const int tag = tag_of(name, micro_batch);
  PT_CHECK(bytes <= static_cast<size_t>(std::numeric_limits<int>::max()), "a message over 2 GiB");
  // The bytes are copied out before the lock: a device's copy may wait for its kernels.
  std::list<Pending> one(1);
  Pending& p = one.front();
  p.data.resize(bytes);
  if (Backend* b = staged(from)) b->copy(p.data.data(), data, bytes);
  else if (bytes) std::memcpy(p.data.data(), data, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  collect(false);
  pending_.splice(pending_.end(), one);
  MPI_Isend(p.data.data(), static_cast<int>(bytes), MPI_BYTE, rank_of_[static_cast<size_t>(to)], tag,
            channel_->comm, &p.request);
}

void MpiComm::recv(std::string_view name, int micro_batch, int from, int to, void* data, size_t bytes) {
  if (here(from)) return local_->recv(name, micro_batch, from, to, data, bytes);
  const int tag = tag_of(name, micro_batch);
  Backend* device = staged(to);
  std::vector<std::byte>& landing = landing_[static_cast<size_t>(to)];
  if (device && landing.size() < bytes) landing.resize(bytes);
  void* into = device ? static_cast<void*>(landing.data()) : data;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Irecv(into, static_cast<int>(bytes), MPI_BYTE, rank_of_[static_cast<size_t>(from)], tag, channel_->comm,
            &request);
  MPI_Status status;
  for (int spins = 0;; ++spins) {
    int done = 0;
    MPI_Test(&request, &done, &status);
    if (done) break;
    if (aborted_.load(std::memory_order_relaxed)) {
      MPI_Cancel(&request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
      throw CommAborted();
    }
    // Spin briefly (a message usually follows soon), then sleep in short naps.
    if (spins < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  PT_CHECK(static_cast<size_t>(count) == bytes, "message '" + std::string(name) + "' has " + std::to_string(count) +
                                                    " bytes, expected " + std::to_string(bytes));
  if (device) device->copy(data, into, bytes);
}

void MpiComm::abort() {
  aborted_ = true;
  local_->abort();
}

void MpiComm::reset() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    collect(true);
  }
  aborted_ = false;
  local_->reset();
}

}  // namespace pt
