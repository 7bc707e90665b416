#include <algorithm>
#include <map>
#include <set>

#include "autodiff/loss.h"
#include "train/executor.h"
#include "train/executor_slots.h"
#include "schedule/validate.h"

namespace pt {
using namespace exec_detail;

namespace {

// Inputs of F: the previous chunk's outputs (its kOut slot on the same device, else our kRecvIn
// slot), the rest from the feeds. Outputs: chunk outputs to kOut, kept to kKeptB / kKeptW.
template <class ChunkT>
void plan_forward(std::vector<std::unique_ptr<ChunkT>>& chunks, ChunkT& c, bool last,
                  const std::vector<std::string>& side, std::vector<const TensorType*>& side_type) {
  const Graph& f = c.g.forward;
  ChunkT* prev = c.index > 0 ? chunks[static_cast<size_t>(c.index - 1)].get() : nullptr;
  for (ValueId v : f.inputs) {
    const Value& val = f.value(v);
    Source s;
    const int e = prev ? prev->groups[kOut].find(val.name) : -1;
    if (e >= 0 && prev->device == c.device) {
      s = {Source::kSlot, prev->index, kOut, e};
    } else if (e >= 0) {
      PT_CHECK(prev->groups[kOut].entries[static_cast<size_t>(e)].type == val.type,
               "'" + val.name + "' changes type between chunks");
      s = {Source::kSlot, c.index, kRecvIn, c.groups[kRecvIn].add(val.name, val.type)};
      c.recv_in_msg.push_back(val.name + "@" + std::to_string(c.index));
      prev->send_f_from.push_back(e);
    } else {
      s = {Source::kFeed, -1, -1, c.feed(val.name, val.type)};
    }
    c.f_src.push_back(s);
    c.f_in.push_back({nullptr, &val.type});
  }
  // Outputs: what chunk c+1 reads goes to kOut, what B or W reads to kKeptB / kKeptW (a
  // tensor may be both); kept chunk inputs are copied from where F read them.
  ChunkT* next = last ? nullptr : chunks[static_cast<size_t>(c.index + 1)].get();
  const auto keep = [&](const Value& val, bool input, size_t k) {
    if (index_of(c.g.kept, val.name) < 0) return;
    const int g = index_of(c.g.kept_for_weight, val.name) >= 0 ? kKeptW : kKeptB;
    PT_CHECK(c.groups[g].find(val.name) < 0, "'" + val.name + "' kept twice");
    c.f_dst.push_back({static_cast<int>(k), input, g, c.groups[g].add(val.name, val.type)});
  };
  for (size_t k = 0; k < f.outputs.size(); ++k) {
    const Value& val = f.value(f.outputs[k]);
    if (val.name == kLossOutput && last) c.loss_output = static_cast<int>(k);
    if (const int i = index_of(side, val.name); i >= 0 && !side_type[static_cast<size_t>(i)]) {
      c.side_dst.push_back({static_cast<int>(k), i});
      side_type[static_cast<size_t>(i)] = &val.type;
    }
    if (next && next->g.forward.find(val.name) != kNoValue &&
        std::count(next->g.forward.inputs.begin(), next->g.forward.inputs.end(),
                   next->g.forward.find(val.name)))
      c.f_dst.push_back({static_cast<int>(k), false, kOut, c.groups[kOut].add(val.name, val.type)});
    keep(val, false, k);
  }
  // A tensor F passes on (an input that is also an output) was kept with the outputs already.
  for (size_t i = 0; i < f.inputs.size(); ++i)
    if (!std::count(f.outputs.begin(), f.outputs.end(), f.inputs[i])) keep(f.value(f.inputs[i]), true, i);
  // F writes an output straight into the first slot that keeps it; the other slots copy it.
  std::vector<char> placed(f.outputs.size(), 0);
  for (auto& d : c.f_dst)
    if (!d.input && c.local && c.f->placeable(static_cast<size_t>(d.k)) && !placed[static_cast<size_t>(d.k)])
      placed[static_cast<size_t>(d.k)] = d.placed = true;
  int kept = 0;
  for (int g : {kKeptB, kKeptW}) kept += static_cast<int>(c.groups[g].entries.size());
  PT_CHECK(kept == static_cast<int>(c.g.kept.size()), "F neither makes nor reads a kept tensor");
}

// Inputs of B: grad.<y> or grad.<y>@next (chunk c+1's grad.<y> in its kIGrad on the same device, else our kOGrad slot; feeds
// for the last chunk), kept tensors. Outputs: grad.<x> to kIGrad, then passed to kPassed.
template <class ChunkT>
void plan_backward_input(std::vector<std::unique_ptr<ChunkT>>& chunks, ChunkT& c) {
  const Graph& b = c.g.backward_input;
  ChunkT* next = c.index + 1 < static_cast<int>(chunks.size())
                     ? chunks[static_cast<size_t>(c.index + 1)].get() : nullptr;
  // Our grad.<x> outputs first, so that chunk c-1 can look them up.
  const size_t outs = b.outputs.size();
  PT_CHECK(outs == c.g.input_grads.size() + c.g.passed.size(), "B's outputs are not grads + passed");
  for (size_t k = 0; k < outs; ++k) {
    const Value& val = b.value(b.outputs[k]);
    const bool grad = k < c.g.input_grads.size();
    PT_CHECK(val.name == (grad ? c.g.input_grads[k] : c.g.passed[k - c.g.input_grads.size()]),
             "B output " + val.name + " out of order");
    const int g = grad ? kIGrad : kPassed;
    c.b_dst.push_back({g, c.groups[g].add(val.name, val.type)});
    c.b_placed.push_back(c.local && c.b->placeable(k));
  }
  for (ValueId v : b.inputs) {
    const Value& val = b.value(v);
    Source s;
    if (const int i = index_of(c.g.output_grads, val.name); i >= 0) {
      if (!next) {
        s = {Source::kFeed, -1, -1, c.feed(val.name, val.type)};
        c.b_reads_feed = true;
      } else {
        const std::string from = grad_name(c.g.output_grad_of[static_cast<size_t>(i)]);
        const int e = next->groups[kIGrad].find(from);
        PT_CHECK(e >= 0, "chunk " + std::to_string(next->index) + " returns no " + from);
        if (next->device == c.device) {
          s = {Source::kSlot, next->index, kIGrad, e};
        } else {
          s = {Source::kSlot, c.index, kOGrad, c.groups[kOGrad].add(val.name, val.type)};
          c.ograd_msg.push_back(val.name + "@" + std::to_string(c.index));
          next->send_b_from.push_back(e);
        }
      }
    } else {
      const int g = index_of(c.g.kept_for_weight, val.name) >= 0 ? kKeptW : kKeptB;
      const int e = c.groups[g].find(val.name);
      PT_CHECK(e >= 0, "B reads '" + val.name + "', which F does not keep");
      s = {Source::kSlot, c.index, g, e};
    }
    c.b_src.push_back(s);
    c.b_in.push_back({nullptr, &val.type});
  }
}

// Inputs of W: passed, kept for W, grad_acc.<p>. Outputs: grad.<p>, to the accumulator (made
// on this chunk's backend when it is the parameter's first reader).
template <class ChunkT, class AccT>
void plan_backward_weight(ChunkT& c, std::map<std::string, Tensor>& grads,
                          std::map<std::string, std::unique_ptr<AccT>>& accs) {
  const Graph& w = c.g.backward_weight;
  for (const std::string& p : c.g.params) {
    const ValueId acc = w.find(grad_acc_name(p));
    PT_CHECK(acc != kNoValue, "W graph lacks " + grad_acc_name(p));
    const TensorType& type = w.value(acc).type;
    auto it = accs.find(p);
    if (it == accs.end()) {
      auto a = std::make_unique<AccT>();
      a->backend = &c.backend;
      a->host = &grads.emplace(p, zeros_of(type)).first->second;
      if (c.backend.cpu_context()) {
        a->at = a->host->data.data();
      } else {
        a->block = Block(c.backend, static_cast<size_t>(type.bytes()));
        a->at = a->block.get();
      }
      it = accs.emplace(p, std::move(a)).first;
    }
    PT_CHECK(it->second->host->type == type, "'" + p + "' has two gradient types");
    c.acc.push_back(it->second.get());
  }
  for (ValueId v : w.inputs) {
    const Value& val = w.value(v);
    Source s;
    if (int k = -1; val.name.rfind("grad_acc.", 0) == 0 &&
                    (k = index_of(c.g.params, val.name.substr(9))) >= 0) {
      s = {Source::kAcc, -1, -1, k};
    } else if (int e = c.groups[kPassed].find(val.name); e >= 0) {
      s = {Source::kSlot, c.index, kPassed, e};
    } else {
      e = c.groups[kKeptW].find(val.name);
      PT_CHECK(e >= 0, "W reads '" + val.name + "', which is neither passed nor kept for W");
      s = {Source::kSlot, c.index, kKeptW, e};
    }
    c.w_src.push_back(s);
    c.w_in.push_back({nullptr, &val.type});
  }
  for (ValueId v : w.outputs) {
    const std::string& name = w.value(v).name;
    const int k = name.rfind("grad.", 0) == 0 ? index_of(c.g.params, name.substr(5)) : -1;
    PT_CHECK(k >= 0, "W output '" + name + "' is no parameter gradient");
    c.w_out_param.push_back(k);
    const bool placeable = c.local && c.w->placeable(c.w_out_param.size() - 1);
    c.w_place_held.push_back(placeable);
    c.w_place_acc.push_back(placeable && adds_into_accumulator(w, v, c.g.params[static_cast<size_t>(k)]));
  }
}

}  // namespace

PipelineExecutor::PipelineExecutor(const std::vector<BackwardGraphs>& chunks,
                                   const std::vector<int>& device_of_chunk,
                                   const std::vector<Backend*>& backends, Comm& comm,
                                   const Schedule& schedule,
                                   const std::vector<std::string>& side_outputs)
    : graphs_(chunks), schedule_(schedule), comm_(comm), failure_(std::make_unique<Failure>()) {
  check_placement(device_of_chunk, backends.size());
  for (int d = 0; d < schedule_.stages; ++d) {
    auto dev = std::make_unique<Device>();
    dev->index = d;
    dev->backend = backends[static_cast<size_t>(d)];
    if (!dev->backend) {
      dev->local = false;
      dev->remote = std::make_unique<RemoteDevice>(d);
      dev->backend = dev->remote.get();
    }
    devices_.push_back(std::move(dev));
  }
  std::map<std::string, int> readers;         // parameter -> chunks reading it
  std::map<std::string, std::set<bool>> where;  // parameter -> read here, elsewhere
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Device& dev = *devices_[static_cast<size_t>(device_of_chunk[c])];
    chunks_.push_back(std::make_unique<Chunk>(chunks[c], static_cast<int>(c), dev.index, *dev.backend, dev.local));
    for (const std::string& p : chunks[c].params) {
      ++readers[p];
      where[p].insert(dev.local);
    }
  }
  // A parameter read on several processes is one site per process (autodiff/parameter_sites.h),
  // its gradients summed by whoever holds the sites (train/ties.h): never one accumulator.
  for (const auto& [p, sides] : where)
    PT_CHECK(sides.size() == 1, "parameter '" + p + "' is read by chunks of this process and of another one: "
                                "split it into sites (split_parameter_sites) first");
  std::vector<const TensorType*> side_type(side_outputs.size(), nullptr);
  for (auto& c : chunks_)
    plan_forward(chunks_, *c, c->index + 1 == static_cast<int>(chunks_.size()), side_outputs, side_type);
  std::vector<Tensor> side;
  for (size_t i = 0; i < side_outputs.size(); ++i) {
    PT_CHECK(side_type[i], "no chunk's forward outputs '" + side_outputs[i] + "'");
    side.push_back(zeros_of(*side_type[i]));
  }
  side_.assign(static_cast<size_t>(schedule_.micro_batches), side);
  for (size_t c = chunks_.size(); c-- > 0;) plan_backward_input(chunks_, *chunks_[c]);
  for (auto& c : chunks_) {
    if (!c->local) continue;  // its parameters are another process's
    plan_backward_weight(*c, grads_, accs_);
    for (const std::string& p : c->g.params) c->shared = c->shared || readers[p] > 1;
  }
  size_slots();
  allocate_arenas();
  std::vector<std::string> messages;
  for (const auto& c : chunks_) {
    messages.insert(messages.end(), c->recv_in_msg.begin(), c->recv_in_msg.end());
    messages.insert(messages.end(), c->ograd_msg.begin(), c->ograd_msg.end());
  }
  comm_.plan(messages, schedule_.micro_batches);
  std::vector<PlannedMessage> sends;
  for (const std::vector<Action>& list : schedule_.devices)
    for (const Action& a : list) {
      if (a.op != Op::kSendF && a.op != Op::kSendB) continue;
      const Chunk& c = *chunks_[static_cast<size_t>(a.chunk)];
      const bool forward = a.op == Op::kSendF;
      const Chunk& peer = *chunks_[static_cast<size_t>(a.chunk + (forward ? 1 : -1))];
      const std::vector<std::string>& names = forward ? peer.recv_in_msg : peer.ograd_msg;
      const std::vector<int>& from = forward ? c.send_f_from : c.send_b_from;
      const Group& group = c.groups[forward ? kOut : kIGrad];
      for (size_t j = 0; j < from.size(); ++j)
        sends.push_back({names[j], a.micro_batch, c.device, peer.device,
                         group.entries[static_cast<size_t>(from[j])].bytes});
    }
  comm_.plan_order(sends);
  losses_.assign(static_cast<size_t>(schedule_.micro_batches), 0.0f);
  peak_kept_.assign(devices_.size(), 0);
  peak_slot_.assign(devices_.size(), 0);
  times_.resize(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) times_[d].resize(schedule_.devices[d].size());
}

