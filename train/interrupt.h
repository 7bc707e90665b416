// train/interrupt.h: Ctrl-C (SIGINT) and SIGTERM during a training run's step loop. In: the
// signals; out: a flag the loop reads at each step boundary (the Trainer's StopCheck,
// train/trainer.h), so that a run stops between steps (never inside a checkpoint or an output
// being written) and can keep its last finished step.
// A second signal while the first is pending exits at once, writing one line. The exit code is
// the shells' for a signal: 128 + its number (130 for SIGINT, 143 for SIGTERM).
//
// Across processes (watch_ranks): when a rank dies, mpirun ends the others with SIGTERM (and
// SIGKILL a second later). A rank that receives a signal while a rank of its host has no process
// any more knows it was lost: the lowest surviving rank of the host writes one line naming the
// lost ranks and the last step every rank completed, and each exits at once with 1 (waiting for
// the step boundary would hang in a collective the lost rank never joins). Under mpirun a
// SIGTERM with no rank of this host lost (one on another host, or the job interrupted) ends the
// rank the same way: rank 0 writes one line saying the job was interrupted, after which step and
// how to go on (mpirun's own line names a lost rank, if one was lost); each rank exits with 143.
// Where a rank failed (note_job_failed: this one, or another that said so, train/mpi_comm.h),
// mpirun's SIGTERM is that failure's end: the rank exits with 2 and writes nothing, the failing
// rank's own line being the job's one.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pt {

// Installs the handlers for its lifetime; the previous ones come back when it ends.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  // True once SIGINT or SIGTERM arrived since construction.
  bool interrupted() const;
  // The first of them to arrive (SIGINT or SIGTERM), 0 before one does.
  int signal() const;

  // This process is rank `rank` of `size`; host_ranks: (rank, pid) of every rank on this host.
  void watch_ranks(int rank, int size, const std::vector<std::pair<int, int>>& host_ranks);
  // Every rank has completed `steps` steps (for the lost-rank line; before the first call the
  // line says the job was still in set-up).
  void completed(int64_t steps);
  // How to go on after the job was interrupted under mpirun (the end of its line), e.g.
  // "continue from the last checkpoint in DIR with --resume".
  void resume_hint(const std::string& text);
};

// Across processes: a rank of the job failed (this one, or another that said so). From then on
// mpirun's SIGTERM ends this rank silently with exit code 2.
void note_job_failed();
bool job_failed();

// The exit code of a run stopped by `signal`, as shells report it.
constexpr int interrupted_exit_code(int signal) { return 128 + signal; }

}  // namespace pt
