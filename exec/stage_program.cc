#include "exec/stage_program.h"

#include <cstddef>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <map>

#include "core/bytes.h"
#include "core/error.h"
#include "core/graph_arena.h"
#include "exec/channels_last.h"

namespace pt {

struct StageProgram::Step {
  std::unique_ptr<Kernel> kernel;
  std::vector<Buffer> inputs, outputs;
  void* scratch = nullptr;
  bool aliased = false;  // a view whose output shares its input's buffer: nothing to run
  std::vector<ValueId> args;  // what `inputs` hold: the node's inputs, then its links' (fusion)
};

namespace {

constexpr unsigned char kMarker = 0xA5;

constexpr size_t kMaxLinks = 3;  // the longest chain of neighbours offered to one kernel

// A node fused into a neighbour's kernel (KernelSpec::epilogue or ::prologue), and its input that
// carries the chain's tensor.
struct Link {
  int node;
  size_t through;
};

bool is_graph_output(const Graph& g, ValueId v) {
  return std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end();
}

// The chain offered to node i as its epilogue: its output 0's lone reader (node i may have more
// outputs, which its kernel writes as ever), reading it once, of the
// output's type, with one output of its own and its other inputs made before node i (the fused
// kernel reads them when node i runs), then that output's lone reader, and so on; no tensor of
// the chain is a graph output, no link taken by another chain. Which links a kernel applies is
// the backend's to say.
std::vector<Link> epilogue_chain(const Graph& g, int i, const std::vector<bool>& taken) {
  std::vector<Link> links;
  for (int at = i; links.size() < kMaxLinks;) {
    const Node& node = g.nodes[static_cast<size_t>(at)];
    if (node.outputs.empty() || node.outputs[0] == kNoValue) break;
    const ValueId y = node.outputs[0];
    const Value& val = g.value(y);
    if (val.consumers.size() != 1 || is_graph_output(g, y)) break;
    const int c = val.consumers[0];
    const Node& reader = g.nodes[static_cast<size_t>(c)];
    const auto it = std::find(reader.inputs.begin(), reader.inputs.end(), y);
    const bool made_before = std::all_of(reader.inputs.begin(), reader.inputs.end(), [&](ValueId u) {
      return u == y || u == kNoValue || g.value(u).producer < i;
    });
    if (taken[static_cast<size_t>(c)] || std::count(reader.inputs.begin(), reader.inputs.end(), y) != 1 ||
        reader.outputs.size() != 1 || reader.outputs[0] == kNoValue || !made_before ||
        !(g.value(reader.outputs[0]).type == g.value(g.nodes[static_cast<size_t>(i)].outputs[0]).type))
      break;
    links.push_back({c, static_cast<size_t>(it - reader.inputs.begin())});
    at = c;
  }
  return links;
}

// The chain offered to node i as its prologue: the producer of its input 0 where only i reads
// that tensor once, with one output, read through its first input of that output's type that is
// no constant; then that input's producer, and so on; no tensor of the chain is a graph output,
// no link taken by another chain.
std::vector<Link> prologue_chain(const Graph& g, int i, const std::vector<bool>& taken) {
  std::vector<Link> links;
  const Node& node = g.nodes[static_cast<size_t>(i)];
  if (node.inputs.empty() || node.inputs[0] == kNoValue) return links;
  int reader = i;
  for (ValueId v = node.inputs[0]; links.size() < kMaxLinks;) {
    const Value& val = g.value(v);
    const Node& r = g.nodes[static_cast<size_t>(reader)];
    if (val.producer < 0 || taken[static_cast<size_t>(val.producer)] || val.consumers.size() != 1 ||
        std::count(r.inputs.begin(), r.inputs.end(), v) != 1 || is_graph_output(g, v))
      break;
    const Node& p = g.nodes[static_cast<size_t>(val.producer)];
    if (p.outputs.size() != 1) break;
    const auto through = std::find_if(p.inputs.begin(), p.inputs.end(), [&](ValueId u) {
      return u != kNoValue && !g.value(u).init && g.value(u).type == val.type;
    });
    if (through == p.inputs.end()) break;
    links.push_back({val.producer, static_cast<size_t>(through - p.inputs.begin())});
    reader = val.producer;
    v = *through;
  }
  return links;
}

// A link's node as its kernel sees it, and the input carrying the chain's tensor: an Add reading
// it as its input 1 comes with its operands swapped (they commute, bit for bit), reading it as
// input 0.
struct LinkView {
  Node node;
  size_t through;
};
LinkView link_view(const Graph& g, const Link& l) {
  LinkView v{g.nodes[static_cast<size_t>(l.node)], l.through};
  if (v.node.op_type == "Add" && v.node.domain.empty() && v.node.inputs.size() == 2 && l.through == 1) {
    std::swap(v.node.inputs[0], v.node.inputs[1]);
    v.through = 0;
  }
  return v;
}

// The inputs a chain adds to its kernel's run(): each link's but the chain's tensor, link by
// link.
std::vector<ValueId> link_inputs(const Graph& g, const std::vector<Link>& links) {
  std::vector<ValueId> in;
  for (const Link& l : links) {
    const LinkView v = link_view(g, l);
    for (size_t k = 0; k < v.node.inputs.size(); ++k)
      if (k != v.through) in.push_back(v.node.inputs[k]);
  }
  return in;
}

// The kernel of `spec` with the longest leading part of `links` the backend takes fused in through
// `next` (KernelSpec::epilogue or ::prologue); `links` is cut to that part (empty, and nullptr
// returned, when it takes none). spec_of makes a node's KernelSpec.
template <class SpecOf>
std::unique_ptr<Kernel> make_with_links(const Graph& g, const Backend& backend, KernelSpec spec,
                                        std::vector<Link>& links, const KernelSpec* KernelSpec::*next,
                                        const SpecOf& spec_of) {
  std::vector<LinkView> views;
  for (const Link& l : links) views.push_back(link_view(g, l));
  std::vector<KernelSpec> specs;
  specs.reserve(views.size());
  for (const LinkView& v : views) {
    specs.push_back(spec_of(v.node));
    specs.back().through = v.through;
  }
  for (size_t len = links.size(); len > 0; --len) {
    for (size_t k = 0; k < len; ++k) specs[k].*next = k + 1 < len ? &specs[k + 1] : nullptr;
    spec.*next = &specs[0];
    if (std::unique_ptr<Kernel> kernel = backend.create_kernel(spec)) {
      links.resize(len);
      return kernel;
    }
  }
  links.clear();
  return nullptr;
}

}  // namespace

StageProgram::StageProgram(const Graph& g, Backend& backend, ProgramUse use, ArenaFrom arena)
    : graph_(g), backend_(backend) {
  const int n = static_cast<int>(g.nodes.size());
  steps_.resize(static_cast<size_t>(n));
  // Per value, true where stored channels-last; empty when every tensor is plain.
  const std::vector<bool> channels_last =
      use == ProgramUse::kInference && backend.channels_last_convs()
          ? channels_last_values(g)
          : std::vector<bool>{};
  const auto stored_channels_last = [&](ValueId v) {
    return v != kNoValue && static_cast<size_t>(v) < channels_last.size() && channels_last[static_cast<size_t>(v)];
  };
  const auto spec_of = [&](const Node& node) {
    KernelSpec spec{g, node, {}, {}, backend.cpu_context(), {}, {}, use == ProgramUse::kInference};
    spec.exact_fusion = use == ProgramUse::kTraining;
    for (ValueId v : node.inputs) {
      spec.inputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
      spec.channels_last_in.push_back(stored_channels_last(v));
    }
    for (ValueId v : node.outputs) {
      spec.outputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
      spec.channels_last_out.push_back(stored_channels_last(v));
    }
    return spec;
  };
  // Neighbours fused into a kernel where it takes them (one pass over the tensor fewer each):
  // the lone readers of its output as its epilogue, the producers of its input 0 as its prologue
  // (KernelSpec::epilogue, ::prologue). A fused node runs nothing, and its output shares the
  // tensor it read: the one its fusing kernel writes (an epilogue), or the one the chain starts
  // from (a prologue, a tensor only the chain reads past it). In a training program a kernel
  // takes only what it computes to the unfused bits (KernelSpec::exact_fusion).
  const bool fuse = backend.fuses_epilogues();
  std::vector<std::vector<Link>> epilogues(static_cast<size_t>(n)), prologues(static_cast<size_t>(n));
  std::vector<bool> taken(static_cast<size_t>(n), false);  // fused into a chain, or fusing one
  // Per fused node, the tensor it read, whose memory its output shares; per value, the last node
  // reading it past its consumers: a prologue link's operand, which the fusing kernel reads when
  // it runs.
  ArenaHints hints{std::vector<ValueId>(static_cast<size_t>(n), kNoValue), std::vector<int>(g.values.size(), -1)};
  std::vector<ValueId>& fused_tensor = hints.fused_tensor;
  std::vector<int>& read_until = hints.read_until;
  const auto no_kernel = [&](const Node& node, const KernelSpec& spec) {
    return UserError(node.label() + " in graph '" + g.name + "'", backend.supports(spec),
                     std::string("run it on another backend or replace the op; `pipetrain ops` "
                                 "lists what the ") + backend.name() + " backend takes");
  };
  for (int i = 0; fuse && i < n; ++i) {
    std::vector<Link> links = prologue_chain(g, i, taken);
    if (links.empty()) continue;
    const Node& node = g.nodes[static_cast<size_t>(i)];
    steps_[static_cast<size_t>(i)].kernel =
        make_with_links(g, backend, spec_of(node), links, &KernelSpec::prologue, spec_of);
    if (links.empty()) continue;
    taken[static_cast<size_t>(i)] = true;
    for (const Link& l : links) {
      taken[static_cast<size_t>(l.node)] = true;
      fused_tensor[static_cast<size_t>(l.node)] = g.nodes[static_cast<size_t>(l.node)].inputs[l.through];
    }
    for (ValueId u : link_inputs(g, links))
      if (u != kNoValue) read_until[static_cast<size_t>(u)] = i;
    prologues[static_cast<size_t>(i)] = std::move(links);
  }
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[static_cast<size_t>(i)];
    Step& step = steps_[static_cast<size_t>(i)];
    if (fused_tensor[static_cast<size_t>(i)] != kNoValue || step.kernel) continue;
    const KernelSpec spec = spec_of(node);
    std::vector<Link> links = fuse ? epilogue_chain(g, i, taken) : std::vector<Link>{};
    if (!links.empty()) step.kernel = make_with_links(g, backend, spec, links, &KernelSpec::epilogue, spec_of);
    ValueId read = node.outputs.empty() ? kNoValue : node.outputs[0];
    for (const Link& l : links) {
      taken[static_cast<size_t>(l.node)] = true;
      fused_tensor[static_cast<size_t>(l.node)] = read;
      read = g.nodes[static_cast<size_t>(l.node)].outputs[0];
    }
    epilogues[static_cast<size_t>(i)] = std::move(links);
    if (!step.kernel) step.kernel = backend.create_kernel(spec);
    if (!step.kernel) throw no_kernel(node, spec);
  }
  // A buffer per tensor (core/graph_arena.h: views and fused nodes share theirs and run nothing).
  layout_ = graph_arena(g, hints);
  for (int i = 0; i < n; ++i) {
    Step& step = steps_[static_cast<size_t>(i)];
    step.aliased = layout_.aliased[static_cast<size_t>(i)];
    PT_CHECK(step.aliased || fused_tensor[static_cast<size_t>(i)] == kNoValue,
             g.nodes[static_cast<size_t>(i)].label() + " was fused but keeps its own output");
    // A node's arguments: its inputs (input 0 the tensor its prologue starts from, which the
    // fused nodes' outputs share), then those of its epilogue's links and its prologue's past
    // the chain's tensor (KernelSpec::epilogue, ::prologue).
    step.args = g.nodes[static_cast<size_t>(i)].inputs;
    for (const auto* chain : {&epilogues[static_cast<size_t>(i)], &prologues[static_cast<size_t>(i)]}) {
      const std::vector<ValueId> more = link_inputs(g, *chain);
      step.args.insert(step.args.end(), more.begin(), more.end());
    }
  }
  if (arena == ArenaFrom::kOwn) {
    plan_arena({});
    allocate();
  }
}