PipelineExecutor::~PipelineExecutor() = default;

void PipelineExecutor::check_placement(const std::vector<int>& device_of_chunk,
                                       size_t backends) const {
  const std::string where = "schedule '" + schedule_.kind + "'";
  if (static_cast<int>(graphs_.size()) != schedule_.total_chunks() ||
      device_of_chunk.size() != graphs_.size())
    throw UserError(where, "has " + std::to_string(schedule_.total_chunks()) + " chunks, but " +
                               std::to_string(graphs_.size()) + " chunk graphs (" +
                               std::to_string(device_of_chunk.size()) + " placed) are given",
                    "partition into stages x chunks-per-stage chunks");
  for (size_t c = 0; c < device_of_chunk.size(); ++c)
    if (device_of_chunk[c] != schedule_.device_of(static_cast<int>(c)))
      throw UserError(where, "places chunk " + std::to_string(c) + " on device " +
                                 std::to_string(schedule_.device_of(static_cast<int>(c))) +
                                 ", the partition on device " + std::to_string(device_of_chunk[c]),
                      "partition with the schedule's placement (" +
                          std::string(placement_name(schedule_.placement)) + ")");
  if (static_cast<int>(backends) != schedule_.stages)
    throw UserError(where, "has " + std::to_string(schedule_.stages) + " devices but " +
                               std::to_string(backends) + " backends are given");
  validate(schedule_, where);
  bool crosses = false;
  for (int c = 0; c + 1 < schedule_.total_chunks(); ++c)
    crosses = crosses || schedule_.device_of(c) != schedule_.device_of(c + 1);
  if (crosses && !schedule_.lowered())
    throw UserError(where, "has no sends or receives between its devices",
                    "lower it first (add_send_recv)");
}


