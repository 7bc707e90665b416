#include "train/reference_step.h"

#include <cmath>
#include <cstring>
#include <set>

#include "autodiff/loss.h"
#include "core/error.h"
#include "exec/stage_program.h"

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

}  // namespace

ReferenceStep::ReferenceStep(const std::vector<BackwardGraphs>& chunks, Backend& backend, bool watch) : watch_(watch) {
  for (const BackwardGraphs& g : chunks) {
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
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Chunk& ch = *chunks_[c];
    run(ch.f, ch.fg, store);
    if (watch_) check(ch.fg, c, "forward", store);
    kept_bytes_[c] = 0;
    for (const std::string& k : ch.graphs.kept) kept_bytes_[c] += store.at(k).type.bytes();
  }
  const Chunk& last = *chunks_.back();
  if (last.graphs.forward.find(kLossOutput) != kNoValue)
    loss_ += static_cast<double>(*store.at(kLossOutput).as<float>());
  for (size_t c = chunks_.size(); c-- > 0;) {
    Chunk& ch = *chunks_[c];
    // The next chunk's grad.<y> feeds this chunk's grad.<y>@next (a tensor passed through).
    for (size_t i = 0; i < ch.graphs.output_grads.size(); ++i) {
      const std::string from = grad_name(ch.graphs.output_grad_of[i]);
      if (ch.graphs.output_grads[i] != from && store.count(from)) store[ch.graphs.output_grads[i]] = store.at(from);
    }
    run(ch.b, ch.bg, store);
    if (watch_) check(ch.bg, c, "input gradient", store);
    for (const std::string& p : ch.graphs.params) store[grad_acc_name(p)] = grads_.at(p);
    run(ch.w, ch.wg, store);
    if (watch_) check(ch.wg, c, "weight gradient", store);
    for (const std::string& p : ch.graphs.params) grads_[p] = std::move(store.at(grad_name(p)));
  }
}

void ReferenceStep::check(const Graph& g, size_t chunk, const char* pass, const std::map<std::string, Tensor>& store) {
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
          return;
        }
    }
}

}  // namespace pt
