#include "train/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace pt {
namespace {

volatile sig_atomic_t g_interrupted = 0;  // the first signal's number
struct sigaction g_old_int, g_old_term;

// The lost-rank watch: filled before the handlers can read it, read-only in them.
constexpr int kMaxHostRanks = 256;
struct HostRank {
  int rank = 0, pid = 0;
};
HostRank g_host[kMaxHostRanks];
volatile sig_atomic_t g_host_count = 0;
int g_rank = 0, g_size = 1;
bool g_under_mpirun = false;  // Open MPI's launcher started this process
std::atomic<int64_t> g_completed{-1};  // -1: still in set-up
static_assert(std::atomic<int64_t>::is_always_lock_free, "read in a signal handler");
std::atomic<bool> g_job_failed{false};
static_assert(std::atomic<bool>::is_always_lock_free, "read in a signal handler");
char g_resume_hint[512] = "";
volatile sig_atomic_t g_resume_hint_ready = 0;  // 0 while it is written: the handler says the general way

// Async-signal-safe text: a fixed buffer, integers written by hand.
struct Line {
  char text[1024];
  int n = 0;
  void add(const char* s) {
    while (*s && n < static_cast<int>(sizeof text) - 1) text[n++] = *s++;
  }
  void add(int64_t v) {
    char digits[24];
    int k = 0;
    const bool negative = v < 0;
    uint64_t u = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
    do digits[k++] = static_cast<char>('0' + u % 10);
    while ((u /= 10) && k < 20);
    if (negative) add("-");
    while (k && n < static_cast<int>(sizeof text) - 1) text[n++] = digits[--k];
  }
};

// When ranks of this host have no process any more: the line (from the lowest survivor) and
// the exit. Under mpirun a SIGTERM alone ends the job too: mpirun sends it to the ranks it stops
// (the job was interrupted, a rank on another host was lost, or a rank failed) and kills them a
// second later, too soon for a step boundary. After a failure the failing rank has written the
// line; else rank 0 writes that the job was interrupted, naming the step, and leaves a lost
// rank to mpirun's own message. Otherwise returns and the signal is an ordinary interrupt.
void end_if_a_rank_was_lost(int signal) {
  bool lost[kMaxHostRanks] = {};
  int lost_count = 0, reporter = -1;
  for (int i = 0; i < g_host_count; ++i) {
    lost[i] = g_host[i].rank != g_rank && ::kill(g_host[i].pid, 0) == -1 && errno == ESRCH;
    if (lost[i]) ++lost_count;
    else if (reporter < 0 || g_host[i].rank < reporter) reporter = g_host[i].rank;
  }
  if (!lost_count && !(g_under_mpirun && signal == SIGTERM)) return;
  // A rank that failed wrote the job's line and ended the job (its process may be gone already).
  if (g_job_failed.load()) ::_exit(2);
  const int64_t completed = g_completed.load();
  Line l;
  if (!lost_count) {  // Ctrl-C (mpirun turns it into SIGTERM), or a rank lost on another host
    if (g_rank == 0) {
      l.add("interrupted: mpirun stopped every rank ");
      if (completed < 0) {
        l.add("during set-up, before the first step (a Ctrl-C or a signal to mpirun, or a rank lost on another "
              "host, which mpirun's message then names); start the job again\n");
      } else {
        l.add("after step ");
        l.add(completed);
        l.add(", the last every rank completed (a Ctrl-C or a signal to mpirun, or a rank lost on another host, "
              "which mpirun's message then names); ");
        l.add(g_resume_hint_ready ? g_resume_hint : "start the job again (with --resume to go on from the last checkpoint)");
        l.add("\n");
      }
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, l.text, static_cast<size_t>(l.n));
    }
    ::_exit(interrupted_exit_code(signal));
  }
  if (reporter == g_rank) {
    l.add(lost_count == 1 ? "error: rank " : "error: ranks ");
    for (int i = 0, k = 0; i < g_host_count; ++i) {
      if (!lost[i]) continue;
      if (k++) l.add(", ");
      l.add(int64_t{g_host[i].rank});
    }
    l.add(" of ");
    l.add(int64_t{g_size});
    l.add(lost_count == 1 ? " was lost (its process is gone)" : " were lost (their processes are gone)");
    if (completed < 0) {
      l.add(" during set-up, before the first step");
    } else {
      l.add(" after step ");
      l.add(completed);
      l.add(", the last every rank completed");
    }
    l.add("; every rank stops: start the job again (with --resume to go on from the last checkpoint)\n");
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, l.text, static_cast<size_t>(l.n));
  }
  ::_exit(1);
}

void on_signal(int signal) {
  if (g_host_count) {
    const int saved = errno;
    end_if_a_rank_was_lost(signal);
    errno = saved;
  }
  if (g_interrupted) {  // the second: the user does not want to wait for the step to end
    static const char kLine[] = "\ninterrupted again: exiting now, without a checkpoint of the step under way\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kLine, sizeof kLine - 1);
    ::_exit(interrupted_exit_code(signal));
  }
  g_interrupted = signal;
}

}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupted = 0;
  g_completed = -1;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // file writes and waits under way go on; the loop checks the flag
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  g_host_count = 0;
}

void InterruptGuard::watch_ranks(int rank, int size, const std::vector<std::pair<int, int>>& host_ranks) {
  g_host_count = 0;  // the handler reads nothing while it is filled
  g_rank = rank;
  g_size = size;
  g_under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  const int n = std::min(static_cast<int>(host_ranks.size()), kMaxHostRanks);
  for (int i = 0; i < n; ++i) g_host[i] = {host_ranks[static_cast<size_t>(i)].first, host_ranks[static_cast<size_t>(i)].second};
  std::atomic_signal_fence(std::memory_order_seq_cst);
  g_host_count = n;
}

void InterruptGuard::completed(int64_t steps) { g_completed = steps; }

void InterruptGuard::resume_hint(const std::string& text) {
  g_resume_hint_ready = 0;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::snprintf(g_resume_hint, sizeof g_resume_hint, "%s", text.c_str());
  std::atomic_signal_fence(std::memory_order_seq_cst);
  g_resume_hint_ready = 1;
}

void note_job_failed() { g_job_failed = true; }

bool job_failed() { return g_job_failed.load(); }

bool InterruptGuard::interrupted() const { return g_interrupted != 0; }

int InterruptGuard::signal() const { return g_interrupted; }

}  // namespace pt
