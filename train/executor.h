// train/executor.h: runs one training step of a pipeline schedule. In: every chunk's F, B and W
// graphs (autodiff/chunk_backward.h, forward order), the chunk -> device placement, a Backend per
// device, a Comm, and a lowered Schedule (schedule/lower.h). Out: the step's summed loss, the
// accumulated gradient of every parameter, and what the step measured (per-action wall times,
// peak kept activations per device).
//
// Create once, run many: the constructor validates the schedule, compiles F, B and W of every
// chunk once on its device's backend, and sizes every per-(micro-batch, chunk) slot pool from
// the schedule's order (how many micro-batches of a chunk are in flight at once). run_step()
// runs one worker per device (the first on the calling thread, the others on a thread each);
// each walks its action list, looking every action up in a table of handlers (one per Op). A
// slot's tensors are released after the last action that reads them, which the schedule fixes:
//   chunk outputs      F(m,c) .. F(m,c+1) on the same device, or SEND_F(m,c)
//   received inputs    RECV_F(m,c) .. F(m,c)
//   kept for B only    F(m,c) .. B(m,c)          kept for W too   F(m,c) .. W(m,c)
//   received grad.<y>  RECV_B(m,c) .. B(m,c)     passed to W      B(m,c) .. W(m,c)
//   grad.<x>           B(m,c) .. B(m,c-1) on the same device, or SEND_B(m,c)
//
// Memory: everything the programs read and write lives in the device backend's memory (slot
// blocks, uploaded feeds, gradient accumulators, one arena per device that its programs share),
// allocated through the Backend hooks before the first step; host memory on the CPU backend. Per micro-batch, F uploads its feeds (staged
// in Backend::allocate_host memory by run_step); the loss, the side outputs and, after the
// step, the gradients come back to the host through Backend::copy. Comm sees device pointers.
//
// Across processes: a null backends[d] means another process runs device d. Its chunks are
// planned here too (both sides derive the same message names and layouts from the same graphs,
// and the Comm learns every message name through Comm::plan), but nothing is compiled,
// allocated or run for them: run_step() runs the workers of this process's devices, and loss(),
// side_outputs(), grads() and the measurements cover those devices only (the loss lives where
// the last chunk runs). A parameter is read by the chunks of one process only: a tie across
// processes comes split into sites (autodiff/parameter_sites.h), one accumulator each, which the
// trainer brings together (train/ties.h).
//
// Determinism: gradients are accumulated exactly as ReferenceStep does (micro-batch order, and
// for a parameter several chunks share, the later chunk first), so every schedule gives the
// same bits. A W that runs before the W of the micro-batch before it computes its gradient
// alone (into a held buffer, its accumulator bound to zeros) and is added when its turn comes,
// by the backend's own Add kernel (the one W's `grad_acc + g` runs), in place on the device.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autodiff/backward.h"
#include "core/error.h"
#include "core/ir.h"
#include "exec/backend.h"
#include "partition/cost_model.h"
#include "train/comm.h"
#include "schedule/schedule.h"

namespace pt {

// A failure inside a step: one line naming the training step, the device, the action's step
// and text, and the cause; plus the device x step grid with that action marked.
class ExecutionError : public UserError {
 public:
  ExecutionError(const std::string& where, const std::string& what, std::string grid)
      : UserError(where, what), grid_(std::move(grid)) {}
  const std::string& grid() const { return grid_; }

 private:
  std::string grid_;
};

struct ActionTime {
  double start = 0, end = 0;  // seconds since the step began
  // Seconds the action's thread ran between start and end (CLOCK_THREAD_CPUTIME_ID), the clock
  // reads' own cost taken off: what the action itself spent, without the time its thread waited
  // descheduled (4 stage threads on 2 cores, another process). Read for compute actions in steps
  // run under time_cpu(); -1 otherwise.
  double cpu = -1;
};

class PipelineExecutor {
 public:
  // chunks must outlive the executor. device_of_chunk[c] must equal schedule.device_of(c);
  // backends[d] runs device d's kernels (the executor binds it to d's worker thread).
  // side_outputs: forward outputs (of whichever chunk makes them) copied out per micro-batch,
  // such as BatchNorm's batch statistics (autodiff/training_mode.h).
  PipelineExecutor(const std::vector<BackwardGraphs>& chunks,
                   const std::vector<int>& device_of_chunk, const std::vector<Backend*>& backends,
                   Comm& comm, const Schedule& schedule,
                   const std::vector<std::string>& side_outputs = {});
  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  // feeds[m]: every model input, plus "target" and "loss_scale", of micro-batch m, one per
  // micro-batch of the schedule (it owns their count; another count is our bug). Gradients
  // start from zero each step. ExecutionError when an action fails (every worker stops; the
  // grid is also written to stderr); UserError on a missing or mistyped feed.
  void run_step(const std::vector<std::map<std::string, Tensor>>& feeds);

