#include "exec/stage_program.h"

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

// The node that could run as node i's epilogue (KernelSpec::epilogue): the only reader of i's
// only output, which is not a graph output, reading it once, as its input 0 or as either operand
// of an Add. -1 when there is none. Which readers a kernel can apply is the backend's to say.
int epilogue_candidate(const Graph& g, int i) {
  const Node& node = g.nodes[static_cast<size_t>(i)];
  if (node.outputs.size() != 1 || node.outputs[0] == kNoValue) return -1;
  const ValueId y = node.outputs[0];
  const Value& val = g.value(y);
  if (val.consumers.size() != 1 || std::find(g.outputs.begin(), g.outputs.end(), y) != g.outputs.end()) return -1;
  const int c = val.consumers[0];
  const Node& reader = g.nodes[static_cast<size_t>(c)];
  const bool add = reader.op_type == "Add" && reader.domain.empty() && reader.inputs.size() == 2;
  if (reader.inputs.empty() || (reader.inputs[0] != y && !(add && reader.inputs[1] == y)) ||
      std::count(reader.inputs.begin(), reader.inputs.end(), y) != 1)
    return -1;
  return c;
}

// Node e, the epilogue of a node whose output is y, as its kernel sees it: reading y as input 0
// (an Add reading it as input 1 has its operands swapped: they commute, bit for bit).
Node epilogue_node(const Graph& g, int e, ValueId y) {
  Node reader = g.nodes[static_cast<size_t>(e)];
  if (reader.inputs[0] != y) std::swap(reader.inputs[0], reader.inputs[1]);
  return reader;
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
  // A node's lone reader goes to its kernel as an epilogue where the kernel takes it (one pass
  // over the tensor fewer); the reader then runs nothing and its output is the producer's.
  // Inference programs offer any reader; training programs only an Add (a product's bias or a
  // summed tensor, which the kernel adds to the same bits), so that an activation runs on its own
  // kernel there as in every program that splits it from its producer.
  const bool fuse = backend.fuses_epilogues();
  std::vector<int> epilogue_of(static_cast<size_t>(n), -1);
  // Per absorbed epilogue, the tensor it read, which its producer now writes in its place.
  std::vector<ValueId> fused_tensor(static_cast<size_t>(n), kNoValue);
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[static_cast<size_t>(i)];
    Step& step = steps_[static_cast<size_t>(i)];
    const bool absorbed = fused_tensor[static_cast<size_t>(i)] != kNoValue;
    if (!absorbed) {
      KernelSpec spec = spec_of(node);
      const int e = fuse ? epilogue_candidate(g, i) : -1;
      if (e >= 0 && (use == ProgramUse::kInference || g.nodes[static_cast<size_t>(e)].op_type == "Add")) {
        const Node reader = epilogue_node(g, e, node.outputs[0]);
        const KernelSpec epilogue = spec_of(reader);
        spec.epilogue = &epilogue;
        step.kernel = backend.create_kernel(spec);
        spec.epilogue = nullptr;
        if (step.kernel) {
          epilogue_of[static_cast<size_t>(i)] = e;
          fused_tensor[static_cast<size_t>(e)] = node.outputs[0];
        }
      }
      if (!step.kernel) step.kernel = backend.create_kernel(spec);
      if (!step.kernel)
        throw UserError(node.label() + " in graph '" + g.name + "'", backend.supports(spec),
                        std::string("run it on another backend or replace the op; `pipetrain ops` "
                                    "lists what the ") + backend.name() + " backend takes");
    }
    // A view of an arena buffer is that buffer, live until the view's last reader too. A view of
    // a graph input is that input, unless it is a graph output itself (outputs stay the
    // program's own memory, valid until the next run, whatever the caller does with its inputs).
    // An absorbed epilogue's output is the tensor it fused, which its producer wrote already.
    ValueId shared = fused_tensor[static_cast<size_t>(i)];
    if (node.is_view() && !node.inputs.empty()) shared = node.inputs[0];
    const Location* viewed = shared != kNoValue ? &where[static_cast<size_t>(shared)] : nullptr;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const ValueId v = node.outputs[k];
      if (v == kNoValue || where[static_cast<size_t>(v)].constant) continue;
      const Value& val = g.value(v);
      int last = i;
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
  // A node's arguments: its inputs, then those of the epilogue it applies past the tensor it
  // fuses (KernelSpec::epilogue).
  const auto arguments = [&](int i) {
    std::vector<ValueId> in = g.nodes[static_cast<size_t>(i)].inputs;
    if (const int e = epilogue_of[static_cast<size_t>(i)]; e >= 0) {
      const std::vector<ValueId> more = epilogue_node(g, e, g.nodes[static_cast<size_t>(i)].outputs[0]).inputs;
      in.insert(in.end(), more.begin() + 1, more.end());
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
  PT_CHECK(reinterpret_cast<uintptr_t>(at) % kArenaAlignment == 0, "a placed output must be aligned");
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
