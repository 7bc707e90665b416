// bench/partition_bench.cc: how long the partitioner takes on a large graph.
//
//   partition_bench MODEL.onnx STAGES [REPEATS [LINK]]
// Imports the model once (timed separately), then times cost estimation plus the exact
// partitioner REPEATS times and prints the best and median wall time. LINK (a preset of
// partition/link.h, default none) prices the transfers, as `partition --link` does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "onnx_import/import.h"
#include "partition/cost_model.h"
#include "partition/partitioner.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: partition_bench MODEL.onnx STAGES [REPEATS [LINK]]\n");
    return 2;
  }
  const int stages = std::atoi(argv[2]);
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  try {
    const pt::LinkModel link = pt::link_preset(argc > 4 ? argv[4] : "none", "LINK");
    auto t0 = std::chrono::steady_clock::now();
    pt::Graph g = pt::import_model(argv[1]);
    const double import_s = seconds_since(t0);
    std::vector<double> times;
    double imbalance = 0;
    for (int r = 0; r < repeats; ++r) {
      t0 = std::chrono::steady_clock::now();
      std::vector<pt::NodeCost> costs = pt::estimate_costs(g);
      pt::PartitionOptions o;
      o.stages = stages;
      o.link = link;
      pt::PartitionPlan plan = pt::plan_partition(g, costs, o);
      times.push_back(seconds_since(t0));
      imbalance = plan.imbalance;
    }
    std::sort(times.begin(), times.end());
    std::printf("nodes %zu  stages %d  link %s  import %.3f s  cost+partition best %.4f s median "
                "%.4f s  imbalance %.4f\n",
                g.nodes.size(), stages, link.name.c_str(), import_s, times.front(),
                times[times.size() / 2], imbalance);
  } catch (const pt::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
