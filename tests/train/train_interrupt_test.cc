// Issue 21, item 3: Ctrl-C (SIGINT) or SIGTERM during `pipetrain train`, as a newcomer sees it.
// The run stops at the next step boundary, keeps the last finished step as a checkpoint where
// the config names a checkpoint.dir, says so in one line and exits 130 (SIGINT) or 143 (SIGTERM);
// --resume then ends on the very bytes of an uninterrupted run.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <thread>

#include "train/interrupt.h"
#include "train/checkpoint.h"
#include "tests/cli/run_cli.h"

namespace {

// The mlp sample on 2 stages; checkpoints every `every` steps when `every` > 0, none (no
// checkpoint.dir) otherwise.
fs::path mlp_config(const fs::path& dir, int steps, int every) {
  std::ostringstream c;
  c << "model: samples/mlp/mlp.onnx\n"
    << "dims: {batch: 4}\n"
    << "data: {kind: synthetic, samples: 64, eval_fraction: 0.25}\n"
    << "optimizer: {kind: adamw, lr: 3.0e-3, warmup_steps: 2, schedule: cosine}\n"
    << "pipeline: {stages: 2, micro_batches: 4, schedule: zb-h1}\n"
    << "steps: " << steps << "\n";
  if (every > 0) c << "checkpoint: {dir: " << (dir / "ckpt").string() << ", every: " << every << "}\n";
  c << "output: {model: " << (dir / "trained.onnx").string() << ", metrics: " << (dir / "metrics.jsonl").string()
    << ", trace: " << (dir / "trace.json").string() << ", timeline: " << (dir / "timeline.svg").string() << "}\n";
  return write(dir / "c.yaml", c.str());
}

// Starts `pipetrain args` in the background, stdout and stderr into `log`; returns its pid.
pid_t spawn(const std::string& args, const fs::path& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd = std::string(PT_BINARY) + " " + args + " >" + log.string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int64_t lines_in(const fs::path& path) {
  std::ifstream in(path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// Runs `train -q cfg` until its metrics hold `steps` lines, then sends each signal in `signals`;
// returns the wait status.
int interrupt_after(const fs::path& cfg, const fs::path& metrics, int64_t steps, const std::vector<int>& signals,
                    const fs::path& log) {
  const pid_t pid = spawn("train -q " + cfg.string(), log);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (lines_in(metrics) < steps && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  for (int s : signals) kill(pid, s);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// Ctrl-C after a few steps: exit 130, one line naming the step, the checkpoint and --resume;
// the checkpoint holds that step (between the every-100 ones), and --resume finishes to the
// bytes of the run never interrupted.
TEST(TrainInterrupt, CtrlCKeepsTheLastStepAndResumesToTheSameBytes) {
  const fs::path whole = scratch("int_whole"), cut = scratch("int_cut");
  ASSERT_EQ(run("train -q " + mlp_config(whole, 300, 100).string()).code, 0);

  const fs::path cfg = mlp_config(cut, 300, 100);
  const int status = interrupt_after(cfg, cut / "metrics.jsonl", 5, {SIGINT}, cut / "log.txt");
  const std::string log = slurp(cut / "log.txt");
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of stopping: " << log;
  EXPECT_EQ(WEXITSTATUS(status), 130) << log;
  const std::regex line("interrupted at step ([0-9]+) of 300: checkpoint step_([0-9]{8})\\.ckpt in " +
                        (cut / "ckpt").string() + "; continue with --resume\n");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(log, m, line)) << log;
  const int64_t n = std::stoll(m[1]);
  EXPECT_EQ(std::stoll(m[2]), n);
  ASSERT_GE(n, 5);
  ASSERT_LT(n, 100) << "the run got to its first scheduled checkpoint before the signal";
  EXPECT_EQ(pt::checkpoint_steps((cut / "ckpt").string()), std::vector<int64_t>{n});
  EXPECT_EQ(pt::read_latest_checkpoint((cut / "ckpt").string())->step, n);
  EXPECT_EQ(lines_in(cut / "metrics.jsonl"), n);  // every finished step's line, no more
  EXPECT_FALSE(fs::exists(cut / "trained.onnx"));  // the outputs of a finished run are not written

  const Result r = run("train --resume " + cfg.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("resumed from step " + std::to_string(n) + " (", 0), 0u) << r.out;
  EXPECT_EQ(slurp(cut / "trained.onnx"), slurp(whole / "trained.onnx"));
  EXPECT_EQ(slurp(cut / "trained.safetensors"), slurp(whole / "trained.safetensors"));
}

// SIGTERM with no checkpoint.dir: exit 143 (128 + SIGTERM, as shells report it), one line saying
// nothing was kept and how to make a run resumable; no output file is written.
TEST(TrainInterrupt, WithoutACheckpointDirItSaysNothingWasKept) {
  const fs::path d = scratch("int_nodir");
  const int status = interrupt_after(mlp_config(d, 300, 0), d / "metrics.jsonl", 3, {SIGTERM}, d / "log.txt");
  const std::string log = slurp(d / "log.txt");
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 143) << log;
  const std::regex line(
      "interrupted at step [0-9]+ of 300: nothing was kept \\(the config names no checkpoint.dir\\); add "
      "checkpoint: \\{dir: DIR, every: N\\} to make a run resumable\n");
  EXPECT_TRUE(std::regex_match(log, line)) << log;
  EXPECT_FALSE(fs::exists(d / "trained.onnx"));
  EXPECT_FALSE(fs::exists(d / "trace.json"));
}

// Two Ctrl-Cs in a row: the second does not wait for the step to end, yet the process still
// exits 130 (never killed by the signal), and every checkpoint on disk reads whole.
TEST(TrainInterrupt, ASecondCtrlCExitsAtOnce) {
  const fs::path d = scratch("int_twice");
  const int status = interrupt_after(mlp_config(d, 300, 1), d / "metrics.jsonl", 5, {SIGINT, SIGINT}, d / "log.txt");
  const std::string log = slurp(d / "log.txt");
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 130) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), log.rfind("\ninterrupted again", 0) == 0 ? 2 : 1) << log;
  for (const auto& e : fs::directory_iterator(d / "ckpt")) {
    if (e.path().extension() == ".ckpt") {
      EXPECT_NO_THROW(pt::read_checkpoint(e.path().string())) << e.path();
    }
  }
  EXPECT_NO_THROW(pt::read_latest_checkpoint((d / "ckpt").string()));
}

// Across processes the guard watches from before set-up (train/interrupt.h): the signal mpirun
// sends when a rank is lost ends this rank at once with one line, whether a step was completed
// yet or not. `completed` < 0 leaves the job in set-up. Runs in a child, which _exits.
std::pair<int, std::string> rank_signalled(bool peer_lost, int64_t completed, bool job_failed = false) {
  const fs::path log = scratch("int_rank_lost") / "stderr.txt";
  const pid_t child = fork();
  if (child == 0) {
    FILE* err = std::freopen(log.c_str(), "w", stderr);
    if (!err) _exit(126);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    pid_t peer = getpid();  // alive: this process
    if (peer_lost) {
      peer = fork();
      if (peer == 0) _exit(0);
      waitpid(peer, nullptr, 0);  // gone: reaped
    }
    pt::InterruptGuard guard;
    guard.watch_ranks(0, 2, {{0, getpid()}, {1, peer}});
    if (completed >= 0) guard.completed(completed);
    guard.resume_hint("continue from the last checkpoint in ck with --resume");
    if (job_failed) pt::note_job_failed();
    raise(SIGTERM);
    _exit(125);  // the handler did not end the process
  }
  int status = 0;
  waitpid(child, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(log)};
}

TEST(TrainInterrupt, ARankLostNamesTheStepOrTheSetUp) {
  const std::string stops =
      "; every rank stops: start the job again (with --resume to go on from the last checkpoint)\n";
  EXPECT_EQ(rank_signalled(true, -1), std::make_pair(1, "error: rank 1 of 2 was lost (its process is gone) during "
                                                        "set-up, before the first step" + stops));
  EXPECT_EQ(rank_signalled(true, 3), std::make_pair(1, "error: rank 1 of 2 was lost (its process is gone) after "
                                                       "step 3, the last every rank completed" + stops));
  // No rank of this host lost: mpirun's SIGTERM after a Ctrl-C (or a rank lost on another host,
  // which mpirun's own line names) reads as the interruption, with how to go on.
  const std::string why = " (a Ctrl-C or a signal to mpirun, or a rank lost on another host, which mpirun's message "
                          "then names); ";
  EXPECT_EQ(rank_signalled(false, -1), std::make_pair(143, "interrupted: mpirun stopped every rank during set-up, "
                                                           "before the first step" + why + "start the job again\n"));
  EXPECT_EQ(rank_signalled(false, 7),
            std::make_pair(143, "interrupted: mpirun stopped every rank after step 7, the last every rank completed" +
                                    why + "continue from the last checkpoint in ck with --resume\n"));
  // A rank failed (and wrote the job's line): mpirun's SIGTERM ends this one silently, also
  // where the failed rank's process is gone already.
  EXPECT_EQ(rank_signalled(false, 7, true), std::make_pair(2, std::string()));
  EXPECT_EQ(rank_signalled(true, 7, true), std::make_pair(2, std::string()));
}

}  // namespace
