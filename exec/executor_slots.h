// exec/executor_slots.h: the executor's inner types, shared by executor_plan.cc (which builds
// them once: slots, sources, effects of each action) and executor.cc (which runs the step with
// them). Not part of the executor's interface.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "exec/executor.h"
#include "exec/stage_program.h"

namespace pt {
namespace exec_detail {

// The slots of one (micro-batch, chunk), by lifetime (see executor.h).
enum Grp : int { kOut, kRecvIn, kKeptB, kKeptW, kOGrad, kIGrad, kPassed, kGroups };
inline bool counts_as_kept(int g) { return g == kKeptB || g == kKeptW || g == kPassed; }

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
  std::vector<std::vector<std::byte>> pool;
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
  int chunk = -1, group = -1, index = -1;  // kSlot: entry of (chunk, group); kFeed: feed k;
};                                         // kAcc: parameter k

struct Use {
  int chunk, group;
};
// After a run: output (or input) k of the program goes to entry `entry` of `group`.
struct Copy {
  int k;
  bool input;
  int group, entry;
};
struct Effects {
  std::vector<Use> acquire, release;  // before / after the action, same micro-batch
};

inline int index_of(const std::vector<std::string>& list, const std::string& name) {
  auto it = std::find(list.begin(), list.end(), name);
  return it == list.end() ? -1 : static_cast<int>(it - list.begin());
}

// acc += g, elementwise. Exactly what W's `grad_acc + g` Add computes (IEEE float addition), and
// g was computed as `0 + g`, which equals g up to the sign of a zero that acc + g does not see.
inline void add_into(Tensor& acc, const Tensor& g) {
  PT_CHECK(acc.type.dtype == DType::kFloat32 && acc.type == g.type,
           "held gradients are float32 of the accumulator's type");
  float* a = acc.as<float>();
  const float* b = g.as<float>();
  const int64_t n = acc.type.numel();
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
}

inline Tensor zeros_of(const TensorType& type) {
  Tensor t;
  t.type = type;
  t.data.assign(static_cast<size_t>(type.bytes()), std::byte{0});
  return t;
}

using Clock = std::chrono::steady_clock;

}  // namespace exec_detail

struct PipelineExecutor::Chunk {
  using Group = exec_detail::Group;
  using Source = exec_detail::Source;
  using Copy = exec_detail::Copy;
  using Effects = exec_detail::Effects;
  const BackwardGraphs& g;
  int index, device;
  StageProgram f, b, w;
  Group groups[exec_detail::kGroups];
  std::vector<Source> f_src, b_src, w_src;
  std::vector<Buffer> f_in, b_in, w_in;  // types fixed here; run() patches the addresses
  std::vector<Copy> f_dst;                 // F's outputs (and inputs) that outlive it
  std::vector<std::pair<int, int>> b_dst;  // per B output: (group, entry)
  int loss_output = -1;
  std::vector<std::pair<int, int>> side_dst;  // (F output, side output index)
  std::vector<std::string> feed_names;
  std::vector<const TensorType*> feed_types;
  std::vector<std::vector<const std::byte*>> feed_ptr;  // [m][feed]
  std::vector<Tensor*> acc;                              // per parameter, W's order
  std::vector<Tensor> zeros;                             // per parameter
  std::vector<int> w_out_param;                          // per W output
  bool shared = false;  // reads a parameter another chunk reads too: fold after the step
  bool hold = false;    // some W runs before the W of the micro-batch before it
  std::vector<std::vector<Tensor>> held;  // [m][parameter]: that micro-batch's gradient alone
  std::vector<char> held_ready;           // [m]
  int next_m = 0;                         // the next micro-batch to add in order
  std::vector<std::string> recv_in_msg, ograd_msg;  // message names, per entry
  std::vector<int> send_f_from;  // per kRecvIn entry of chunk c+1: our kOut entry
  std::vector<int> send_b_from;  // per kOGrad entry of chunk c-1: our kIGrad entry

  Chunk(const BackwardGraphs& graphs, int i, int d, Backend& backend)
      : g(graphs), index(i), device(d), f(graphs.forward, backend),
        b(graphs.backward_input, backend), w(graphs.backward_weight, backend) {}

  int feed(const std::string& name, const TensorType& type) {
    int k = exec_detail::index_of(feed_names, name);
    if (k < 0) {
      feed_names.push_back(name);
      feed_types.push_back(&type);
      k = static_cast<int>(feed_names.size()) - 1;
    }
    return k;
  }
};

struct PipelineExecutor::Device {
  using Effects = exec_detail::Effects;
  int index = 0;
  Backend* backend = nullptr;
  std::vector<Effects> effects;  // per step of the device's list
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
