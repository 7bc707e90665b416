#include "train/executor.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <thread>

#include "train/executor_slots.h"
#include "schedule/render.h"

namespace pt {
using namespace exec_detail;

namespace {

// Seconds the calling thread has run, in user and kernel mode.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// What an interval between two reads of the thread CPU clock holds of the reads themselves (the
// first's return, the second's entry): the least of a few back-to-back pairs.
double thread_cpu_read_cost() {
  double least = 1;
  for (int i = 0; i < 64; ++i) {
    const double a = thread_cpu_seconds();
    least = std::min(least, thread_cpu_seconds() - a);
  }
  return least;
}

}  // namespace

void PipelineExecutor::time_cpu(bool on) {
  if (on && !time_cpu_) cpu_read_cost_ = thread_cpu_read_cost();
  time_cpu_ = on;
}

void PipelineExecutor::bind_feeds(const std::vector<std::map<std::string, Tensor>>& feeds) {
  // The schedule owns the micro-batch count: its caller draws that many (train/trainer.h).
  PT_CHECK(feeds.size() == static_cast<size_t>(schedule_.micro_batches), "feeds for " + std::to_string(feeds.size()) +
                                                                            " micro-batches, the schedule has " +
                                                                            std::to_string(schedule_.micro_batches));
  for (auto& c : chunks_)
    for (size_t m = 0; m < feeds.size() && c->local; ++m)
      for (size_t k = 0; k < c->feed_names.size(); ++k) {
        const std::string where = "micro-batch " + std::to_string(m);
        auto it = feeds[m].find(c->feed_names[k]);
        if (it == feeds[m].end())
          throw UserError(where, "no feed '" + c->feed_names[k] + "', which chunk " +
                                     std::to_string(c->index) + " reads",
                          "feed every model input, target and loss_scale");
        if (!(it->second.type == *c->feed_types[k]) ||
            it->second.data.size() != static_cast<size_t>(it->second.type.bytes()))
          throw UserError(where, "feed '" + c->feed_names[k] + "' is " + it->second.type.str() +
                                     ", expected " + c->feed_types[k]->str());
        const Group& g = c->groups[kFeed];
        std::memcpy(c->feed_stage[m].get() + g.entries[k].offset, it->second.data.data(),
                    g.entries[k].bytes);
      }
}

void PipelineExecutor::start_step() {
  for (auto& c : chunks_) {
    for (Group& g : c->groups) {
      g.free.clear();
      for (auto& block : g.pool) g.free.push_back(block.get());
      std::fill(g.live.begin(), g.live.end(), nullptr);
    }
    c->next_m = 0;
    std::fill(c->held_ready.begin(), c->held_ready.end(), 0);
  }
  for (auto& [name, a] : accs_) a->backend->fill(a->at, 0, a->host->data.size());
  for (auto& d : devices_) d->live_kept = d->live_slot = d->peak_kept = d->peak_slot = 0;
  std::fill(losses_.begin(), losses_.end(), 0.0f);
  failure_->stop = false;
  failure_->set = false;
  comm_.reset();
}

// One device's thread: its action list in order, each action through the handler table.
struct PipelineExecutor::Worker {
  using Handler = void (Worker::*)(const Action&);
  static constexpr size_t kOps = static_cast<size_t>(Op::kStep) + 1;
  static const Handler kHandlers[kOps];

  PipelineExecutor& ex;
  Device& dev;
  Clock::time_point t0;
  int M;

  void run();

  Chunk& chunk(int c) { return *ex.chunks_[static_cast<size_t>(c)]; }
  double now() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  void acquire(const Use& u, int m) {
    Group& g = chunk(u.chunk).groups[u.group];
    PT_CHECK(!g.free.empty() && g.live[static_cast<size_t>(m)] == nullptr,
             "slot pool sized too small");
    g.live[static_cast<size_t>(m)] = g.free.back();
    g.free.pop_back();
    dev.live_slot += g.payload;
    if (counts_as_kept(u.group)) dev.live_kept += g.payload;
  }
  void release(const Use& u, int m) {
    Group& g = chunk(u.chunk).groups[u.group];
    PT_CHECK(g.live[static_cast<size_t>(m)] != nullptr, "slot released twice");
    g.free.push_back(g.live[static_cast<size_t>(m)]);
    g.live[static_cast<size_t>(m)] = nullptr;
    dev.live_slot -= g.payload;
    if (counts_as_kept(u.group)) dev.live_kept -= g.payload;
  }

  // Patches every input address of one program run.
  void bind(Chunk& c, const std::vector<Source>& src, std::vector<Buffer>& in, int m, bool direct) {
    for (size_t i = 0; i < src.size(); ++i) {
      const Source& s = src[i];
      void* p = nullptr;
      if (s.kind == Source::kSlot) p = chunk(s.chunk).groups[s.group].at(m, s.index);
      if (s.kind == Source::kFeed) p = c.groups[kFeed].at(m, s.index);
      if (s.kind == Source::kAcc) p = direct ? c.acc[static_cast<size_t>(s.index)]->at : c.zeros.get();
      in[i].data = p;
    }
  }