void PipelineExecutor::size_slots() {
  const int M = schedule_.micro_batches;
  const auto use = [&](std::vector<Use>& list, int chunk, int group) {
    if (chunk < 0 || chunk >= static_cast<int>(chunks_.size())) return;
    if (!chunks_[static_cast<size_t>(chunk)]->groups[group].entries.empty())
      list.push_back({chunk, group});
  };
  const auto same_device = [&](int a, int b) {
    return b >= 0 && b < static_cast<int>(chunks_.size()) &&
           chunks_[static_cast<size_t>(a)]->device == chunks_[static_cast<size_t>(b)]->device;
  };
  // What each action takes before it runs and gives back after (see the table in executor.h).
  const auto effects_of = [&](const Action& a) {
    Effects e;
    const int c = a.chunk;
    const bool b = a.op == Op::kB || a.op == Op::kBW, w = a.op == Op::kW || a.op == Op::kBW;
    const bool feed_until_b = chunks_[static_cast<size_t>(c)]->b_reads_feed;
    if (a.op == Op::kF) {
      for (int g : {kOut, kKeptB, kKeptW, kFeed}) use(e.acquire, c, g);
      use(e.release, c, kRecvIn);
      if (!feed_until_b) use(e.release, c, kFeed);
      if (same_device(c, c - 1)) use(e.release, c - 1, kOut);
    }
    if (b) {
      for (int g : {kIGrad, kPassed}) use(e.acquire, c, g);
      for (int g : {kKeptB, kOGrad}) use(e.release, c, g);
      if (same_device(c, c + 1)) use(e.release, c + 1, kIGrad);
      if (c == 0) use(e.release, c, kIGrad);
      if (feed_until_b) use(e.release, c, kFeed);
    }
    if (w)
      for (int g : {kKeptW, kPassed}) use(e.release, c, g);
    if (a.op == Op::kSendF) use(e.release, c, kOut);
    if (a.op == Op::kRecvF) use(e.acquire, c, kRecvIn);
    if (a.op == Op::kSendB) use(e.release, c, kIGrad);
    if (a.op == Op::kRecvB) use(e.acquire, c, kOGrad);
    return e;
  };
  // Walk each device's order once: the most blocks of a group live at once is its pool size.
  std::vector<std::array<int, kGroups>> live(chunks_.size()), most(chunks_.size());
  std::vector<std::vector<int>> w_order(chunks_.size());
  for (auto& dev : devices_) {
    for (const Action& a : schedule_.devices[static_cast<size_t>(dev->index)]) {
      dev->effects.push_back(effects_of(a));
      for (const Use& u : dev->effects.back().acquire) {
        int& n = live[static_cast<size_t>(u.chunk)][static_cast<size_t>(u.group)];
        ++n;
        int& top = most[static_cast<size_t>(u.chunk)][static_cast<size_t>(u.group)];
        top = std::max(top, n);
      }
      for (const Use& u : dev->effects.back().release)
        PT_CHECK(--live[static_cast<size_t>(u.chunk)][static_cast<size_t>(u.group)] >= 0,
                 "a slot is released before it is taken");
      if (a.op == Op::kW || a.op == Op::kBW)
        w_order[static_cast<size_t>(a.chunk)].push_back(a.micro_batch);
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Chunk& ch = *chunks_[c];
    if (!ch.local) continue;
    for (int g = 0; g < kGroups; ++g) {
      Group& grp = ch.groups[g];
      for (int k = 0; k < most[c][static_cast<size_t>(g)]; ++k) grp.pool.emplace_back(ch.backend, grp.bytes);
      grp.free.reserve(grp.pool.size());
      grp.live.assign(static_cast<size_t>(M), nullptr);
    }
    if (!ch.groups[kFeed].entries.empty())
      for (int m = 0; m < M; ++m) ch.feed_stage.emplace_back(ch.backend, ch.groups[kFeed].bytes, true);
    for (int m = 0; m < M; ++m) ch.hold = ch.hold || w_order[c][static_cast<size_t>(m)] != m;
    if (ch.hold || ch.shared) plan_held(ch);
    ch.held_ready.assign(static_cast<size_t>(M), 0);
  }
}

// Each program's arena planned without room for the outputs placed on every run (F's first
// slot of each tensor it keeps or hands on, B's placeable outputs, W's gradients added into
// their accumulators or held blocks), then one arena per device, the largest of its programs'.
void PipelineExecutor::allocate_arenas() {
  arena_bytes_.assign(devices_.size(), 0);
  arena_tensor_bytes_.assign(devices_.size(), 0);
  for (auto& c : chunks_) {
    if (!c->local) continue;
    std::vector<char> f_placed(c->g.forward.outputs.size(), 0);
    for (const Copy& d : c->f_dst)
      if (d.placed) f_placed[static_cast<size_t>(d.k)] = 1;
    c->f->plan_arena(f_placed);
    c->b->plan_arena(c->b_placed);
    c->w->plan_arena(c->w_place_acc);
    int64_t& most = arena_bytes_[static_cast<size_t>(c->device)];
    int64_t& tensors = arena_tensor_bytes_[static_cast<size_t>(c->device)];
    for (const StageProgram* p : {&*c->f, &*c->b, &*c->w}) {
      most = std::max(most, p->planned_peak_bytes());
      tensors = std::max(tensors, p->planned_tensor_bytes());
    }
  }
  for (auto& dev : devices_)
    if (dev->local)
      dev->arena = Block(*dev->backend, static_cast<size_t>(arena_bytes_[static_cast<size_t>(dev->index)]), false, false);
  for (auto& c : chunks_) {
    if (!c->local) continue;
    std::byte* arena = devices_[static_cast<size_t>(c->device)]->arena.get();
    c->f->allocate(arena);
    c->b->allocate(arena);
    c->w->allocate(arena);
  }
}

// A held block per micro-batch (every parameter's gradient alone, 64-byte aligned), the zeros
// W then reads as its accumulators (the largest parameter's bytes), and the
// in-place Add per parameter on its accumulator's backend; a shared parameter whose accumulator
// is on another backend gets a buffer there to bring the held gradient over before the add.
void PipelineExecutor::plan_held(Chunk& ch) {
  constexpr size_t kAlign = 64;
  size_t bytes = 0, most = 0;
  for (size_t p = 0; p < ch.acc.size(); ++p) {
    ch.held_offset.push_back(bytes);
    bytes += (static_cast<size_t>(ch.param_type(p).bytes()) + kAlign - 1) / kAlign * kAlign;
    most = std::max(most, static_cast<size_t>(ch.param_type(p).bytes()));
  }
  ch.zeros = Block(ch.backend, most);  // what W reads as its accumulators when it computes alone
  for (int m = 0; m < schedule_.micro_batches; ++m) ch.held.emplace_back(ch.backend, bytes);
  ch.adds.name = "held gradients of chunk " + std::to_string(ch.index);
  ch.adds.opsets[""] = 17;
  for (size_t p = 0; p < ch.acc.size(); ++p) {
    const TensorType& t = ch.param_type(p);
    const std::string n = std::to_string(p);
    Node add;
    add.name = "add_held." + n;
    add.op_type = "Add";
    add.inputs = {ch.adds.add_value("acc." + n, t), ch.adds.add_value("held." + n, t)};
    add.outputs = {ch.adds.add_value("sum." + n, t)};
    ch.adds.add_node(std::move(add));
  }
  ch.adds.rebuild_uses();
  for (size_t p = 0; p < ch.acc.size(); ++p) {
    Backend& on = *ch.acc[p]->backend;
    const TensorType& t = ch.param_type(p);
    KernelSpec spec{ch.adds, ch.adds.nodes[p], {t, t}, {t}, on.cpu_context(), {}, {}};
    ch.add.push_back(on.create_kernel(spec));
    PT_CHECK(ch.add.back() && ch.add.back()->scratch_bytes() == 0,
             std::string("the ") + on.name() + " backend adds no " + t.str() + " in place");
    ch.fold_in.push_back(&on == &ch.backend ? Block() : Block(on, static_cast<size_t>(t.bytes())));
  }
}

}  // namespace pt
