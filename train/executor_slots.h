// train/executor_slots.h: the executor's inner types, shared by executor_plan.cc (which builds
// them once: slots, sources, effects of each action) and executor.cc (which runs the step with
// them). Not part of the executor's interface.
//
// Memory: every buffer a program reads or writes (slot blocks, uploaded feeds, accumulators,
// held gradients, zeros) is in the memory of the chunk's backend, taken once through
// Backend::allocate and given back when the executor goes; the only host memory a step touches
// is the feeds' staging (Backend::allocate_host: pinned on CUDA), the loss, the side outputs
// and the final gradients, each crossing through Backend::copy.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/executor.h"
#include "exec/kernel.h"
#include "exec/stage_program.h"

namespace pt {
namespace exec_detail {

// The slots of one (micro-batch, chunk), by lifetime (see executor.h).
// kFeed: the feeds F (and, for a last chunk without a loss, B) read, uploaded by F.
enum Grp : int { kOut, kRecvIn, kKeptB, kKeptW, kOGrad, kIGrad, kPassed, kFeed, kGroups };
inline bool counts_as_kept(int g) { return g == kKeptB || g == kKeptW || g == kPassed; }

// Memory one backend handed out (Backend::allocate, or allocate_host for staging), zeroed once
// (unless `zeroed` is false: a programs' arena, whose pages are touched only where a run
// writes) and given back when the Block goes.
class Block {
 public:
  Block() = default;
  Block(Backend& backend, size_t bytes, bool host = false, bool zeroed = true)
      : backend_(&backend), host_(host),
        p_(static_cast<std::byte*>(host ? backend.allocate_host(std::max<size_t>(bytes, 1))
                                        : backend.allocate(std::max<size_t>(bytes, 1)))) {
    PT_CHECK(p_ != nullptr, "cannot allocate " + std::to_string(bytes) + " bytes");
    if (zeroed) backend.fill(p_, 0, bytes);
  }
  ~Block() { reset(); }
  Block(Block&& o) noexcept : backend_(o.backend_), host_(o.host_), p_(o.p_) { o.p_ = nullptr; }
  Block& operator=(Block&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_, host_ = o.host_, p_ = o.p_;
      o.p_ = nullptr;
    }
    return *this;
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  std::byte* get() const { return p_; }

 private:
  void reset() {
    if (!p_) return;
    if (host_) backend_->release_host(p_);
    else backend_->release(p_);
    p_ = nullptr;
  }
  Backend* backend_ = nullptr;
  bool host_ = false;
  std::byte* p_ = nullptr;
};

struct Entry {
  std::string name;
  TensorType type;
  size_t offset = 0;
  size_t bytes = 0;
};

// Tensors sharing one lifetime, stored together in one block per micro-batch in flight. The
// blocks are allocated before the first step; a step only takes them from and returns them to
// the free list.
struct Group {
  std::vector<Entry> entries;
  size_t bytes = 0;    // a block, each entry 64-byte aligned
  int64_t payload = 0;  // the entries' own bytes: what the live-byte counts add
  std::vector<Block> pool;  // in the chunk's backend's memory
  std::vector<std::byte*> free;
  std::vector<std::byte*> live;  // [micro_batch]: the block held, or nullptr

