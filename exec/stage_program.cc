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
#include "exec/channels_last.h"

namespace pt {

struct StageProgram::Step {
  std::unique_ptr<Kernel> kernel;
  std::vector<Buffer> inputs, outputs;
  void* scratch = nullptr;
  bool aliased = false;  // a view whose output shares its input's buffer: nothing to run
};

namespace {

constexpr unsigned char kMarker = 0xA5;

// Where a value lives: an arena buffer (index into the plan), a graph input, or constant data.
struct Location {
  int buffer = -1;
  int input = -1;
  const Tensor* constant = nullptr;
};

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

// The chain offered to node i as its epilogue: its output's lone reader, reading it once, of the
// output's type, with one output of its own and its other inputs made before node i (the fused
// kernel reads them when node i runs), then that output's lone reader, and so on; no tensor of
// the chain is a graph output, no link taken by another chain. Which links a kernel applies is
// the backend's to say.
std::vector<Link> epilogue_chain(const Graph& g, int i, const std::vector<bool>& taken) {
  std::vector<Link> links;
  for (int at = i; links.size() < kMaxLinks;) {
    const Node& node = g.nodes[static_cast<size_t>(at)];
    if (node.outputs.size() != 1 || node.outputs[0] == kNoValue) break;
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

StageProgram::StageProgram(const Graph& g, Backend& backend, ProgramUse use) : graph_(g), backend_(backend) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<Location> where(g.values.size());
  for (size_t k = 0; k < g.inputs.size(); ++k) where[static_cast<size_t>(g.inputs[k])].input = static_cast<int>(k);
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].init) where[v].constant = g.values[v].init.get();

  // Kernels, and a buffer per intermediate value and per kernel scratch.
  std::vector<BufferLife> lives;
  std::vector<int> scratch_buffer(static_cast<size_t>(n), -1);
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
  // Per fused node, the tensor it read, whose memory its output shares.
  std::vector<ValueId> fused_tensor(static_cast<size_t>(n), kNoValue);
  // Per value, the last node reading it past its consumers: a prologue link's operand, which the
  // fusing kernel reads when it runs.
  std::vector<int> read_until(g.values.size(), -1);
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
    const bool absorbed = fused_tensor[static_cast<size_t>(i)] != kNoValue;
    if (!absorbed && !step.kernel) {
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
    // A view (Graph::moves_no_bytes: also a global average pool over one pixel) of an arena
    // buffer is that buffer, live until the view's last reader too. A view of a graph input is
    // that input, unless it is a graph output itself (outputs stay the program's own memory,
    // valid until the next run, whatever the caller does with its inputs).
    // An absorbed epilogue's output is the tensor it fused, which its producer wrote already.
    ValueId shared = fused_tensor[static_cast<size_t>(i)];
    if (g.moves_no_bytes(node) && !node.inputs.empty()) shared = node.inputs[0];
    const Location* viewed = shared != kNoValue ? &where[static_cast<size_t>(shared)] : nullptr;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const ValueId v = node.outputs[k];
      if (v == kNoValue || where[static_cast<size_t>(v)].constant) continue;
      const Value& val = g.value(v);
      int last = std::max(i, read_until[static_cast<size_t>(v)]);
      if (!val.consumers.empty()) last = std::max(last, val.consumers.back());
      for (ValueId o : g.outputs)
        if (o == v) last = n;
      const bool same_bytes = k == 0 && viewed && g.value(shared).type.bytes() == val.type.bytes();
      if (same_bytes && viewed->buffer >= 0) {
        where[static_cast<size_t>(v)].buffer = viewed->buffer;
        BufferLife& life = lives[static_cast<size_t>(viewed->buffer)];
        life.last = std::max(life.last, last);
        step.aliased = true;
        continue;
      }
      if (same_bytes && viewed->input >= 0 && last < n) {
        where[static_cast<size_t>(v)].input = viewed->input;
        step.aliased = true;
        continue;
      }
      where[static_cast<size_t>(v)].buffer = static_cast<int>(lives.size());
      lives.push_back({val.name, val.type.bytes(), i, last});
    }
    PT_CHECK(step.aliased || !absorbed, node.label() + " was fused but keeps its own output");
    if (step.kernel && step.kernel->scratch_bytes() > 0) {
      scratch_buffer[static_cast<size_t>(i)] = static_cast<int>(lives.size());
      lives.push_back({node.name + ":scratch", static_cast<int64_t>(step.kernel->scratch_bytes()), i, i});
    }
  }
  plan_ = plan_memory(std::move(lives));
  // Host memory on the CPU backend; device memory on a device backend (Backend's memory hooks).
  arena_ = static_cast<std::byte*>(backend.allocate(
      static_cast<size_t>(std::max<int64_t>(plan_.arena_bytes, kArenaAlignment))));
  if (arena_ == nullptr)
    throw UserError(g.name.empty() ? "the model" : g.name,
                    "needs " + format_bytes(plan_.arena_bytes) + " of " + backend.name() +
                        " memory for its tensors, more than can be allocated",
                    "lower dims.batch or the model's declared sizes, or cut it into more stages");

