#include "cli/interrupt.h"

#include <signal.h>
#include <unistd.h>

namespace pt {
namespace {

volatile sig_atomic_t g_interrupted = 0;
struct sigaction g_old_int, g_old_term;

void on_signal(int) {
  if (g_interrupted) {  // the second: the user does not want to wait for the step to end
    static const char kLine[] = "\ninterrupted again: exiting now, without a checkpoint of the step under way\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kLine, sizeof kLine - 1);
    ::_exit(kInterruptedExitCode);
  }
  g_interrupted = 1;
}

}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupted = 0;
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
}

bool InterruptGuard::interrupted() const { return g_interrupted != 0; }

}  // namespace pt
