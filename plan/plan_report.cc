#include "plan/plan_report.h"

#include <cstdio>
#include <iomanip>
#include <map>
#include <ostream>

#include "core/bytes.h"
#include "partition/link.h"
#include "plan/memory.h"

namespace pt {
namespace {

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", x * 100);
  return buf;
}

}  // namespace

std::string format_ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  return buf;
}

std::vector<const PlanCandidate*> runner_ups(const PlanSearch& s) {
  std::vector<const PlanCandidate*> out;
  std::map<std::pair<std::string, int>, bool> seen{{{s.best().kind, s.best().chunks}, true}};
  for (const PlanCandidate& c : s.candidates)
    if (!seen[{c.kind, c.chunks}]) {
      seen[{c.kind, c.chunks}] = true;
      out.push_back(&c);
    }
  return out;
}

nlohmann::json candidate_json(const PlanCandidate& c) {
  return {{"kind", c.kind},           {"chunks", c.chunks},        {"recompute", c.recompute},
          {"cut_after", c.cut_after},
          {"grid", c.grid},           {"step_s", c.step_s},        {"bubble", c.bubble},
          {"state_bytes", c.state_bytes}, {"kept_bytes", c.kept_bytes}, {"fits", c.fits},
          {"note", c.note},
          {"memory", memory_json(memory_needs(device_loads(c.state_bytes, c.kept_bytes), MemoryOptions{}))}};
}

nlohmann::json plan_search_json(const PlanRequest& r, const PlanSearch& s) {
  nlohmann::json ups = nlohmann::json::array();
  for (const PlanCandidate* c : runner_ups(s)) ups.push_back(candidate_json(*c));
  const PlanCandidate* g_best = s.best_grid();
  return {{"devices", r.devices},
          {"micro_batches", r.micro_batches},
          {"memory", r.memory},
          {"searched", s.candidates.size()},
          {"fitting", s.fitting},
          {"seconds", s.seconds},
          {"best", candidate_json(s.best())},
          {"best_grid", g_best ? candidate_json(*g_best) : nlohmann::json()},
          {"runner_ups", ups}};
}

void print_plan_search(std::ostream& os, const std::string& model_path, int64_t micro_batch, const PlanRequest& r,
                       const PlanSearch& s) {
  const PlanCandidate& b = s.best();
  os << "plan for " << model_path << ": " << r.devices << " devices, " << r.micro_batches
     << " micro-batches of " << micro_batch << " (global batch " << r.micro_batches * micro_batch
     << "), memory cap " << format_bytes(r.memory) << " per device\n"
     << "link " << describe_link(r.link) << "\n"
     << "searched " << s.candidates.size() << " plans in " << std::fixed << std::setprecision(2) << s.seconds
     << " s, " << s.fitting << " fit\n\n"
     << "best: " << b.name() << (b.note.empty() ? "" : " (" + b.note + ")") << "\n"
     << "  simulated step " << format_ms(b.step_s) << ", bubble " << percent(b.bubble) << "\n";
  print_memory_table(os, memory_needs(device_loads(b.state_bytes, b.kept_bytes), MemoryOptions{}), "  ");
  os << "\nrunner-ups (the best of each other kind and chunking):\n";
  for (const PlanCandidate* c : runner_ups(s)) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-44s %12s  ", c->name().c_str(), format_ms(c->step_s).c_str());
    os << line;
    if (c->fits)
      os << "+" << percent(c->step_s / b.step_s - 1) << " slower, largest device " << format_bytes(c->largest_memory())
         << "\n";
    else
      os << "does not fit: " << c->note << "\n";
  }
  if (const PlanCandidate* g = s.best_grid())
    os << "\nbest hand-made plan (a kind x one policy for every device, balanced cuts): " << g->name() << ", "
       << format_ms(g->step_s) << (g == &b ? ": the plan itself\n" : "; the plan is " + percent(1 - b.step_s / g->step_s) + " faster\n");
  else
    os << "\nno hand-made plan (a kind x one policy for every device) fits the cap\n";
}

}  // namespace pt
