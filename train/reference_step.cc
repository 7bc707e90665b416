#include "train/reference_step.h"

#include <cmath>
#include <cstring>
#include <set>
#include <tuple>

#include "autodiff/loss.h"
#include "core/error.h"
#include "exec/stage_program.h"
#include "train/comm.h"

namespace pt {

namespace {

// The graph with every float node output among its outputs too (watch mode).
Graph watched(const Graph& g) {
  Graph out = g;
  std::set<ValueId> have(out.outputs.begin(), out.outputs.end());
  for (const Node& n : out.nodes)
    for (ValueId v : n.outputs)
      if (v != kNoValue && out.value(v).type.dtype == DType::kFloat32 && have.insert(v).second) out.outputs.push_back(v);
  return out;
}

}  // namespace

struct ReferenceStep::Chunk {
  const BackwardGraphs& graphs;
  Graph fg, bg, wg;  // the graphs run: graphs' own, or watched() copies
  StageProgram f, b, w;
  Chunk(const BackwardGraphs& g, Backend& backend, bool watch)
      : graphs(g),
        fg(watch ? watched(g.forward) : g.forward),
        bg(watch ? watched(g.backward_input) : g.backward_input),
        wg(watch ? watched(g.backward_weight) : g.backward_weight),
        f(fg, backend),
        b(bg, backend),
        w(wg, backend) {}
};

namespace {

using Store = std::map<std::string, Tensor>;

Tensor copy_out(const Buffer& b) {
  Tensor t;
  t.type = *b.type;
  const auto* p = static_cast<const std::byte*>(b.data);
  t.data.assign(p, p + b.type->bytes());
  return t;
}

// Runs `program` on `g`, reading each input by name from `store`, then stores every output.
void run(StageProgram& program, const Graph& g, Store& store) {
  std::vector<Buffer> in;
  for (ValueId v : g.inputs) {
    const Value& val = g.value(v);
    auto it = store.find(val.name);
    PT_CHECK(it != store.end(), g.name + " needs '" + val.name + "', which nothing made");
    PT_CHECK(it->second.type == val.type, g.name + ": '" + val.name + "' is " +
                                              it->second.type.str() + ", expected " + val.type.str());
    in.push_back({it->second.data.data(), &val.type});
  }
  program.run(in);
  for (size_t k = 0; k < g.outputs.size(); ++k)
    store[g.value(g.outputs[k]).name] = copy_out(program.output(k));
}

enum class PassKind { kForward, kInput, kWeight };

}  // namespace

// One pass of a micro-batch (a chunk's F, B or W) and, cut across processes, the tensors it
// takes from other processes before it runs and gives them after.
struct ReferenceStep::Pass {
  size_t chunk = 0;
  PassKind kind = PassKind::kForward;
  int device = 0;
  bool local = true;
  struct Message {
    std::string name;
    int device;  // the other end
    TensorType type;
  };
  std::vector<Message> receive, send;
};

namespace {

const Graph& graph_of(const BackwardGraphs& g, PassKind k) {
  return k == PassKind::kForward ? g.forward : k == PassKind::kInput ? g.backward_input : g.backward_weight;
}

constexpr const char* kMessagePrefix = "reference/";

// The names a pass reads from the tensors made before it: its graph's inputs, B's output
// gradients by the name the later chunk made them under (made: what the passes so far made).
template <class Made>
std::vector<std::string> reads(const BackwardGraphs& g, PassKind k, const Made& made) {
  const Graph& graph = graph_of(g, k);
  std::vector<std::string> out;
  for (ValueId v : graph.inputs) out.push_back(graph.value(v).name);
  if (k == PassKind::kInput)
    for (size_t i = 0; i < g.output_grads.size(); ++i)
      if (const std::string from = grad_name(g.output_grad_of[i]); g.output_grads[i] != from && made.count(from))
        out.push_back(from);
  return out;
}

}  // namespace

// The passes in one process's order; with a cut, which are this process's, and each tensor made
// on one process and read on another sent once per reading process, right after it is made.
std::vector<ReferenceStep::Pass> ReferenceStep::plan_passes(const std::vector<BackwardGraphs>& chunks, const ReferenceCut* cut) {
  std::vector<Pass> passes;
  const auto add = [&](size_t c, PassKind k) {
    Pass p;
    p.chunk = c;
    p.kind = k;
    p.device = cut ? cut->device_of_chunk.at(c) : 0;
    p.local = !cut || cut->rank_of_device.at(static_cast<size_t>(p.device)) == cut->rank;
    passes.push_back(std::move(p));
  };
  for (size_t c = 0; c < chunks.size(); ++c) add(c, PassKind::kForward);
  for (size_t c = chunks.size(); c-- > 0;) {
    add(c, PassKind::kInput);
    add(c, PassKind::kWeight);
  }
  if (!cut) return passes;
  const auto rank_of = [&](int device) { return cut->rank_of_device.at(static_cast<size_t>(device)); };
  struct Made {
    size_t pass;
    TensorType type;
  };
  std::map<std::string, Made> made;
  std::set<std::tuple<std::string, size_t, int>> delivered;  // (name, made by pass, to rank)
  for (size_t k = 0; k < passes.size(); ++k) {
    Pass& p = passes[k];
    const BackwardGraphs& g = chunks[p.chunk];
    for (const std::string& name : reads(g, p.kind, made)) {
      auto it = made.find(name);
      if (it == made.end()) continue;  // a feed, a gradient accumulator: this process's own
      Pass& maker = passes[it->second.pass];
      if (rank_of(maker.device) == rank_of(p.device) || !delivered.insert({name, it->second.pass, rank_of(p.device)}).second)
        continue;
      maker.send.push_back({name, p.device, it->second.type});
      p.receive.push_back({name, maker.device, it->second.type});
    }
    const Graph& graph = graph_of(g, p.kind);
    for (ValueId v : graph.outputs) made[graph.value(v).name] = {k, graph.value(v).type};
  }
  return passes;
}

std::vector<std::string> ReferenceStep::message_names(const std::vector<BackwardGraphs>& chunks, const ReferenceCut& cut) {
  std::set<std::string> names;
  for (const Pass& p : plan_passes(chunks, &cut))
    for (const Pass::Message& m : p.send) names.insert(kMessagePrefix + m.name);
  return {names.begin(), names.end()};
}

ReferenceStep::ReferenceStep(const std::vector<BackwardGraphs>& chunks, Backend& backend, bool watch, const ReferenceCut* cut)
    : passes_(plan_passes(chunks, cut)), comm_(cut ? cut->comm : nullptr), watch_(watch) {
  std::vector<bool> local(chunks.size(), false);
  for (const Pass& p : passes_) local[p.chunk] = p.local;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const BackwardGraphs& g = chunks[c];
    if (!local[c]) {
      chunks_.push_back(nullptr);  // another process's: nothing of it here
      continue;
    }
    chunks_.push_back(std::make_unique<Chunk>(g, backend, watch));
    const Graph& w = g.backward_weight;
    for (const std::string& p : g.params) {
      const ValueId acc = w.find(grad_acc_name(p));
      PT_CHECK(acc != kNoValue, "W graph lacks " + grad_acc_name(p));
      Tensor zero;
      zero.type = w.value(acc).type;
      zero.data.assign(static_cast<size_t>(zero.type.bytes()), std::byte{0});
      grads_[p] = std::move(zero);
    }
  }
  kept_bytes_.assign(chunks.size(), 0);
}

