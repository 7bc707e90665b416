#include "train/timeline.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "core/files.h"
#include "schedule/render.h"

namespace pt {

namespace {

// The median (the upper one of an even count) of t; 0 when t is empty.
double median(std::vector<double> t) {
  if (t.empty()) return 0;
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

}  // namespace

Costs measured_costs(const Costs& planned, const Schedule& s,
                     const std::vector<std::vector<std::vector<ActionTime>>>& steps, ActionClock clock) {
  Costs costs = planned;
  const size_t n = costs.chunks.size();
  std::vector<std::vector<double>> f(n), b(n), w(n), bw(n);
  for (const auto& times : steps)
    for (size_t d = 0; d < s.devices.size(); ++d)
      for (size_t i = 0; i < s.devices[d].size(); ++i) {
        const Action& a = s.devices[d][i];
        const size_t c = static_cast<size_t>(a.chunk);
        const ActionTime& at = times[d][i];
        const double t = clock == ActionClock::kThreadCpu && at.cpu >= 0 ? at.cpu : at.end - at.start;
        if (a.op == Op::kF) f[c].push_back(t);
        if (a.op == Op::kB) b[c].push_back(t);
        if (a.op == Op::kW) w[c].push_back(t);
        if (a.op == Op::kBW) bw[c].push_back(t);
      }
  for (size_t c = 0; c < n; ++c) {
    ChunkCost& cc = costs.chunks[c];
    const double flops_b = cc.b, flops_w = cc.w;
    cc.f = median(f[c]);
    if (!b[c].empty() || !w[c].empty()) {
      cc.b = median(b[c]);
      cc.w = median(w[c]);
    } else {
      const double fused = median(bw[c]);
      const double share = flops_b + flops_w > 0 ? flops_b / (flops_b + flops_w) : 0.5;
      cc.b = fused * share;
      cc.w = fused - cc.b;
    }
  }
  // Transfers between devices: per message whose receive was waiting before its send began,
  // from the send's start to the receive's end (the copy and the wire, no queueing); where no
  // receive waited, from the receive's start (the message was there: the copy out). Each chunk's
  // comm is the median over its messages, both ways (walk.cc adds it across devices).
  std::vector<std::vector<double>> waited(n), ready(n);
  for (const auto& times : steps) {
    std::map<std::tuple<Op, int, int>, ActionTime> at;  // (op, chunk, micro-batch) -> its times
    for (size_t d = 0; d < s.devices.size(); ++d)
      for (size_t i = 0; i < s.devices[d].size(); ++i)
        if (is_comm(s.devices[d][i].op)) at[{s.devices[d][i].op, s.devices[d][i].chunk, s.devices[d][i].micro_batch}] = times[d][i];
    for (const auto& [key, recv] : at) {
      const auto [op, c, m] = key;
      if (op != Op::kRecvF && op != Op::kRecvB) continue;
      // RECV_F(c) takes SEND_F(c-1); RECV_B(c) takes SEND_B(c+1); chunk min(c, from)'s comm.
      const int from = op == Op::kRecvF ? c - 1 : c + 1;
      auto send = at.find({op == Op::kRecvF ? Op::kSendF : Op::kSendB, from, m});
      if (send == at.end()) continue;
      const size_t k = static_cast<size_t>(std::min(c, from));
      if (recv.start <= send->second.start) waited[k].push_back(recv.end - send->second.start);
      else ready[k].push_back(recv.end - recv.start);
    }
  }
  for (size_t c = 0; c < n; ++c) {
    const std::vector<double>& t = waited[c].empty() ? ready[c] : waited[c];
    if (!t.empty()) costs.chunks[c].comm = std::max(0.0, median(t));
  }
  return costs;
}

Simulation measured_step(const Schedule& s, const std::vector<std::vector<ActionTime>>& times) {
  Simulation sim;
  sim.timeline.resize(s.devices.size());
  double busy_all = 0;
  for (size_t d = 0; d < s.devices.size(); ++d) {
    DeviceReport r;
    r.index = static_cast<int>(d);
    double first = 0, last = 0;
    for (size_t i = 0; i < s.devices[d].size(); ++i) {
      const Action& a = s.devices[d][i];
      sim.timeline[d].push_back({a, times[d][i].start, times[d][i].end});
      sim.makespan = std::max(sim.makespan, times[d][i].end);
      if (!is_compute(a.op)) continue;
      if (r.busy == 0) first = times[d][i].start;
      last = times[d][i].end;
      r.busy += times[d][i].end - times[d][i].start;
    }
    busy_all += r.busy;
    r.span_bubble = last > first ? 1 - r.busy / (last - first) : 0;
    sim.devices.push_back(r);
  }
  for (DeviceReport& r : sim.devices) r.bubble = sim.makespan > 0 ? 1 - r.busy / sim.makespan : 0;
  const double p = static_cast<double>(s.devices.size());
  sim.bubble = sim.makespan > 0 ? 1 - busy_all / (p * sim.makespan) : 0;
  double span = 0;
  for (size_t d = 0; d < s.devices.size(); ++d)
    if (!sim.timeline[d].empty()) span = std::max(span, sim.timeline[d].back().end - sim.timeline[d].front().start);
  sim.span_bubble = span > 0 ? 1 - busy_all / (p * span) : 0;
  return sim;
}

void ChromeTrace::name_track(size_t tid, const std::string& name) {
  const nlohmann::json thread = {{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", tid}, {"args", {{"name", name}}}};
  const nlohmann::json order = {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", tid}, {"args", {{"sort_index", tid}}}};
  metadata_.push_back(thread.dump());
  metadata_.push_back(order.dump());
}

void ChromeTrace::add_step(int64_t step, double at, const Schedule& s, const std::vector<std::vector<ActionTime>>& times,
                           const std::vector<std::string>& device_names, const std::vector<TraceSpan>& spans,
                           size_t first_track) {
  // Each track named once ("M" metadata events, as Perfetto reads them); the span tracks
  // (numbered from 1000, below any device's) after the devices'.
  for (size_t d = 0; d < s.devices.size(); ++d)
    if (named_.insert(first_track + d).second)
      name_track(first_track + d, d < device_names.size() ? device_names[d] : "device " + std::to_string(d));
  char buf[256];
  for (size_t d = 0; d < s.devices.size(); ++d)
    for (size_t i = 0; i < s.devices[d].size(); ++i) {
      const Action& a = s.devices[d][i];
      const double ts = (at + times[d][i].start) * 1e6, dur = (times[d][i].end - times[d][i].start) * 1e6;
      std::snprintf(buf, sizeof buf,
                    "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":0,"
                    "\"tid\":%zu,\"args\":{\"step\":%lld,\"micro_batch\":%d,\"chunk\":%d}}",
                    format_action(a).c_str(), is_compute(a.op) ? "compute" : "comm", ts, dur, first_track + d,
                    static_cast<long long>(step), a.micro_batch, a.chunk);
      events_.emplace_back(buf);
    }
  constexpr size_t kSpanTracks = 1000;
  for (const TraceSpan& span : spans) {
    size_t k = std::find(tracks_.begin(), tracks_.end(), span.track) - tracks_.begin();
    if (k == tracks_.size()) {
      tracks_.push_back(span.track);
      name_track(kSpanTracks + k, span.track);
    }
    const nlohmann::json e = {{"name", span.name}, {"cat", "comm"}, {"ph", "X"},
                              {"ts", (at + span.start) * 1e6}, {"dur", (span.end - span.start) * 1e6},
                              {"pid", 0}, {"tid", kSpanTracks + k}, {"args", {{"step", step}}}};
    events_.push_back(e.dump());
  }
}

void ChromeTrace::write(const std::string& path, const std::string& key) const {
  std::string text = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  std::vector<const std::string*> all;
  for (const std::string& e : metadata_) all.push_back(&e);
  for (const std::string& e : events_) all.push_back(&e);
  for (size_t i = 0; i < all.size(); ++i) text += *all[i] + (i + 1 < all.size() ? ",\n" : "\n");
  text += "]}\n";
  write_file_atomic(path, text, "choose another " + key);
}

}  // namespace pt