void StageProgram::plan_arena(const std::vector<char>& always_placed) {
  PT_CHECK(arena_ == nullptr, "the arena is planned before it is allocated");
  always_placed_ = always_placed;
  always_placed_.resize(graph_.outputs.size(), 0);
  plan_ = layout_.plan(always_placed_);
  tensor_bytes_ = plan_.arena_bytes;
  // Kernel scratch, around the tensors (which keep the layout the graph alone gives).
  std::vector<BufferLife> scratch;
  scratch_buffer_.assign(steps_.size(), -1);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& step = steps_[i];
    if (!step.kernel || step.aliased || step.kernel->scratch_bytes() == 0) continue;
    scratch_buffer_[i] = static_cast<int>(plan_.buffers.size() + scratch.size());
    scratch.push_back({graph_.nodes[i].name + ":scratch", static_cast<int64_t>(step.kernel->scratch_bytes()),
                       static_cast<int>(i), static_cast<int>(i)});
  }
  add_buffers(plan_, std::move(scratch));
  planned_ = true;
}

void StageProgram::allocate(std::byte* shared) {
  PT_CHECK(planned_ && arena_ == nullptr, "an arena is allocated once, after it is planned");
  const Graph& g = graph_;
  if (shared) {
    arena_ = shared;
  } else {
    // Host memory on the CPU backend; device memory on a device backend (Backend's memory hooks).
    arena_ = static_cast<std::byte*>(backend_.allocate(
        static_cast<size_t>(std::max<int64_t>(plan_.arena_bytes, kArenaAlignment))));
    own_arena_ = true;
  }
  if (arena_ == nullptr)
    throw UserError(g.name.empty() ? "the model" : g.name,
                    "needs " + format_bytes(plan_.arena_bytes) + " of " + backend_.name() +
                        " memory for its tensors, more than can be allocated",
                    "lower dims.batch or the model's declared sizes, or cut it into more stages");
  // Per graph output placed on every run, its buffer (which has no room in the arena).
  std::vector<char> away(layout_.lives.size(), 0);
  for (size_t k = 0; k < g.outputs.size(); ++k)
    if (always_placed_[k]) away[static_cast<size_t>(layout_.output_buffer[k])] = 1;
  auto address = [&](ValueId v) -> void* {
    const Value& val = g.value(v);
    if (val.init) return const_cast<void*>(backend_.device_constant(*val.init));
    const int b = layout_.buffer[static_cast<size_t>(v)];
    if (b >= 0 && !away[static_cast<size_t>(b)]) return arena_ + plan_.offsets[static_cast<size_t>(b)];
    return nullptr;  // a graph input (patched by run()), or an output the caller places
  };
  input_uses_.resize(g.inputs.size());
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Node& node = g.nodes[i];
    Step& step = steps_[i];
    for (ValueId v : step.args) {
      if (v == kNoValue) {
        step.inputs.push_back({});
        continue;
      }
      const int in = g.value(v).init ? -1 : layout_.input[static_cast<size_t>(v)];
      if (in >= 0) input_uses_[static_cast<size_t>(in)].push_back({i, step.inputs.size()});
      step.inputs.push_back({address(v), &g.value(v).type});
    }
    for (ValueId v : node.outputs)
      step.outputs.push_back(v == kNoValue ? Buffer{} : Buffer{address(v), &g.value(v).type});
    if (scratch_buffer_[i] >= 0) step.scratch = arena_ + plan_.offsets[static_cast<size_t>(scratch_buffer_[i])];
  }
  for (ValueId v : g.outputs) {
    outputs_.push_back({address(v), &g.value(v).type});
    const int in = g.value(v).init ? -1 : layout_.input[static_cast<size_t>(v)];
    output_from_input_.push_back(static_cast<size_t>(in + 1));
  }
  // Every argument reading or writing a placeable output's buffer (the output's producer, its
  // readers, its views and theirs).
  std::map<int, size_t> output_of_buffer;  // buffer -> the placeable output k it holds
  for (size_t k = 0; k < g.outputs.size(); ++k)
    if (layout_.placeable[k]) output_of_buffer.emplace(layout_.output_buffer[k], k);
  output_sites_.resize(g.outputs.size());
  const auto site_of = [&](ValueId v) -> std::vector<Site>* {
    if (v == kNoValue || g.value(v).init) return nullptr;
    auto it = output_of_buffer.find(layout_.buffer[static_cast<size_t>(v)]);
    return it == output_of_buffer.end() ? nullptr : &output_sites_[it->second];
  };
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Node& node = g.nodes[i];
    const std::vector<ValueId>& in = steps_[i].args;
    for (size_t j = 0; j < in.size(); ++j)
      if (auto* sites = site_of(in[j])) sites->push_back({i, false, j});
    for (size_t j = 0; j < node.outputs.size(); ++j)
      if (auto* sites = site_of(node.outputs[j])) sites->push_back({i, true, j});
  }
  for (size_t k = 0; k < g.outputs.size(); ++k) output_home_.push_back(outputs_[k].data);
}

