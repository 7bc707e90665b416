// schedule/render.h: schedules as text and pictures. In: a Schedule (and its Simulation).
// Out: the device x step grid the validator prints, an ASCII timeline, and an SVG timeline
// (devices as rows, actions coloured by kind, micro-batch numbers in the boxes).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "schedule/schedule.h"
#include "schedule/simulate.h"

namespace pt {

struct GridMark {
  int device;
  int step;  // may be one past the device's last action (something missing at its end)
};

// Rows of action text around the first mark, each marked cell in [brackets], an arrow on its row.
std::string step_grid(const Schedule& s, const std::vector<GridMark>& marks);

// One row per device, `width` columns spanning the makespan; F, B, W (lowercase for a device's
// later chunks), '#' for a fused BW, '.' idle. Then per device: busy, bubble, peak memory.
std::string ascii_timeline(const Schedule& s, const Simulation& sim, int width = 100);

std::string svg_timeline(const Schedule& s, const Simulation& sim);

// Several timelines of one schedule stacked, on one time scale (seconds, labelled in ms): e.g.
// a measured step above the simulator's prediction for it.
std::string svg_timelines(const Schedule& s,
                          const std::vector<std::pair<std::string, Simulation>>& timelines);

}  // namespace pt
