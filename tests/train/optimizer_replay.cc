// optimizer_replay: replays gradient sets through Optimizers, for oracle/optimizer_torch.py.
//
//   optimizer_replay DIR --steps S --groups 2,3 [--kind sgd|adamw] [--lr X] [--momentum X]
//       [--nesterov 0|1] [--beta1 X] [--beta2 X] [--eps X] [--weight-decay X] [--clip X]
//       [--warmup N] [--schedule constant|cosine] [--total-steps N] [--min-lr X] [--reload-at T]
//
// Reads DIR/param_K.npy and DIR/grad_S_K.npy (float32; K over all parameters, S < steps). The
// parameters are split into consecutive groups of the given sizes, one Optimizer per group (as
// per pipeline stage); each step sums the groups' squared norms into the global norm, steps every
// group, and writes DIR/out_S_K.npy. --reload-at T: after T steps every group's state goes into a
// fresh Optimizer over copies of the parameters (a checkpoint round trip).
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "exec/npy.h"
#include "train/optimizer.h"

namespace pt {
namespace {

struct Args {
  std::string dir;
  std::map<std::string, std::string> flags;

  std::string get(const std::string& key, const std::string& fallback) const {
    auto it = flags.find(key);
    return it == flags.end() ? fallback : it->second;
  }
  double num(const std::string& key, double fallback) const {
    auto it = flags.find(key);
    return it == flags.end() ? fallback : std::stod(it->second);
  }
};

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) throw UserError("optimizer_replay", "no folder given", "see the file's header");
  a.dir = argv[1];
  for (int i = 2; i < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0 || i + 1 >= argc)
      throw UserError("optimizer_replay", "bad flag '" + key + "'", "use --name value pairs");
    a.flags[key.substr(2)] = argv[i + 1];
  }
  return a;
}

OptimizerConfig config_of(const Args& a) {
  OptimizerConfig c;
  c.kind = parse_optimizer_kind(a.get("kind", "sgd"));
  c.lr = a.num("lr", c.lr);
  c.momentum = a.num("momentum", c.momentum);
  c.nesterov = a.get("nesterov", "0") == "1";
  c.beta1 = a.num("beta1", c.beta1);
  c.beta2 = a.num("beta2", c.beta2);
  c.eps = a.num("eps", c.eps);
  c.weight_decay = a.num("weight-decay", c.weight_decay);
  c.clip_grad_norm = a.num("clip", c.clip_grad_norm);
  c.warmup_steps = std::stoll(a.get("warmup", "0"));
  c.schedule = parse_lr_schedule(a.get("schedule", "constant"));
  c.total_steps = std::stoll(a.get("total-steps", "0"));
  c.min_lr = a.num("min-lr", c.min_lr);
  return c;
}

std::vector<size_t> group_sizes(const std::string& text) {
  std::vector<size_t> sizes;
  std::stringstream s(text);
  for (std::string item; std::getline(s, item, ',');) sizes.push_back(std::stoul(item));
  return sizes;
}

std::string file(const Args& a, const std::string& stem, size_t k) {
  return a.dir + "/" + stem + "_" + std::to_string(k) + ".npy";
}

int replay(const Args& a) {
  const OptimizerConfig config = config_of(a);
  const std::vector<size_t> sizes = group_sizes(a.get("groups", "1"));
  const int steps = std::stoi(a.get("steps", "1"));
  const int reload_at = std::stoi(a.get("reload-at", "-1"));
  size_t count = 0;
  for (size_t n : sizes) count += n;

  std::vector<Tensor> params;
  for (size_t k = 0; k < count; ++k) params.push_back(read_npy(file(a, "param", k)));
  auto make_groups = [&](std::vector<Tensor>& ps) {
    std::vector<std::unique_ptr<Optimizer>> groups;
    size_t first = 0;
    for (size_t n : sizes) {
      std::vector<OptimizerParam> refs;
      for (size_t k = first; k < first + n; ++k)
        refs.push_back({std::string("p").append(std::to_string(k)), &ps[k]});
      groups.push_back(std::make_unique<Optimizer>(config, std::move(refs)));
      first += n;
    }
    return groups;
  };
  auto groups = make_groups(params);
  std::vector<Tensor> reloaded;  // parameters of the optimizers made at --reload-at

  for (int s = 0; s < steps; ++s) {
    if (s == reload_at) {
      reloaded = params;
      auto fresh = make_groups(reloaded);
      for (size_t g = 0; g < groups.size(); ++g) fresh[g]->load_state(groups[g]->state());
      groups = std::move(fresh);
    }
    std::vector<Tensor>& live = reloaded.empty() ? params : reloaded;
    std::vector<Tensor> grads;
    for (size_t k = 0; k < count; ++k)
      grads.push_back(read_npy(file(a, "grad_" + std::to_string(s), k)));
    std::vector<std::vector<const float*>> per_group;
    std::vector<double> squared;
    size_t first = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      per_group.emplace_back();
      for (size_t k = first; k < first + sizes[g]; ++k)
        per_group.back().push_back(grads[k].as<float>());
      squared.push_back(groups[g]->squared_norm(per_group.back()));
      first += sizes[g];
    }
    const double norm = Optimizer::global_norm(squared);
    for (size_t g = 0; g < groups.size(); ++g) groups[g]->step(per_group[g], norm);
    for (size_t k = 0; k < count; ++k)
      write_npy(live[k], file(a, "out_" + std::to_string(s), k));
  }
  return 0;
}

}  // namespace
}  // namespace pt

int main(int argc, char** argv) {
  try {
    return pt::replay(pt::parse_args(argc, argv));
  } catch (const pt::UserError& e) {
    std::fprintf(stderr, "optimizer_replay: %s\n", e.what());
    return 2;
  }
}