  int add(const std::string& name, const TensorType& type) {
    constexpr size_t kAlign = 64;
    Entry e{name, type, bytes, static_cast<size_t>(type.bytes())};
    bytes += (e.bytes + kAlign - 1) / kAlign * kAlign;
    payload += static_cast<int64_t>(e.bytes);
    entries.push_back(std::move(e));
    return static_cast<int>(entries.size()) - 1;
  }
  int find(const std::string& name) const {
    for (size_t i = 0; i < entries.size(); ++i)
      if (entries[i].name == name) return static_cast<int>(i);
    return -1;
  }
  std::byte* at(int m, int e) const {
    return live[static_cast<size_t>(m)] + entries[static_cast<size_t>(e)].offset;
  }
};

// Where one graph input is read from.
struct Source {
  enum Kind { kSlot, kFeed, kAcc } kind = kSlot;
  int chunk = -1, group = -1, index = -1;  // kSlot: entry of (chunk, group); kFeed: feed k
};                                         // (entry k of kFeed); kAcc: parameter k



struct Use {
  int chunk, group;
};
// After a run: output (or input) k of the program goes to entry `entry` of `group`.
struct Copy {
  int k;
  bool input;
  int group, entry;
  bool placed = false;  // the program writes output k into the slot itself (place_output)
};
struct Effects {
  std::vector<Use> acquire, release;  // before / after the action, same micro-batch
};

inline int index_of(const std::vector<std::string>& list, const std::string& name) {
  auto it = std::find(list.begin(), list.end(), name);
  return it == list.end() ? -1 : static_cast<int>(it - list.begin());
}

inline Tensor zeros_of(const TensorType& type) {
  Tensor t;
  t.type = type;
  t.data.assign(static_cast<size_t>(type.bytes()), std::byte{0});
  return t;
}

using Clock = std::chrono::steady_clock;

}  // namespace exec_detail

// The backend of a device another process runs: the executor plans that device's chunks (the
// messages and slot layouts both sides must agree on) but never allocates or runs anything for
// them; every use is an internal error naming the device.
class RemoteDevice : public Backend {
 public:
  explicit RemoteDevice(int device) : device_(device) {}
  const char* name() const override { return "remote"; }
  std::string supports(const KernelSpec&) const override { return refuse(); }
  std::unique_ptr<Kernel> create_kernel(const KernelSpec&) const override { return refuse(), nullptr; }
  void* allocate(size_t) override { return refuse(), nullptr; }
  void copy(void*, const void*, size_t) override { refuse(); }
  void fill(void*, unsigned char, size_t) override { refuse(); }

 private:
  std::string refuse() const {
    PT_CHECK(false, "device " + std::to_string(device_) + " runs in another process");
    return {};
  }
  int device_;
};

// One parameter's gradient sum for the step, in the memory of the backend of the first chunk
// that reads the parameter: on the CPU `host` (the executor's grads()) itself, elsewhere a block
// copied to `host` after the step.
struct PipelineExecutor::Accumulator {
  Backend* backend = nullptr;
  Tensor* host = nullptr;  // the step's gradient as the executor hands it out (grads())
  // Where the sum accumulates: on a backend that computes in host memory (the CPU) the host
  // tensor itself, so a gradient is held once; elsewhere `block`, copied out after the step.
  std::byte* at = nullptr;
  exec_detail::Block block;
};

struct PipelineExecutor::Chunk {
  using Block = exec_detail::Block;
  using Group = exec_detail::Group;
  using Source = exec_detail::Source;
  using Copy = exec_detail::Copy;
  using Effects = exec_detail::Effects;
  const BackwardGraphs& g;
  int index, device;
  Backend& backend;  // for a chunk of another process: a placeholder that refuses every use
  bool local;        // run by this process; otherwise only planned (message names, layouts)
  std::optional<StageProgram> f, b, w;  // compiled when local
  Group groups[exec_detail::kGroups];
  std::vector<Source> f_src, b_src, w_src;
  std::vector<Buffer> f_in, b_in, w_in;  // types fixed here; run() patches the addresses
  std::vector<Copy> f_dst;                 // F's outputs (and inputs) that outlive it
  std::vector<std::pair<int, int>> b_dst;  // per B output: (group, entry)
  std::vector<char> b_placed;              // per B output: B writes it into its slot itself
  int loss_output = -1;
  std::vector<std::pair<int, int>> side_dst;  // (F output, side output index)
  std::vector<std::string> feed_names;        // feed k is entry k of groups[kFeed]
  std::vector<const TensorType*> feed_types;
  std::vector<Block> feed_stage;              // [m]: host staging of the kFeed block
  bool b_reads_feed = false;                  // the kFeed block lives until B
  std::vector<Accumulator*> acc;              // per parameter, W's order
  Block zeros;  // the largest parameter's bytes of 0 (hold or shared: W bound to them computes alone)
  std::vector<int> w_out_param;               // per W output
  // Per W output: W writes it into the held block itself; and into the accumulator itself when
  // the micro-batch adds in order (its last node is `grad_acc + g`, in place on the sum, as
  // add_into_acc does).
  std::vector<char> w_place_held, w_place_acc;
  bool shared = false;  // reads a parameter another chunk reads too: fold after the step
  bool hold = false;    // some W runs before the W of the micro-batch before it
  std::vector<size_t> held_offset;   // per parameter: where it sits in a held block
  std::vector<Block> held;           // [m]: that micro-batch's gradients alone
  std::vector<char> held_ready;      // [m]
  int next_m = 0;                    // the next micro-batch to add in order
  // acc[p] += held gradient, in place on acc[p]'s backend: the Add kernel of W's `grad_acc + g`
  // (IEEE float addition, as the CPU's), made once from one Add node per parameter in `adds`.
  Graph adds;
  std::vector<std::unique_ptr<Kernel>> add;  // per parameter (hold or shared chunks)
  std::vector<Block> fold_in;  // per parameter: the held gradient on acc's backend, if another
  std::vector<std::string> recv_in_msg, ograd_msg;  // message names, per entry
  std::vector<int> send_f_from;  // per kRecvIn entry of chunk c+1: our kOut entry
  std::vector<int> send_b_from;  // per kOGrad entry of chunk c-1: our kIGrad entry
  std::vector<double> profile[3];  // per node of f, b, w: seconds summed (profile_ops)