void StageProgram::place_output(size_t k, void* at) {
  PT_CHECK(placeable(k), "output " + graph_.value(graph_.outputs.at(k)).name + " cannot be placed");
  if (at == nullptr) at = output_home_[k];
  PT_CHECK(at != nullptr, "output " + graph_.value(graph_.outputs.at(k)).name +
                              " is placed on every run (plan_arena): it has no room in the arena");
  // Host tensors (a CPU accumulator is its gradient's host tensor) give malloc's alignment; the
  // kernels take any address aligned to their element, as they take the parameters' data.
  PT_CHECK(reinterpret_cast<uintptr_t>(at) % alignof(std::max_align_t) == 0, "a placed output must be aligned");
  if (outputs_[k].data == at) return;
  for (const Site& s : output_sites_[k])
    (s.output ? steps_[s.step].outputs : steps_[s.step].inputs)[s.slot].data = at;
  outputs_[k].data = at;
}

StageProgram::~StageProgram() {
  if (own_arena_) backend_.release(arena_);
}

void StageProgram::bind_inputs(std::span<const Buffer> inputs) {
  PT_CHECK(arena_ != nullptr, "a program runs once its arena is allocated");
  PT_CHECK(inputs.size() == graph_.inputs.size(), "program takes " + std::to_string(graph_.inputs.size()) + " inputs");
  for (size_t k = 0; k < inputs.size(); ++k) {
    PT_CHECK(inputs[k].type && *inputs[k].type == graph_.value(graph_.inputs[k]).type,
             "input " + graph_.value(graph_.inputs[k]).name + " has the wrong type");
    for (const auto& [step, slot] : input_uses_[k]) steps_[step].inputs[slot].data = inputs[k].data;
  }
  for (size_t k = 0; k < outputs_.size(); ++k) {
    if (output_from_input_[k]) outputs_[k].data = inputs[output_from_input_[k] - 1].data;
    PT_CHECK(outputs_[k].data || !always_placed_[k], "output " + graph_.value(graph_.outputs[k]).name +
                                                        " is placed on every run, and was not placed");
  }
  backend_.bind_thread();
}

