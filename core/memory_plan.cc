#include "core/memory_plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include "core/error.h"

namespace pt {
namespace {

int64_t align_up(int64_t x) { return (x + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

bool lives_overlap(const BufferLife& a, const BufferLife& b) {
  return a.first <= b.last && b.first <= a.last;
}

int64_t peak_live(const std::vector<BufferLife>& buffers) {
  std::map<int, int64_t> delta;  // step -> change in live bytes
  for (const BufferLife& b : buffers) {
    delta[b.first] += b.bytes;
    delta[b.last + 1] -= b.bytes;
  }
  int64_t live = 0, peak = 0;
  for (const auto& [step, d] : delta) peak = std::max(peak, live += d);
  return peak;
}

}  // namespace

MemoryPlan plan_memory(std::vector<BufferLife> buffers) {
  MemoryPlan plan;
  add_buffers(plan, std::move(buffers));
  return plan;
}

void add_buffers(MemoryPlan& plan, std::vector<BufferLife> more) {
  const size_t before = plan.buffers.size();
  for (BufferLife& b : more) plan.buffers.push_back(std::move(b));
  const size_t n = plan.buffers.size();
  plan.offsets.resize(n, 0);
  std::vector<size_t> order(n - before);
  std::iota(order.begin(), order.end(), before);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return plan.buffers[a].bytes > plan.buffers[b].bytes;
  });
  std::vector<size_t> placed(before);
  std::iota(placed.begin(), placed.end(), size_t{0});
  for (size_t i : order) {
    const BufferLife& b = plan.buffers[i];
    PT_CHECK(b.first <= b.last, "buffer " + b.name + " dies before it is born");
    // Intervals taken by placed buffers that are live at the same time, by offset.
    std::vector<std::pair<int64_t, int64_t>> taken;
    for (size_t j : placed)
      if (lives_overlap(b, plan.buffers[j]))
        taken.push_back({plan.offsets[j], plan.offsets[j] + align_up(plan.buffers[j].bytes)});
    std::sort(taken.begin(), taken.end());
    int64_t offset = 0;
    const int64_t need = align_up(b.bytes);
    for (const auto& [lo, hi] : taken) {
      if (offset + need <= lo) break;
      offset = std::max(offset, hi);
    }
    plan.offsets[i] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + need);
    placed.push_back(i);
  }
  plan.peak_live_bytes = peak_live(plan.buffers);
}

std::string MemoryPlan::to_text() const {
  std::ostringstream s;
  s << "arena " << arena_bytes << " bytes, peak live " << peak_live_bytes << " bytes\n";
  for (size_t i = 0; i < buffers.size(); ++i)
    s << buffers[i].name << " " << buffers[i].bytes << " [" << buffers[i].first << ","
      << buffers[i].last << "] @" << offsets[i] << "\n";
  return s.str();
}

}  // namespace pt
