// cli/interrupt.h: Ctrl-C (SIGINT) and SIGTERM during `pipetrain train`'s step loop. In: the
// signals; out: a flag the loop reads at each step boundary, so that a run stops between steps
// (never inside a checkpoint or an output being written) and can keep its last finished step.
// A second signal while the first is pending exits at once with 130, writing one line.
#pragma once

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
};

// The exit code of a run stopped by a signal, as shells report SIGINT.
constexpr int kInterruptedExitCode = 130;

}  // namespace pt