ReferenceStep::~ReferenceStep() = default;

void ReferenceStep::run_micro_batch(const std::map<std::string, Tensor>& feeds) {
  Store store = feeds;
  for (size_t k = 0; k < passes_.size(); ++k) {
    const Pass& p = passes_[k];
    if (!p.local) continue;
    for (const Pass::Message& m : p.receive) {
      Tensor& t = store[m.name];
      t.type = m.type;
      t.data.resize(static_cast<size_t>(m.type.bytes()));
      comm_->recv(kMessagePrefix + m.name, 0, m.device, p.device, t.data.data(), t.data.size());
    }
    Chunk& ch = *chunks_[p.chunk];
    const size_t c = p.chunk;
    const int64_t at = micro_batches_ * static_cast<int64_t>(passes_.size()) + static_cast<int64_t>(k);
    if (p.kind == PassKind::kForward) {
      run(ch.f, ch.fg, store);
      if (watch_) check(ch.fg, c, "forward", store, at);
      kept_bytes_[c] = 0;
      for (const std::string& name : ch.graphs.kept) kept_bytes_[c] += store.at(name).type.bytes();
      if (c + 1 == chunks_.size() && ch.graphs.forward.find(kLossOutput) != kNoValue)
        loss_ += static_cast<double>(*store.at(kLossOutput).as<float>());
    } else if (p.kind == PassKind::kInput) {
      // The next chunk's grad.<y> feeds this chunk's grad.<y>@next (a tensor passed through).
      for (size_t i = 0; i < ch.graphs.output_grads.size(); ++i) {
        const std::string from = grad_name(ch.graphs.output_grad_of[i]);
        if (ch.graphs.output_grads[i] != from && store.count(from)) store[ch.graphs.output_grads[i]] = store.at(from);
      }
      run(ch.b, ch.bg, store);
      if (watch_) check(ch.bg, c, "input gradient", store, at);
    } else {
      for (const std::string& name : ch.graphs.params) store[grad_acc_name(name)] = grads_.at(name);
      run(ch.w, ch.wg, store);
      if (watch_) check(ch.wg, c, "weight gradient", store, at);
      for (const std::string& name : ch.graphs.params) grads_[name] = std::move(store.at(grad_name(name)));
    }
    for (const Pass::Message& m : p.send) {
      const Tensor& t = store.at(m.name);
      comm_->send(kMessagePrefix + m.name, 0, p.device, m.device, t.data.data(), t.data.size());
    }
  }
  ++micro_batches_;
}

void ReferenceStep::check(const Graph& g, size_t chunk, const char* pass, const std::map<std::string, Tensor>& store,
                          int64_t at) {
  if (found_) return;
  for (const Node& n : g.nodes)
    for (ValueId v : n.outputs) {
      if (v == kNoValue || g.value(v).type.dtype != DType::kFloat32) continue;
      auto it = store.find(g.value(v).name);
      if (it == store.end()) continue;
      const float* x = it->second.as<float>();
      for (int64_t i = 0; i < it->second.type.numel(); ++i)
        if (!std::isfinite(x[i])) {
          found_ = NonFinite{chunk, pass, n.name, n.op_type, g.value(v).name, std::isnan(x[i]) ? "nan" : "inf"};
          found_at_ = at;
          return;
        }
    }
}

}  // namespace pt