  Chunk(const BackwardGraphs& graphs, int i, int d, Backend& be, bool here)
      : g(graphs), index(i), device(d), backend(be), local(here) {
    if (!local) return;
    // Their arena is the device's (allocate_arenas), planned once the executor knows which
    // outputs it places on every run.
    f.emplace(graphs.forward, be, ProgramUse::kTraining, ArenaFrom::kCaller);
    b.emplace(graphs.backward_input, be, ProgramUse::kTraining, ArenaFrom::kCaller);
    w.emplace(graphs.backward_weight, be, ProgramUse::kTraining, ArenaFrom::kCaller);
  }

  int feed(const std::string& name, const TensorType& type) {
    int k = exec_detail::index_of(feed_names, name);
    if (k < 0) {
      feed_names.push_back(name);
      feed_types.push_back(&type);
      k = groups[exec_detail::kFeed].add(name, type);
      PT_CHECK(k + 1 == static_cast<int>(feed_names.size()), "feeds and their slots disagree");
    }
    return k;
  }
  const TensorType& param_type(size_t p) const { return acc[p]->host->type; }
  std::byte* held_at(int m, size_t p) const {
    return held[static_cast<size_t>(m)].get() + held_offset[p];
  }
  // acc[p] += grad (grad in acc[p]'s backend's memory); enqueued on that backend.
  void add_into_acc(size_t p, const void* grad) {
    const TensorType& t = param_type(p);
    const Buffer in[2] = {{acc[p]->at, &t}, {const_cast<void*>(grad), &t}};
    const Buffer out[1] = {{acc[p]->at, &t}};
    add[p]->run(in, out, nullptr);
  }
};

struct PipelineExecutor::Device {
  using Effects = exec_detail::Effects;
  int index = 0;
  Backend* backend = nullptr;  // a RemoteDevice when another process runs it
  bool local = true;
  std::unique_ptr<RemoteDevice> remote;
  std::vector<Effects> effects;  // per step of the device's list
  // One arena for every program of the device's chunks: its worker runs them one at a time, and
  // copies out what it keeps of a program's outputs before it runs the next.
  exec_detail::Block arena;
  int64_t live_kept = 0, live_slot = 0, peak_kept = 0, peak_slot = 0;
};

struct PipelineExecutor::Failure {
  std::atomic<bool> stop{false};
  std::mutex mu;
  bool set = false;
  int device = 0, step = 0;
  std::string what;
};

}  // namespace pt