void StageProgram::run(std::span<const Buffer> inputs) {
  if (profile_) return run_profiled(inputs, profile_);
  bind_inputs(inputs);
  for (Step& s : steps_)
    if (!s.aliased) s.kernel->run(s.inputs, s.outputs, s.scratch);
  backend_.synchronize();
}

void StageProgram::profile_into(std::vector<double>* seconds) {
  profile_ = seconds;
  if (seconds) seconds->resize(steps_.size());
}

void StageProgram::run_profiled(std::span<const Buffer> inputs, std::vector<double>* seconds) {
  bind_inputs(inputs);
  backend_.synchronize();  // the work queued before this program is not its own
  seconds->resize(steps_.size());
  for (size_t i = 0; i < steps_.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!steps_[i].aliased)
      steps_[i].kernel->run(steps_[i].inputs, steps_[i].outputs, steps_[i].scratch);
    backend_.synchronize();
    (*seconds)[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

bool StageProgram::runs_nothing(size_t i) const { return steps_.at(i).aliased; }

Buffer StageProgram::output(size_t k) const { return outputs_.at(k); }

int64_t StageProgram::measure_peak_bytes(std::span<const Buffer> inputs) {
  const size_t bytes = static_cast<size_t>(plan_.arena_bytes);
  backend_.fill(arena_, kMarker, bytes);
  run(inputs);
  std::vector<unsigned char> seen(bytes);  // the arena as the host sees it
  backend_.copy(seen.data(), arena_, bytes);
  int64_t top = plan_.arena_bytes;
  while (top > 0 && seen[static_cast<size_t>(top - 1)] == kMarker) --top;
  // The top buffer's alignment padding is never written: round up as the plan does.
  return (top + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

}  // namespace pt