  // Sum of the micro-batch losses of the last step, added in micro-batch order.
  double loss() const { return loss_; }
  // The side outputs of micro-batch m in the last step, in the constructor's order.
  const std::vector<Tensor>& side_outputs(int m) const { return side_[static_cast<size_t>(m)]; }
  // Accumulated gradient per parameter name, as ReferenceStep::grads(): host tensors, copied
  // from the devices after each step.
  const std::map<std::string, Tensor>& grads() const { return grads_; }
  // The trainer adds the sites other processes hold (train/ties.h) and sums tied sites in place.
  std::map<std::string, Tensor>& grads() { return grads_; }
  // From the next step on, the gradients stay where they were accumulated (grads() is no longer
  // written): for an optimizer that updates on the device (Optimizer::bind_device).
  void keep_gradients_on_device() { gradients_on_device_ = true; }
  // The accumulated gradient of a parameter in `backend`'s memory (numel floats, valid after
  // run_step), or nullptr when it is not accumulated there.
  const float* device_gradient(const std::string& param, const Backend& backend) const;
  // [device][step]: when each action of the last step started and ended.
  const std::vector<std::vector<ActionTime>>& action_times() const { return times_; }
  // [device]: the largest sum of kept and passed bytes (F -> B/W, B -> W) live between two
  // actions in the last step; comparable with schedule/simulate.h's peak_memory.
  const std::vector<int64_t>& peak_kept_bytes() const { return peak_kept_; }
  // [device]: the same over every slot (also chunk outputs, received tensors, gradients and
  // uploaded feeds).
  const std::vector<int64_t>& peak_slot_bytes() const { return peak_slot_; }
  // [device]: the bytes of the one arena its chunks' F, B and W programs share (the largest
  // program's: they run one at a time), allocated before the first step; 0 on another process's
  // device. No program keeps room for an output the executor places on every run (into a slot,
  // an accumulator or a held gradient): plan/memory.h counts the same.
  const std::vector<int64_t>& arena_bytes() const { return arena_bytes_; }
  // [device]: the largest of its programs' tensors alone (StageProgram::planned_tensor_bytes),
  // without the kernels' scratch: on a backend that fuses nothing, plan/memory.h's arena.
  const std::vector<int64_t>& arena_tensor_bytes() const { return arena_tensor_bytes_; }
  const Schedule& schedule() const { return schedule_; }

  // From the next step on, each compute action also reads its thread's CPU time
  // (ActionTime::cpu), or no longer does. A read is a system call (~1 us on the development VM,
  // 0.1-0.2 us on bare metal): it lies outside the action's start and end, but lengthens the gap
  // to the next action by twice that.
  void time_cpu(bool on);

  // From the next step on, every kernel of every chunk is timed on its own (the backend
  // synchronised after each, which slows the step): node_profile() gives each node's time over
  // the profiled steps, by_op() sums such times per pass (F, B, W) and op type; both largest
  // first, each beside what the cost model (partition/cost_model.h) counts for the same nodes.
  void profile_ops();
  struct NodeTime {
    int chunk = 0;
    std::string pass, node, op;
    std::vector<int64_t> shape;  // its first output's
    double seconds = 0;  // over the profiled steps
    NodeCost cost;       // one run of its chunk's program
  };
  std::vector<NodeTime> node_profile() const;
  struct OpTime {
    std::string pass, op;
    double seconds = 0;
    int64_t nodes = 0;  // nodes of this op type in the pass, over every chunk
    NodeCost cost;      // their costs summed, one run of each chunk's program
  };
  static std::vector<OpTime> by_op(const std::vector<NodeTime>& nodes);

 private:
  struct Accumulator;
  struct Chunk;
  struct Device;
  struct Failure;
  struct Worker;

  void check_placement(const std::vector<int>& device_of_chunk, size_t backends) const;
  void bind_feeds(const std::vector<std::map<std::string, Tensor>>& feeds);
  void size_slots();
  void allocate_arenas();
  void plan_held(Chunk& ch);
  void start_step();
  void fold_shared_gradients();
  void copy_gradients_out();
  [[noreturn]] void throw_failure();

  const std::vector<BackwardGraphs>& graphs_;
  Schedule schedule_;
  Comm& comm_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::map<std::string, Tensor> grads_;  // host copies of accs_, made after each step
  std::map<std::string, std::unique_ptr<Accumulator>> accs_;
  std::vector<float> losses_;  // [micro_batch]
  std::vector<std::vector<Tensor>> side_;  // [micro_batch][side output]
  double loss_ = 0;
  int steps_run_ = 0;
  bool gradients_on_device_ = false;
  bool time_cpu_ = false;
  double cpu_read_cost_ = 0;  // one thread CPU clock read's share of an interval (time_cpu)
  std::unique_ptr<Failure> failure_;
  std::vector<std::vector<ActionTime>> times_;
  std::vector<int64_t> peak_kept_, peak_slot_, arena_bytes_, arena_tensor_bytes_;
};

}  // namespace pt