  auto address = [&](ValueId v) -> void* {
    const Location& l = where[static_cast<size_t>(v)];
    if (l.constant) return const_cast<void*>(backend.device_constant(*l.constant));
    if (l.buffer >= 0) return arena_ + plan_.offsets[static_cast<size_t>(l.buffer)];
    return nullptr;  // a graph input: patched by run()
  };
  input_uses_.resize(g.inputs.size());
  // A node's arguments: its inputs (input 0 the tensor its prologue starts from, which the fused
  // nodes' outputs share), then those of its epilogue's links and its prologue's past the chain's
  // tensor (KernelSpec::epilogue, ::prologue).
  const auto arguments = [&](int i) {
    std::vector<ValueId> in = g.nodes[static_cast<size_t>(i)].inputs;
    for (const auto* chain : {&epilogues[static_cast<size_t>(i)], &prologues[static_cast<size_t>(i)]}) {
      const std::vector<ValueId> more = link_inputs(g, *chain);
      in.insert(in.end(), more.begin(), more.end());
    }
    return in;
  };
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[static_cast<size_t>(i)];
    Step& step = steps_[static_cast<size_t>(i)];
    for (ValueId v : arguments(i)) {
      if (v == kNoValue) {
        step.inputs.push_back({});
        continue;
      }
      const int in = where[static_cast<size_t>(v)].input;
      if (in >= 0) input_uses_[static_cast<size_t>(in)].push_back({static_cast<size_t>(i), step.inputs.size()});
      step.inputs.push_back({address(v), &g.value(v).type});
    }
    for (ValueId v : node.outputs)
      step.outputs.push_back(v == kNoValue ? Buffer{} : Buffer{address(v), &g.value(v).type});
    if (scratch_buffer[static_cast<size_t>(i)] >= 0)
      step.scratch = arena_ + plan_.offsets[static_cast<size_t>(scratch_buffer[static_cast<size_t>(i)])];
  }
  for (ValueId v : g.outputs) {
    outputs_.push_back({address(v), &g.value(v).type});
    output_from_input_.push_back(static_cast<size_t>(where[static_cast<size_t>(v)].input + 1));
  }
  // The arena buffers that hold exactly one graph output, and every argument reading or writing
  // them (the output's producer, its readers, its views and theirs).
  std::map<int, int> output_of_buffer;  // buffer -> output k, or -1 where two outputs share it
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    const Location& l = where[static_cast<size_t>(g.outputs[k])];
    if (l.buffer < 0 || l.constant) continue;
    auto [it, fresh] = output_of_buffer.emplace(l.buffer, static_cast<int>(k));
    if (!fresh) it->second = -1;
  }
  output_sites_.resize(g.outputs.size());
  output_home_.resize(g.outputs.size());
  const auto site_of = [&](ValueId v) -> std::vector<Site>* {
    if (v == kNoValue || where[static_cast<size_t>(v)].constant) return nullptr;
    auto it = output_of_buffer.find(where[static_cast<size_t>(v)].buffer);
    return it == output_of_buffer.end() || it->second < 0 ? nullptr : &output_sites_[static_cast<size_t>(it->second)];
  };
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Node& node = g.nodes[i];
    const std::vector<ValueId> in = arguments(static_cast<int>(i));
    for (size_t j = 0; j < in.size(); ++j)
      if (auto* sites = site_of(in[j])) sites->push_back({i, false, j});
    for (size_t j = 0; j < node.outputs.size(); ++j)
      if (auto* sites = site_of(node.outputs[j])) sites->push_back({i, true, j});
  }
  for (size_t k = 0; k < g.outputs.size(); ++k) output_home_[k] = outputs_[k].data;
}

void StageProgram::place_output(size_t k, void* at) {
  PT_CHECK(placeable(k), "output " + graph_.value(graph_.outputs.at(k)).name + " cannot be placed");
  if (at == nullptr) at = output_home_[k];
  // Host tensors (a CPU accumulator is its gradient's host tensor) give malloc's alignment; the
  // kernels take any address aligned to their element, as they take the parameters' data.
  PT_CHECK(reinterpret_cast<uintptr_t>(at) % alignof(std::max_align_t) == 0, "a placed output must be aligned");
  if (outputs_[k].data == at) return;
  for (const Site& s : output_sites_[k])
    (s.output ? steps_[s.step].outputs : steps_[s.step].inputs)[s.slot].data = at;
  outputs_[k].data = at;
}

StageProgram::~StageProgram() { backend_.release(arena_); }

void StageProgram::bind_inputs(std::span<const Buffer> inputs) {
  PT_CHECK(inputs.size() == graph_.inputs.size(), "program takes " + std::to_string(graph_.inputs.size()) + " inputs");
  for (size_t k = 0; k < inputs.size(); ++k) {
    PT_CHECK(inputs[k].type && *inputs[k].type == graph_.value(graph_.inputs[k]).type,
             "input " + graph_.value(graph_.inputs[k]).name + " has the wrong type");
    for (const auto& [step, slot] : input_uses_[k]) steps_[step].inputs[slot].data = inputs[k].data;
  }
  for (size_t k = 0; k < outputs_.size(); ++k)
    if (output_from_input_[k]) outputs_[k].data = inputs[output_from_input_[k] - 1].data;
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
