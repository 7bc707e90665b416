#include "partition/link.h"

#include <cmath>
#include <cstdio>

#include "core/bytes.h"
#include "core/error.h"

namespace pt {

double LinkModel::seconds(int64_t bytes, int64_t tensors) const {
  if (!priced() || tensors == 0) return 0;
  return latency * static_cast<double>(tensors) +
         (bandwidth > 0 ? static_cast<double>(bytes) / bandwidth : 0);
}

int64_t LinkModel::cost(int64_t bytes, int64_t tensors) const {
  return std::llround(seconds(bytes, tensors) * rate);
}

LinkModel link_preset(const std::string& name, const std::string& where) {
  constexpr double kCpu = 100e9, kGpu = 50e12;
  if (name == "none") return {name, 0, 0, kCpu};
  if (name == "cpu") return {name, 8e9, 5e-6, kCpu};
  if (name == "nvlink") return {name, 150e9, 10e-6, kGpu};
  if (name == "pcie") return {name, 20e9, 15e-6, kGpu};
  if (name == "tcp") return {name, 1.1e9, 50e-6, kCpu};
  throw UserError(where, "unknown link '" + name + "'", "use none, cpu, nvlink, pcie or tcp");
}

double parse_bandwidth(const std::string& text, const std::string& where) {
  std::string bytes = text;
  if (bytes.size() > 2 && bytes.compare(bytes.size() - 2, 2, "/s") == 0) bytes.resize(bytes.size() - 2);
  int64_t b = 0;
  try {
    b = parse_bytes(bytes, where);
  } catch (const UserError&) {
    b = 0;
  }
  if (b <= 0)
    throw UserError(where, "'" + text + "' is not a bandwidth",
                    "write bytes per second, e.g. 10GB/s, 800MiB/s or 1.1e9");
  return static_cast<double>(b);
}

double parse_latency(const std::string& text, const std::string& where) {
  static const std::pair<const char*, double> kUnits[] = {
      {"us", 1e-6}, {"ms", 1e-3}, {"ns", 1e-9}, {"s", 1.0}};
  std::string number = text;
  double scale = 1.0;
  for (const auto& [unit, factor] : kUnits) {
    const std::string u = unit;
    if (number.size() > u.size() && number.compare(number.size() - u.size(), u.size(), u) == 0) {
      number.resize(number.size() - u.size());
      scale = factor;
      break;
    }
  }
  try {
    size_t used = 0;
    const double x = std::stod(number, &used);
    if (used == number.size() && x >= 0 && std::isfinite(x)) return x * scale;
  } catch (const std::exception&) {
  }
  throw UserError(where, "'" + text + "' is not a latency",
                  "write seconds with a unit, e.g. 5us, 0.05ms or 2e-6");
}

std::string describe_link(const LinkModel& link) {
  if (!link.priced()) return link.name + ": transfers are free";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: %.3g GB/s, %.3g us per message, devices at %.3g GFLOP/s",
                link.name.c_str(), link.bandwidth * 1e-9, link.latency * 1e6, link.rate * 1e-9);
  return buf;
}

}  // namespace pt
