// train/mpi_comm.h: the pipeline's devices in several processes (one MPI rank each, started by
// mpirun or srun), and the Comm between them. In: the device -> rank map, the same in every
// process. Out: Comm's contract (train/comm.h) across processes.
//
// A message between two devices of one process goes through an in-process mailbox; one between
// processes is an MPI point-to-point message whose tag is its number in the executor's plan
// (Comm::plan: the message names sorted, tag = name index x micro-batches + micro-batch), so
// both sides match it without a name on the wire and two messages never share a tag.
//
// send() copies the bytes into a buffer of its own and starts MPI_Isend; the buffer is kept until
// the send completes (finished sends are collected at the next send, all of them at reset() and
// in the destructor). recv() posts MPI_Irecv and polls it, so that abort() (another device of
// this process failed) ends it with CommAborted instead of leaving the thread blocked. A rank
// that dies ends the job: mpirun stops every rank (MPI_COMM_WORLD's error handler is fatal).
// A device whose tensors are not host memory (a GPU) names its backend in `staged`: a message
// to or from another process passes through a host buffer, copied by that backend
// (Backend::copy, which follows the kernels before it on the device's stream). Messages between
// the devices of this process go through `local` (the GPUs' own Comm) when one is given.
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "exec/backend.h"
#include "train/comm.h"
#include "train/ranks.h"

namespace pt {

// MPI for the life of the object: MPI_Init_thread with MPI_THREAD_MULTIPLE (every device thread
// sends and receives), MPI_Finalize at the end. A UserError when the MPI library gives less.
//
// Data parallelism splits the ranks into replicas of the pipeline (split(), train/ranks.h).

class MpiWorld {
 public:
  MpiWorld();
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the ranks sharing this host's memory
  // (rank, process id) of every rank on this host, this one included.
  const std::vector<std::pair<int, int>>& host_ranks() const { return host_ranks_; }
  // Makes the replica and position groups; size() must be a multiple of replicas.
  void split(int replicas);
  // The same 64-bit value on every rank, else a UserError naming the ranks that differ from
  // rank 0 (`what` says what the value is, e.g. "the plan").
  void check_same(uint64_t value, const std::string& what) const;
  // Exact collectives over every rank, for values one rank holds and the others hold as zeros:
  // sums (x + 0 is x), maxima, and the owner's bytes to everyone (a bitwise OR with zeros).
  void sum(std::vector<double>& values, Over over = Over::kWorld) const;
  void max(std::vector<int64_t>& values, Over over = Over::kWorld) const;
  void share(void* data, size_t bytes, bool mine, Over over = Over::kWorld) const;
  // A group of ranks of this rank's replica (the ranks that hold a tied parameter, train/ties.h):
  // made by every rank of the replica, in the same order, each saying whether it is a member.
  // Returns the group's number on its members, -1 elsewhere. After split().
  int make_group(bool member);
  // share over a group of make_group's (its members only).
  void share_in_group(int group, void* data, size_t bytes, bool mine) const;
  // values (float32, `count`) becomes the sum over the ranks at this position of every replica,
  // added in replica order (r0 + r1) + r2 ... on every rank: the same bits everywhere and from
  // run to run, whatever MPI's reduction algorithms do.
  void sum_in_replica_order(float* values, size_t count) const;
  // ZeRO-1's reduce-scatter: `values` is one segment per replica (counts[k] floats for replica
  // k's shard, in replica order). Each replica gets from every other only its own segment and
  // sums it in replica order (the bits sum_in_replica_order gives); the other segments are left
  // as they were.
  void sum_shard_in_replica_order(float* values, const std::vector<size_t>& counts) const;
  // ZeRO-1's all-gather: `data` is one segment per replica (bytes[k] for replica k's shard);
  // every replica's segment is replaced by that replica's bytes.
  void gather_shards(std::byte* data, const std::vector<size_t>& bytes) const;
  // Ends every rank of the job with `code` (a rank that failed alone must not leave the others
  // waiting for its messages).
  [[noreturn]] void abort(int code) const;

  // A failure on this rank, its line not yet written: tells every other rank (which then end
  // silently when mpirun stops them, train/interrupt.h), waits a moment for the reports of
  // ranks that failed at the same time (a config error fails every rank), and says whether
  // this rank writes the job's one line: the lowest of the ranks that failed before hearing
  // of another's failure.
  bool report_failure();

 private:
  struct Groups;  // the communicator of each scope (Over)
  struct FailureWatch;  // a thread that hears other ranks' failures
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::vector<std::pair<int, int>> host_ranks_;
  std::unique_ptr<Groups> groups_;
  std::unique_ptr<FailureWatch> watch_;
};

class MpiComm : public Comm {
 public:
  // rank_of_device[d]: the rank running pipeline device d. local: the Comm between this rank's
  // own devices (an InProcessComm when null). staged[d] (empty: none): device d's backend when
  // its tensors live outside host memory. own_communicator: its messages travel on a copy of
  // MPI_COMM_WORLD of their own (made here, so every rank makes such a Comm at the same point),
  // where no other MpiComm's tags can meet them (train/trainer.h: evaluation and the outputs
  // beside the training step's Comm).
  MpiComm(std::vector<int> rank_of_device, int rank, std::unique_ptr<Comm> local = nullptr,
          std::vector<Backend*> staged = {}, bool own_communicator = false);
  ~MpiComm() override;
  void send(std::string_view name, int micro_batch, int from, int to, const void* data,
            size_t bytes) override;
  void recv(std::string_view name, int micro_batch, int from, int to, void* data,
            size_t bytes) override;
  void abort() override;
  void reset() override;
  void plan(const std::vector<std::string>& message_names, int micro_batches) override;
  void plan_order(const std::vector<PlannedMessage>& sends) override { local_->plan_order(sends); }

 private:
  struct Pending;
  struct Channel;  // the communicator its messages travel on
  int tag_of(std::string_view name, int micro_batch) const;
  bool here(int device) const;
  Backend* staged(int device) const;
  void collect(bool wait);  // frees finished sends (all of them when wait); caller holds mu_

  std::vector<int> rank_of_;
  int rank_;
  std::unique_ptr<Channel> channel_;
  std::unique_ptr<Comm> local_;
  std::vector<Backend*> staged_;
  std::vector<std::vector<std::byte>> landing_;  // [device]: staged receives, its thread only
  std::map<std::string, int, std::less<>> index_;  // message name -> its number in the plan
  int micro_batches_ = 1;
  std::mutex mu_;
  std::list<Pending> pending_;
  std::atomic<bool> aborted_{false};
};

}  // namespace pt
