// exec/stage_program.h: a Graph compiled once on a Backend, run many times.
//
// Compiling makes one kernel per node (a UserError naming the node when the backend cannot run
// it), plans one arena for every intermediate tensor (core/graph_arena.h; a view of an arena
// tensor, Node::is_view, shares its buffer and runs nothing) and, around them, every kernel's
// scratch (core/memory_plan.h add_buffers), allocates it through the backend (host memory on the
// CPU, device memory on a GPU), and resolves every kernel argument to an address (constants:
// Backend::device_constant). With ArenaFrom::kCaller the last two wait for the caller: it says
// which outputs it places on every run, which then take no room in the arena (plan_arena), and
// hands in an arena that programs which never run at the same time share, or none (allocate). run()
// patches the input addresses and calls the kernels in order: nothing is allocated or looked up
// in it. Inputs, outputs and the arena are in the backend's memory.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/graph_arena.h"
#include "core/ir.h"
#include "core/memory_plan.h"
#include "exec/backend.h"

namespace pt {

// What a program is for. kTraining: every intermediate tensor plain, so that where a tensor is
// computed (a recompute policy, a cut between stages) never changes a bit; its constants may
// change between runs (the optimizer updates the weights in place). Kernels take fused
// neighbours there only where they compute the unfused bits (KernelSpec::exact_fusion): a
// MatMul its bias Add, Softmax and SoftmaxGrad an attention's scale and mask, so a cut between
// them changes none. kInference: forward only, its constants fixed once it is built (`pipetrain
// run`): the tensors between neighbouring convs stay channels-last where the backend's convs
// take them (exec/channels_last.h), kernels may lay constants out once
// (KernelSpec::constants_fixed: a conv's weights in oneDNN's blocked layout, a small product's B),
// and a Conv, MatMul or Gemm applies its lone Relu or Clip reader as it writes
// (KernelSpec::epilogue). Faster, and equal to the training program within float rounding.
enum class ProgramUse { kTraining, kInference };

// Who plans and allocates the arena: the constructor (kOwn: every output has its room), or the
// caller, through plan_arena() and allocate(), before the first run (kCaller).
enum class ArenaFrom { kOwn, kCaller };

class StageProgram {
 public:
  StageProgram(const Graph& g, Backend& backend, ProgramUse use = ProgramUse::kTraining,
               ArenaFrom arena = ArenaFrom::kOwn);
  ~StageProgram();
  StageProgram(const StageProgram&) = delete;
  StageProgram& operator=(const StageProgram&) = delete;

  // inputs: one per graph input, in g.inputs order, of exactly the graph's types.
  void run(std::span<const Buffer> inputs);
  // run(), timing each node: seconds[i] += wall time of node i (sized to the node count).
  void run_profiled(std::span<const Buffer> inputs, std::vector<double>* seconds);
  // From now on every run() is run_profiled() into `seconds` (null: plain runs again). The
  // backend is synchronised after each node, so the times are each kernel's own.
  void profile_into(std::vector<double>* seconds);
  const Graph& graph() const { return graph_; }
  // Whether node i runs nothing: a view sharing its input's buffer, or (inference programs) a
  // Relu or Clip its input's producer applies as an epilogue.
  bool runs_nothing(size_t i) const;
  // Graph output k, valid until the next run.
  Buffer output(size_t k) const;
  // Whether graph output k can be written straight into the caller's memory (place_output): an
  // arena tensor that no other graph output shares (not a graph input, a view of one or a
  // constant).
  bool placeable(size_t k) const { return layout_.placeable.at(k) != 0; }
  // ArenaFrom::kCaller, before allocate(): plans the arena, the outputs flagged in
  // `always_placed` (per graph output, placeable ones; shorter: the rest unflagged) taking no
  // room: the caller places each of them before every run (place_output, never null).
  void plan_arena(const std::vector<char>& always_placed);
  // ArenaFrom::kCaller, after plan_arena(): the program runs in `shared`, planned_peak_bytes()
  // of the backend's memory at least, which programs that never run at the same time may share
  // (an output left in the arena is then valid until the next run of any of them, not only of
  // this one); null: an arena of its own, allocated here.
  void allocate(std::byte* shared = nullptr);
  // From the next run on, the kernels write graph output k (and its views) at `at`, in the
  // backend's memory, 64-byte aligned, holding its bytes, overlapping no other tensor of the run
  // (but an input that only the output's producer reads, where that kernel works in place: the
  // pipeline's `grad_acc + g` into the accumulator); output(k) is then `at`. Null: back in the
  // arena. Saves the copy a caller keeping the output past the next run would make (the
  // pipeline's kept activations and gradients).
  void place_output(size_t k, void* at);

  const MemoryPlan& memory_plan() const { return plan_; }
  // The arena: its tensors and, around them, its kernels' scratch (after plan_arena).
  int64_t planned_peak_bytes() const { return plan_.arena_bytes; }
  // The arena's tensors alone: what core/graph_arena.h plans from the graph alone on a backend
  // that fuses nothing (plan/memory.h's count), before the scratch is placed around them.
  int64_t planned_tensor_bytes() const { return tensor_bytes_; }
  // Fills the arena with a marker pattern, runs once, and returns one past the highest arena
  // byte the run wrote: the memory the run really used.
  int64_t measure_peak_bytes(std::span<const Buffer> inputs);

 private:
  struct Step;
  const Graph& graph_;
  Backend& backend_;
  GraphArena layout_;
  MemoryPlan plan_;
  int64_t tensor_bytes_ = 0;
  bool planned_ = false;
  std::vector<char> always_placed_;  // per graph output
  std::vector<int> scratch_buffer_;  // per step: its scratch's buffer in plan_, or -1
  std::byte* arena_ = nullptr;
  bool own_arena_ = false;
  std::vector<Step> steps_;
  std::vector<Buffer> outputs_;
  // Where each graph input is read: (step, argument slot) per input.
  std::vector<std::vector<std::pair<size_t, size_t>>> input_uses_;
  std::vector<size_t> output_from_input_;  // per output: input index + 1, or 0
  // Per placeable output: every argument holding its buffer, (step, output?, slot); and its
  // arena address (null where it is placed on every run).
  struct Site {
    size_t step;
    bool output;
    size_t slot;
  };
  std::vector<std::vector<Site>> output_sites_;
  std::vector<void*> output_home_;
  std::vector<double>* profile_ = nullptr;

  void bind_inputs(std::span<const Buffer> inputs);
};

}  // namespace pt
