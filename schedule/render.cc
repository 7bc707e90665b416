#include "schedule/render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/bytes.h"

namespace pt {

std::string step_grid(const Schedule& s, const std::vector<GridMark>& marks) {
  constexpr int kBefore = 5, kAfter = 6, kRowsAround = 3;
  int focus = marks.empty() ? 0 : marks.front().step;
  for (const GridMark& m : marks) focus = std::min(focus, m.step);
  const int first = std::max(0, focus - kBefore);
  int last = first + kBefore + kAfter;  // one past
  size_t width = 4;
  for (const auto& list : s.devices)
    for (const Action& a : list) width = std::max(width, format_action(a).size());
  width += 2;
  auto marked = [&](int d, int step) {
    return std::any_of(marks.begin(), marks.end(),
                       [&](const GridMark& m) { return m.device == d && m.step == step; });
  };
  for (const GridMark& m : marks) last = std::max(last, std::min(m.step + 1, first + 24));
  auto show_row = [&](int d) {  // small schedules: every row; large: rows near a mark
    if (s.stages <= 2 * kRowsAround + 2) return true;
    return std::any_of(marks.begin(), marks.end(),
                       [&](const GridMark& m) { return std::abs(m.device - d) <= kRowsAround; });
  };
  std::ostringstream out;
  out << "        step";
  for (int i = first; i < last; ++i) {
    std::string n = std::to_string(i);
    out << std::string(width + 1 - n.size(), ' ') << n;
  }
  out << "\n";
  for (int d = 0; d < s.stages; ++d) {
    if (!show_row(d)) continue;
    const auto& list = s.devices[static_cast<size_t>(d)];
    bool row_marked = false;
    std::string row;
    for (int i = first; i < last; ++i) {
      std::string text = i < static_cast<int>(list.size()) ? format_action(list[static_cast<size_t>(i)]) : "";
      if (marked(d, i)) {
        row_marked = true;
        text = "[" + text + "]";
      }
      row += std::string(width + 1 - text.size(), ' ') + text;
    }
    char label[32];
    std::snprintf(label, sizeof label, "%s device %-3d", row_marked ? "->" : "  ", d);
    out << label << row;
    if (last < static_cast<int>(list.size())) out << " ...";
    out << "\n";
  }
  return out.str();
}

namespace {

char glyph(const Schedule& s, const Action& a) {
  const bool later = a.chunk >= s.stages;  // a device's second (or later) chunk
  switch (a.op) {
    case Op::kF: return later ? 'f' : 'F';
    case Op::kB: return later ? 'b' : 'B';
    case Op::kW: return later ? 'w' : 'W';
    case Op::kBW: return later ? '+' : '#';
    default: return '.';
  }
}

std::string escape_xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string format_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

}  // namespace

std::string ascii_timeline(const Schedule& s, const Simulation& sim, int width) {
  std::ostringstream out;
  const double scale = sim.makespan > 0 ? width / sim.makespan : 1;
  for (size_t d = 0; d < sim.timeline.size(); ++d) {
    std::string row(static_cast<size_t>(width), '.');
    for (const TimedAction& t : sim.timeline[d]) {
      if (!is_compute(t.action.op)) continue;
      const int from = static_cast<int>(std::lround(t.start * scale));
      const int to = std::max(from + 1, static_cast<int>(std::lround(t.end * scale)));
      for (int x = from; x < std::min(to, width); ++x) row[static_cast<size_t>(x)] = glyph(s, t.action);
    }
    char label[32];
    std::snprintf(label, sizeof label, "device %-3zu |", d);
    out << label << row << "|\n";
  }
  out << "F/B/W: forward, input-gradient, weight-gradient; # fused B+W; lowercase: a later chunk\n";
  out << "makespan " << format_number(sim.makespan) << "  bubble " << format_number(sim.bubble)
      << "  (with steps overlapped: " << format_number(sim.span_bubble) << ")\n";
  for (const DeviceReport& r : sim.devices) {
    out << "device " << r.index << ": busy " << format_number(r.busy) << "  bubble "
        << format_number(r.bubble) << "  peak activations " << format_number(r.peak_activations);
    if (sim.bytes) out << " (" << format_bytes(static_cast<int64_t>(r.peak_bytes)) << ")";
    out << "\n";
  }
  return out.str();
}

namespace {

constexpr double kSvgRow = 28, kSvgLabel = 70, kSvgWidth = 1200, kSvgTitle = 30;

double svg_block_height(const Schedule& s) { return kSvgTitle + kSvgRow * s.stages + 10; }

// One timeline: a title line, then a row per device, drawn at vertical offset `top` with
// `scale` pixels per time unit; tooltips give times x `unit` followed by `unit_name`.
void svg_block(std::ostream& out, const Schedule& s, const Simulation& sim, const std::string& title,
               double top, double scale, double unit = 1, const char* unit_name = "") {
  out << "<text x=\"4\" y=\"" << top + 18 << "\">" << escape_xml(title) << "</text>\n";
  for (size_t d = 0; d < sim.timeline.size(); ++d) {
    const double y = top + kSvgTitle + kSvgRow * static_cast<double>(d);
    out << "<text x=\"4\" y=\"" << y + kSvgRow * 0.65 << "\">device " << d << "</text>\n";
    for (const TimedAction& t : sim.timeline[d]) {
      if (!is_compute(t.action.op)) continue;
      const bool later = t.action.chunk >= s.stages;
      const char* fill = "#999";
      switch (t.action.op) {
        case Op::kF: fill = later ? "#9ecae1" : "#3182bd"; break;
        case Op::kB: fill = later ? "#a1d99b" : "#31a354"; break;
        case Op::kW: fill = later ? "#fdd0a2" : "#e6550d"; break;
        default: fill = later ? "#bcbddc" : "#756bb1"; break;
      }
      const double x = kSvgLabel + t.start * scale, w = (t.end - t.start) * scale;
      out << "<rect x=\"" << x << "\" y=\"" << y + 2 << "\" width=\"" << w << "\" height=\""
          << kSvgRow - 4 << "\" fill=\"" << fill << "\" stroke=\"white\" stroke-width=\"0.5\">"
          << "<title>" << format_action(t.action) << " " << format_number(t.start * unit) << "-"
          << format_number(t.end * unit) << unit_name << "</title></rect>\n";
      if (w >= 14)
        out << "<text x=\"" << x + w / 2 << "\" y=\"" << y + kSvgRow * 0.65
            << "\" text-anchor=\"middle\" fill=\"white\">" << t.action.micro_batch << "</text>\n";
    }
  }
}

std::string svg_open(double height) {
  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kSvgLabel + kSvgWidth + 10
      << "\" height=\"" << height << "\" font-family=\"monospace\" font-size=\"11\">\n";
  return out.str();
}

constexpr double kSvgAxis = 24, kSvgLegend = 22;

// A time axis under the timelines at `top`: ticks at round milliseconds over [0, longest] s.
void svg_ms_axis(std::ostream& out, double top, double longest, double scale) {
  out << "<line x1=\"" << kSvgLabel << "\" y1=\"" << top << "\" x2=\"" << kSvgLabel + kSvgWidth << "\" y2=\"" << top
      << "\" stroke=\"black\"/>\n";
  const double ms = longest * 1e3;
  if (!(ms > 0)) return;
  // ms between ticks: 1, 2 or 5 x 10^k, at most ten intervals.
  double step = std::pow(10.0, std::floor(std::log10(ms / 10)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (ms / (step * m) <= 10) {
      step *= m;
      break;
    }
  for (int k = 0; k * step <= ms * (1 + 1e-9); ++k) {
    const double t = k * step;
    const double x = kSvgLabel + t * 1e-3 * scale;
    out << "<line x1=\"" << x << "\" y1=\"" << top << "\" x2=\"" << x << "\" y2=\"" << top + 4 << "\" stroke=\"black\"/>"
        << "<text x=\"" << x << "\" y=\"" << top + 15 << "\" text-anchor=\"middle\">" << format_number(t) << "</text>\n";
  }
  out << "<text x=\"4\" y=\"" << top + 15 << "\">time (ms)</text>\n";
}

// The colours of the boxes: F, B, W and fused BW; lighter for a device's later chunks.
void svg_legend(std::ostream& out, double top) {
  const std::pair<const char*, const char*> items[] = {{"#3182bd", "F forward"},
                                                       {"#31a354", "B input gradient"},
                                                       {"#e6550d", "W weight gradient"},
                                                       {"#756bb1", "BW fused"},
                                                       {"#9ecae1", "lighter: a later chunk"}};
  double x = kSvgLabel;
  for (const auto& [fill, label] : items) {
    out << "<rect x=\"" << x << "\" y=\"" << top + 4 << "\" width=\"12\" height=\"12\" fill=\"" << fill << "\"/>"
        << "<text x=\"" << x + 16 << "\" y=\"" << top + 14 << "\">" << label << "</text>\n";
    x += 190;
  }
}

}  // namespace

std::string svg_timeline(const Schedule& s, const Simulation& sim) {
  std::ostringstream out;
  out << svg_open(svg_block_height(s));
  std::ostringstream title;
  title << s.kind << ": " << s.stages << " stages, " << s.micro_batches << " micro-batches, "
        << s.chunks << " chunk(s) per device; makespan " << format_number(sim.makespan)
        << ", bubble " << format_number(sim.bubble);
  svg_block(out, s, sim, title.str(), 0, sim.makespan > 0 ? kSvgWidth / sim.makespan : 1);
  out << "</svg>\n";
  return out.str();
}

std::string svg_timelines(const Schedule& s,
                          const std::vector<std::pair<std::string, Simulation>>& timelines) {
  double longest = 0;
  for (const auto& [label, sim] : timelines) longest = std::max(longest, sim.makespan);
  const double scale = longest > 0 ? kSvgWidth / longest : 1;
  std::ostringstream out;
  out << svg_open(svg_block_height(s) * static_cast<double>(timelines.size()) + kSvgAxis + kSvgLegend);
  double top = 0;
  for (const auto& [label, sim] : timelines) {
    std::ostringstream title;
    title << label << ": " << s.kind << ", " << s.stages << " stages, " << s.micro_batches
          << " micro-batches; makespan " << format_number(sim.makespan * 1e3) << " ms, bubble "
          << format_number(sim.bubble);
    svg_block(out, s, sim, title.str(), top, scale, 1e3, " ms");
    top += svg_block_height(s);
  }
  svg_ms_axis(out, top, longest, scale);
  svg_legend(out, top + kSvgAxis);
  out << "</svg>\n";
  return out.str();
}

}  // namespace pt