  // The feeds of micro-batch m, staged by bind_feeds, into the kFeed block F just took.
  void upload_feeds(Chunk& c, int m) {
    const Group& g = c.groups[kFeed];
    if (!g.entries.empty())
      c.backend.copy(g.live[static_cast<size_t>(m)], c.feed_stage[static_cast<size_t>(m)].get(), g.bytes);
  }
  void forward(const Action& a) {
    Chunk& c = chunk(a.chunk);
    const int m = a.micro_batch;
    upload_feeds(c, m);
    bind(c, c.f_src, c.f_in, m, false);
    for (const Copy& d : c.f_dst)
      if (d.placed) c.f->place_output(static_cast<size_t>(d.k), c.groups[d.group].at(m, d.entry));
    c.f->run(c.f_in);
    for (const Copy& d : c.f_dst) {
      if (d.placed) continue;
      Group& g = c.groups[d.group];
      const void* from = d.input ? c.f_in[static_cast<size_t>(d.k)].data
                                 : c.f->output(static_cast<size_t>(d.k)).data;
      c.backend.copy(g.at(m, d.entry), from, g.entries[static_cast<size_t>(d.entry)].bytes);
    }
    for (const auto& [k, i] : c.side_dst) {
      Tensor& t = ex.side_[static_cast<size_t>(m)][static_cast<size_t>(i)];
      c.backend.copy(t.data.data(), c.f->output(static_cast<size_t>(k)).data, t.data.size());
    }
    if (c.loss_output >= 0)
      c.backend.copy(&ex.losses_[static_cast<size_t>(m)],
                     c.f->output(static_cast<size_t>(c.loss_output)).data, sizeof(float));
  }
  void backward_input(const Action& a) {
    Chunk& c = chunk(a.chunk);
    const int m = a.micro_batch;
    bind(c, c.b_src, c.b_in, m, false);
    for (size_t k = 0; k < c.b_dst.size(); ++k)
      if (c.b_placed[k]) c.b->place_output(k, c.groups[c.b_dst[k].first].at(m, c.b_dst[k].second));
    c.b->run(c.b_in);
    for (size_t k = 0; k < c.b_dst.size(); ++k) {
      if (c.b_placed[k]) continue;
      Group& g = c.groups[c.b_dst[k].first];
      c.backend.copy(g.at(m, c.b_dst[k].second), c.b->output(k).data,
                     g.entries[static_cast<size_t>(c.b_dst[k].second)].bytes);
    }
  }
  // In micro-batch order straight into the accumulators; otherwise alone into held[m], added
  // when the micro-batches before it are in (or after the step, for shared parameters).
  void backward_weight(const Action& a) {
    Chunk& c = chunk(a.chunk);
    const int m = a.micro_batch;
    const bool direct = !c.shared && m == c.next_m;
    bind(c, c.w_src, c.w_in, m, direct);
    const auto dst = [&](size_t k) -> std::byte* {
      const size_t p = static_cast<size_t>(c.w_out_param[k]);
      return direct ? c.acc[p]->at : c.held_at(m, p);
    };
    const std::vector<char>& placed = direct ? c.w_place_acc : c.w_place_held;
    for (size_t k = 0; k < c.w_out_param.size(); ++k)
      if (c.w_place_held[k]) c.w->place_output(k, placed[k] ? dst(k) : nullptr);
    c.w->run(c.w_in);
    for (size_t k = 0; k < c.w_out_param.size(); ++k)
      if (!placed[k])
        c.backend.copy(dst(k), c.w->output(k).data,
                       static_cast<size_t>(c.param_type(static_cast<size_t>(c.w_out_param[k])).bytes()));
    if (!direct) {
      c.held_ready[static_cast<size_t>(m)] = 1;
      return;
    }
    bool added = false;
    for (++c.next_m; c.next_m < M && c.held_ready[static_cast<size_t>(c.next_m)]; ++c.next_m, added = true)
      for (size_t p = 0; p < c.acc.size(); ++p) c.add_into_acc(p, c.held_at(c.next_m, p));
    if (added) c.backend.synchronize();
  }
  void backward_fused(const Action& a) {
    backward_input(a);
    backward_weight(a);
  }
  // Sends entries `from` of `group` (micro-batch m) to `peer`, whose j-th message name is msgs[j].
  void send_entries(const Chunk& c, const Group& group, const std::vector<int>& from,
                    const Chunk& peer, const std::vector<std::string>& msgs, int m) {
    for (size_t j = 0; j < from.size(); ++j)
      ex.comm_.send(msgs[j], m, c.device, peer.device, group.at(m, from[j]),
                    group.entries[static_cast<size_t>(from[j])].bytes);
  }
  // Receives every entry of `group` (micro-batch m) from `peer`, entry j as message msgs[j].
  void recv_entries(const Chunk& c, const Group& group, const std::vector<std::string>& msgs,
                    const Chunk& peer, int m) {
    for (size_t j = 0; j < group.entries.size(); ++j)
      ex.comm_.recv(msgs[j], m, peer.device, c.device, group.at(m, static_cast<int>(j)),
                    group.entries[j].bytes);
  }
  void send_f(const Action& a) {
    const Chunk& c = chunk(a.chunk);
    const Chunk& next = chunk(a.chunk + 1);
    send_entries(c, c.groups[kOut], c.send_f_from, next, next.recv_in_msg, a.micro_batch);
  }
  void recv_f(const Action& a) {
    const Chunk& c = chunk(a.chunk);
    recv_entries(c, c.groups[kRecvIn], c.recv_in_msg, chunk(a.chunk - 1), a.micro_batch);
  }
  void send_b(const Action& a) {
    const Chunk& c = chunk(a.chunk);
    const Chunk& prev = chunk(a.chunk - 1);
    send_entries(c, c.groups[kIGrad], c.send_b_from, prev, prev.ograd_msg, a.micro_batch);
  }
  void recv_b(const Action& a) {
    const Chunk& c = chunk(a.chunk);
    recv_entries(c, c.groups[kOGrad], c.ograd_msg, chunk(a.chunk + 1), a.micro_batch);
  }
  // The optimizer is not part of the executor yet: the gradients are complete here.
  void optimizer_step(const Action&) {}
};

// One handler per Op, in the enum's order (schedule/action.h).
const PipelineExecutor::Worker::Handler PipelineExecutor::Worker::kHandlers[kOps] = {
    &Worker::forward,         &Worker::backward_input, &Worker::backward_weight,
    &Worker::backward_fused,  &Worker::send_f,         &Worker::recv_f,
    &Worker::send_b,          &Worker::recv_b,         &Worker::optimizer_step};

void PipelineExecutor::Worker::run() {
  const auto& list = ex.schedule_.devices[static_cast<size_t>(dev.index)];
  auto& times = ex.times_[static_cast<size_t>(dev.index)];
  size_t i = 0;
  try {
    dev.backend->bind_thread();
    for (; i < list.size(); ++i) {
      if (ex.failure_->stop.load(std::memory_order_relaxed)) return;
      const Action& a = list[i];
      const Effects& e = dev.effects[i];
      // The CPU clock's reads outside the wall clock's: they cost the action's time nothing.
      const bool cpu = ex.time_cpu_ && is_compute(a.op);
      const double cpu_start = cpu ? thread_cpu_seconds() : 0;
      times[i].start = now();
      for (const Use& u : e.acquire) acquire(u, a.micro_batch);
      dev.peak_slot = std::max(dev.peak_slot, dev.live_slot);
      (this->*kHandlers[static_cast<size_t>(a.op)])(a);
      for (const Use& u : e.release) release(u, a.micro_batch);
      dev.peak_kept = std::max(dev.peak_kept, dev.live_kept);
      times[i].end = now();
      times[i].cpu = cpu ? std::max(0.0, thread_cpu_seconds() - cpu_start - ex.cpu_read_cost_) : -1;
    }
    dev.backend->synchronize();
  } catch (const CommAborted&) {
    // Another device failed; its error is the one reported.
  } catch (const std::exception& err) {
    Failure& f = *ex.failure_;
    {
      std::lock_guard<std::mutex> lock(f.mu);
      if (!f.set) f.set = true, f.device = dev.index, f.step = static_cast<int>(i), f.what = err.what();
    }
    f.stop = true;
    ex.comm_.abort();
  }
}

void PipelineExecutor::run_step(const std::vector<std::map<std::string, Tensor>>& feeds) {
  bind_feeds(feeds);
  start_step();
  ++steps_run_;
  const Clock::time_point t0 = Clock::now();
  // The first local device runs on this thread, the others on a thread each. This thread is
  // the one that lives from step to step and runs the optimizer, so its OpenMP team is the one
  // the step's kernels reuse: with a fresh thread per device per step, that thread's team and
  // this one's together outnumbered the cores, and libgomp then puts its workers to sleep after
  // every parallel region instead of spinning (10999 context switches in 4 steps of the d 256
  // step at 2 threads, against 129 this way; bench/ab_step.sh: 1154 -> 1008 ms).
  std::vector<std::thread> workers;
  Device* first = nullptr;
  for (auto& d : devices_) {
    if (!d->local) continue;
    if (!first) {
      first = d.get();
    } else {
      workers.emplace_back([this, &d, t0] { Worker{*this, *d, t0, schedule_.micro_batches}.run(); });
    }
  }
  if (first) Worker{*this, *first, t0, schedule_.micro_batches}.run();
  for (std::thread& t : workers) t.join();
  if (failure_->set) throw_failure();
  fold_shared_gradients();
  copy_gradients_out();
  loss_ = 0;
  for (float l : losses_) loss_ += static_cast<double>(l);
  for (size_t d = 0; d < devices_.size(); ++d) {
    peak_kept_[d] = devices_[d]->peak_kept;
    peak_slot_[d] = devices_[d]->peak_slot;
  }
}

// ReferenceStep's order: micro-batch by micro-batch, the later chunk first. On the main thread,
// after every worker has finished: each add runs on the accumulator's backend, a held gradient
// of another backend first copied over.
void PipelineExecutor::fold_shared_gradients() {
  bool any = false;
  for (int m = 0; m < schedule_.micro_batches; ++m)
    for (size_t c = chunks_.size(); c-- > 0;) {
      Chunk& ch = *chunks_[c];
      if (!ch.shared || !ch.local) continue;
      for (size_t p = 0; p < ch.acc.size(); ++p) {
        Backend& on = *ch.acc[p]->backend;
        const std::byte* held = ch.held_at(m, p);
        if (std::byte* there = ch.fold_in[p].get()) {
          on.copy(there, held, static_cast<size_t>(ch.param_type(p).bytes()));
          held = there;
        }
        on.bind_thread();
        ch.add_into_acc(p, held);
        any = true;
      }
    }
  if (any)
    for (auto& d : devices_)
      if (d->local) d->backend->synchronize();
}

// The step's gradients, from each accumulator's backend into grads_ (on the CPU they are there).
void PipelineExecutor::copy_gradients_out() {
  if (gradients_on_device_) return;
  for (auto& [name, a] : accs_)
    if (a->at != a->host->data.data()) a->backend->copy(a->host->data.data(), a->at, a->host->data.size());
}

const float* PipelineExecutor::device_gradient(const std::string& param, const Backend& backend) const {
  auto it = accs_.find(param);
  if (it == accs_.end() || it->second->backend != &backend) return nullptr;
  return reinterpret_cast<const float*>(it->second->at);
}

void PipelineExecutor::throw_failure() {
  const Failure& f = *failure_;
  const auto& list = schedule_.devices[static_cast<size_t>(f.device)];
  const std::string action =
      f.step < static_cast<int>(list.size()) ? format_action(list[static_cast<size_t>(f.step)]) : "end";
  std::string grid = step_grid(schedule_, {{f.device, f.step}});
  std::cerr << grid;
  throw ExecutionError("training step " + std::to_string(steps_run_ - 1) + ", device " +
                           std::to_string(f.device) + ", step " + std::to_string(f.step) + " (" +
                           action + ")",
                       f.what, std::move(grid));
}

void PipelineExecutor::profile_ops() {
  for (auto& c : chunks_) {
    if (!c->local) continue;
    c->f->profile_into(&c->profile[0]);
    c->b->profile_into(&c->profile[1]);
    c->w->profile_into(&c->profile[2]);
  }
}

std::vector<PipelineExecutor::NodeTime> PipelineExecutor::node_profile() const {
  std::vector<NodeTime> out;
  for (const auto& c : chunks_) {
    if (!c->local) continue;
    const StageProgram* programs[3] = {&*c->f, &*c->b, &*c->w};
    for (int k = 0; k < 3; ++k) {
      const Graph& g = programs[k]->graph();
      const std::vector<NodeCost> costs = estimate_costs(g);
      for (size_t i = 0; i < c->profile[k].size() && i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        const std::vector<int64_t> shape =
            n.outputs.empty() || n.outputs[0] == kNoValue ? std::vector<int64_t>{} : g.value(n.outputs[0]).type.shape;
        out.push_back({c->index, std::string(1, "FBW"[k]), n.name, n.op_type, shape, c->profile[k][i], costs[i]});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const NodeTime& a, const NodeTime& b) { return a.seconds > b.seconds; });
  return out;
}

std::vector<PipelineExecutor::OpTime> PipelineExecutor::by_op(const std::vector<NodeTime>& nodes) {
  std::map<std::pair<std::string, std::string>, OpTime> by;
  for (const NodeTime& n : nodes) {
    OpTime& t = by[{n.pass, n.op}];
    t.pass = n.pass;
    t.op = n.op;
    t.seconds += n.seconds;
    ++t.nodes;
    t.cost = total_cost({t.cost, n.cost});
  }
  std::vector<OpTime> out;
  for (auto& [key, t] : by) out.push_back(std::move(t));
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return out;
}

}  // namespace pt
