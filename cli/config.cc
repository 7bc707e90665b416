#include "cli/config.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <functional>
#include <set>

#include "core/error.h"
#include "plan/schedule_choice.h"

namespace pt {
namespace {

// Whether a path the config names exists; a name the file system refuses (too long, ...) does not.
bool path_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// Where a node came from: "file:line", or "--set key" for an override.
class Reader {
 public:
  // overridden: the dotted keys `--set` gave (their nodes carry no line of the file).
  Reader(std::string path, std::map<std::string, std::string>* places,
         std::vector<std::string> overridden = {})
      : path_(std::move(path)), places_(places), overridden_(std::move(overridden)) {}

  // relative_to: config: the file's own relative paths are read from its folder.
  void read_paths_from_its_folder() { from_folder_ = true; }

  // A path as `train` opens it: with relative_to: config, a relative path the file gives is
  // joined to the file's folder; an absolute one, and any given with --set (a command line's
  // paths are the shell's), are taken as they are.
  std::string resolve(const YAML::Node& n, const std::string& key, const std::string& path) const {
    const std::filesystem::path folder = std::filesystem::path(path_).parent_path();
    if (!from_folder_ || path.empty() || folder.empty() || std::filesystem::path(path).is_absolute() ||
        where(n, key).rfind("--set ", 0) == 0)
      return path;
    return (folder / path).lexically_normal().string();
  }

  std::string where(const YAML::Node& n, const std::string& key) const {
    const YAML::Mark m = n.Mark();
    for (const std::string& o : overridden_)
      if (key == o || key.rfind(o + ".", 0) == 0) return "--set " + key;
    if (m.is_null() || m.line < 0) return "--set " + key;
    return path_ + ":" + std::to_string(m.line + 1) + ": " + key;
  }

  // The node must be a map whose keys are all in `known`.
  void check_keys(const YAML::Node& n, const std::string& key,
                  const std::set<std::string>& known) const {
    if (!key.empty()) (*places_)[key] = where(n, key);
    if (!n.IsMap())
      throw UserError(where(n, key.empty() ? "top level" : key), "expected a map of keys",
                      "write key: value pairs here");
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      if (known.count(k)) continue;
      std::string list;
      for (const std::string& s : known) list += (list.empty() ? "" : ", ") + s;
      throw UserError(where(kv.first, key.empty() ? k : key + "." + k), "unknown key",
                      "known keys here: " + list);
    }
  }

  template <class T>
  void read(const YAML::Node& parent, const std::string& prefix, const char* name, T* out,
            const char* expected) const {
    const YAML::Node n = parent[name];
    if (!n) return;
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    (*places_)[key] = where(n, key);
    try {
      if (!n.IsScalar()) throw YAML::Exception(YAML::Mark::null_mark(), "not a scalar");
      *out = n.as<T>();
    } catch (const YAML::Exception&) {
      throw UserError(where(n, key), "expected " + std::string(expected) + ", got '" +
                                         (n.IsScalar() ? n.Scalar() : std::string("a list or map")) + "'",
                      "give " + std::string(expected));
    }
  }

  void positive(const YAML::Node& parent, const std::string& prefix, const char* name,
                int64_t value, int64_t least) const {
    if (value >= least) return;
    const YAML::Node n = parent[name];
    throw UserError(where(n, prefix.empty() ? name : prefix + "." + name),
                    "must be at least " + std::to_string(least) + ", got " + std::to_string(value),
                    "raise it");
  }

  void one_of(const YAML::Node& parent, const std::string& prefix, const char* name,
              const std::string& value, const std::set<std::string>& allowed) const {
    if (allowed.count(value)) return;
    std::string list;
    for (const std::string& s : allowed) list += (list.empty() ? "" : ", ") + s;
    throw UserError(where(parent[name], prefix.empty() ? name : prefix + "." + name),
                    "unknown value '" + value + "'",
                    "use one of " + list);
  }

 private:
  std::string path_;
  std::map<std::string, std::string>* places_;
  std::vector<std::string> overridden_;
  bool from_folder_ = false;
};

// "a.b.c=value": sets root[a][b][c] to the YAML scalar (or flow list/map) `value`.
void apply_override(YAML::Node root, const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError("--set " + text, "cannot read the override", "write --set key.subkey=value");
  const std::string key = text.substr(0, eq);
  YAML::Node value;
  try {
    // key= (nothing after the '=') sets the empty string: it turns an output off.
    value = eq + 1 == text.size() ? YAML::Node(std::string()) : YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw UserError("--set " + key, "cannot read the value: " + e.msg, "write a YAML scalar");
  }
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t dot = key.find('.', at);
    parts.push_back(key.substr(at, dot - at));
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  std::function<void(YAML::Node, size_t)> set = [&](YAML::Node n, size_t i) {
    if (i + 1 == parts.size()) {
      n[parts[i]] = value;
      return;
    }
    if (!n[parts[i]] || !n[parts[i]].IsMap()) n[parts[i]] = YAML::Node(YAML::NodeType::Map);
    set(n[parts[i]], i + 1);
  };
  set(root, 0);
}

// A key naming a file or folder: read, then resolved as relative_to says (Reader::resolve).
void read_path(const Reader& r, const YAML::Node& parent, const std::string& prefix, const char* name,
               std::string* out, const char* expected) {
  r.read(parent, prefix, name, out, expected);
  if (parent[name]) *out = r.resolve(parent[name], prefix.empty() ? name : prefix + "." + name, *out);
}

// device: cpu | cuda | cuda:I,J,... (cli/config.h); the count against pipeline.stages is
// checked by check_gpus once the pipeline is read.
void read_device(const Reader& r, const YAML::Node& root, TrainConfig* c) {
  const char* expected = "cpu, cuda or cuda:I,J,... (a GPU index per stage)";
  std::string text = c->device;
  r.read(root, "", "device", &text, expected);
  const size_t colon = text.find(':');
  c->device = text.substr(0, colon);
  const auto bad = [&](const std::string& why) {
    return UserError(r.where(root["device"], "device"), why, std::string("use ") + expected);
  };
  if (text == "cpu" || text == "cuda") return;
  if (c->device != "cuda") throw bad("unknown value '" + text + "'");
  for (size_t at = colon + 1;;) {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty() || item.size() > 6 || item.find_first_not_of("0123456789") != std::string::npos)
      throw bad("'" + item + "' in '" + text + "' is no GPU index");
    c->gpus.push_back(std::stoi(item));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
}

void check_gpus(const Reader& r, const YAML::Node& root, const TrainConfig& c) {
  if (c.gpus.size() <= 1 || static_cast<int>(c.gpus.size()) == c.pipeline.stages) return;
  throw UserError(r.where(root["device"], "device"),
                  "names " + std::to_string(c.gpus.size()) + " GPUs for " +
                      std::to_string(c.pipeline.stages) + " pipeline stage(s)",
                  "name one GPU per stage, or one GPU for every stage");
}

// relative_to, read before any path (cli/config.h).
void read_relative_to(Reader& r, const YAML::Node& root, TrainConfig* c) {
  if (!root.IsMap()) return;  // read_sections says what the top level should be
  r.read(root, "", "relative_to", &c->relative_to, "config or working_folder");
  r.one_of(root, "", "relative_to", c->relative_to, {"config", "working_folder"});
  if (c->relative_to == "config") r.read_paths_from_its_folder();
}

void read_sections(const Reader& r, const YAML::Node& root, TrainConfig* c) {
  r.check_keys(root, "", {"model", "dims", "loss", "data", "optimizer", "pipeline", "parameters",
                          "device", "threads", "seed", "steps", "eval_every", "checkpoint",
                          "output", "dropout", "precision", "parallel", "relative_to", "memory",
                          "fuse_attention_from"});
  read_path(r, root, "", "model", &c->model, "a model file");
  if (c->model.empty())
    throw UserError(r.where(root, "model"), "is missing", "name the ONNX model to train");
  if (!path_exists(c->model))
    throw UserError(r.where(root["model"], "model"), "file '" + c->model + "' does not exist",
                    "check the path (" + c->path_rule("model") + ")");
  if (const YAML::Node d = root["dims"]) {
    if (!d.IsMap()) throw UserError(r.where(d, "dims"), "expected a map of name: size", "write dims: {batch: 8}");
    for (const auto& kv : d) {
      if (!kv.first.IsScalar() || kv.first.Scalar().empty())
        throw UserError(r.where(d, "dims"), "holds a key that is not a dimension's name", "write dims: {batch: 8}");
      const std::string name = kv.first.as<std::string>();
      int64_t v = 0;
      r.read(d, "dims", name.c_str(), &v, "a whole number");
      r.positive(d, "dims", name.c_str(), v, 1);
      c->dims[name] = v;
    }
  }
  read_device(r, root, c);
  if (const YAML::Node par = root["parallel"]) {
    r.check_keys(par, "parallel", {"pipeline", "data", "zero"});
    r.read(par, "parallel", "data", &c->parallel.data, "a whole number");
    r.positive(par, "parallel", "data", c->parallel.data, 1);
    r.read(par, "parallel", "zero", &c->parallel.zero, "0 or 1");
    if (c->parallel.zero != 0 && c->parallel.zero != 1)
      throw UserError(r.where(par["zero"], "parallel.zero"), "must be 0 or 1, got " + std::to_string(c->parallel.zero),
                      "use zero: 1 (optimizer state sharded over the data-parallel replicas) or 0");
  }
  r.read(root, "", "precision", &c->precision, "fp32, bf16 or fp16");
  r.one_of(root, "", "precision", c->precision, {"fp32", "bf16", "fp16"});
  if (c->precision != "fp32" && c->device != "cuda")
    throw UserError(r.where(root["precision"], "precision"), c->precision + " runs on the CUDA backend only",
                    "set device: cuda, or precision: fp32");
  r.read(root, "", "threads", &c->threads, "a whole number");
  r.positive(root, "", "threads", c->threads, 1);
  r.read(root, "", "fuse_attention_from", &c->fuse_attention_from, "a whole number of keys");
  r.positive(root, "", "fuse_attention_from", c->fuse_attention_from, 1);
  r.read(root, "", "seed", &c->seed, "a whole number");
  r.read(root, "", "dropout", &c->dropout, "on or off");
  r.read(root, "", "steps", &c->steps, "a whole number");
  r.positive(root, "", "steps", c->steps, 1);
  r.read(root, "", "eval_every", &c->eval_every, "a whole number");
  r.positive(root, "", "eval_every", c->eval_every, 0);
  if (const YAML::Node m = root["memory"]) {
    r.check_keys(m, "memory", {"check"});
    r.read(m, "memory", "check", &c->memory.check, "on or off");
  }
}

void read_loss_data(const Reader& r, const YAML::Node& root, TrainConfig* c) {
  if (const YAML::Node l = root["loss"]) {
    r.check_keys(l, "loss", {"kind", "output", "ignore_index"});
    r.read(l, "loss", "kind", &c->loss.kind, "cross_entropy, mse or model");
    r.one_of(l, "loss", "kind", c->loss.kind, {"cross_entropy", "mse", "model"});
    r.read(l, "loss", "output", &c->loss.output, "a model output name");
    r.read(l, "loss", "ignore_index", &c->loss.ignore_index, "a whole number");
  }
  if (const YAML::Node d = root["data"]) {
    r.check_keys(d, "data", {"kind", "inputs", "targets", "file", "samples", "shuffle", "eval_fraction"});
    r.read(d, "data", "kind", &c->data.kind, "synthetic, npy or tokens");
    r.one_of(d, "data", "kind", c->data.kind, {"synthetic", "npy", "tokens"});
    if (const YAML::Node in = d["inputs"]) {
      if (!in.IsMap()) throw UserError(r.where(in, "data.inputs"), "expected a map of input: file", "write inputs: {input: x.npy}");
      for (const auto& kv : in) {
        std::string file;
        read_path(r, in, "data.inputs", kv.first.as<std::string>().c_str(), &file, "a file name");
        c->data.inputs[kv.first.as<std::string>()] = file;
      }
    }
    read_path(r, d, "data", "targets", &c->data.targets, "a file name");
    read_path(r, d, "data", "file", &c->data.file, "a file name");
    r.read(d, "data", "samples", &c->data.samples, "a whole number");
    r.positive(d, "data", "samples", c->data.samples, 1);
    r.read(d, "data", "shuffle", &c->data.shuffle, "true or false");
    r.read(d, "data", "eval_fraction", &c->data.eval_fraction, "a number in [0, 1)");
    if (c->data.eval_fraction < 0 || c->data.eval_fraction >= 1)
      throw UserError(r.where(d["eval_fraction"], "data.eval_fraction"),
                      "must be in [0, 1), got " + std::to_string(c->data.eval_fraction), "hold out less");
    const auto need_file = [&](const std::string& file, const char* key) {
      if (!file.empty() && !path_exists(file))
        throw UserError(r.where(d[key], std::string("data.") + key), "file '" + file + "' does not exist",
                        "check the path (" + c->path_rule(std::string("data.") + key) + ")");
    };
    need_file(c->data.targets, "targets");
    need_file(c->data.file, "file");
    for (const auto& [name, file] : c->data.inputs)
      if (!path_exists(file))
        throw UserError(r.where(d["inputs"][name], "data.inputs." + name), "file '" + file + "' does not exist",
                        "check the path (" + c->path_rule("data.inputs." + name) + ")");
    if (c->data.kind == "npy" && (c->data.inputs.empty() || c->data.targets.empty()))
      throw UserError(r.where(d, "data"), "npy data needs inputs and targets", "add inputs: {NAME: FILE.npy} and targets: FILE.npy");
    if (c->data.kind == "tokens" && c->data.file.empty())
      throw UserError(r.where(d, "data"), "token data needs a file", "add file: TOKENS.bin");
  }
}

void read_optimizer(const Reader& r, const YAML::Node& root, TrainConfig* c) {
  const YAML::Node o = root["optimizer"];
  if (!o) return;
  const std::string p = "optimizer";
  r.check_keys(o, p, {"kind", "lr", "momentum", "nesterov", "betas", "eps", "weight_decay",
                      "clip_grad_norm", "warmup_steps", "schedule", "min_lr"});
  TrainConfig::Optimizer& x = c->optimizer;
  r.read(o, p, "kind", &x.kind, "sgd or adamw");
  r.one_of(o, p, "kind", x.kind, {"sgd", "adamw"});
  r.read(o, p, "lr", &x.lr, "a number");
  r.read(o, p, "momentum", &x.momentum, "a number");
  r.read(o, p, "nesterov", &x.nesterov, "true or false");
  r.read(o, p, "eps", &x.eps, "a number");
  r.read(o, p, "weight_decay", &x.weight_decay, "a number");
  r.read(o, p, "clip_grad_norm", &x.clip_grad_norm, "a number");
  r.read(o, p, "warmup_steps", &x.warmup_steps, "a whole number");
  r.read(o, p, "schedule", &x.schedule, "constant or cosine");
  r.one_of(o, p, "schedule", x.schedule, {"constant", "cosine"});
  r.read(o, p, "min_lr", &x.min_lr, "a number");
  if (const YAML::Node b = o["betas"]) {
    if (!b.IsSequence() || b.size() != 2)
      throw UserError(r.where(b, "optimizer.betas"), "expected two numbers", "write betas: [0.9, 0.999]");
    try {
      x.beta1 = b[0].as<double>();
      x.beta2 = b[1].as<double>();
    } catch (const YAML::Exception&) {
      throw UserError(r.where(b, "optimizer.betas"), "expected two numbers", "write betas: [0.9, 0.999]");
    }
  }
  const auto range = [&](const char* key, double v, double lo, double hi, const char* text) {
    if (v >= lo && v < hi) return;
    throw UserError(r.where(o[key] ? o[key] : o["betas"], p + "." + key),
                    "must be " + std::string(text) + ", got " + std::to_string(v), "change it");
  };
  if (!(x.lr > 0))
    throw UserError(r.where(o["lr"], "optimizer.lr"), "must be positive, got " + std::to_string(x.lr),
                    "give a learning rate such as 3e-4");
  range("momentum", x.momentum, 0, 1, "in [0, 1)");
  range("weight_decay", x.weight_decay, 0, 1e9, "at least 0");
  range("clip_grad_norm", x.clip_grad_norm, 0, 1e30, "at least 0");
  range("betas", x.beta1, 0, 1, "in [0, 1)");
  range("betas", x.beta2, 0, 1, "in [0, 1)");
  r.positive(o, p, "warmup_steps", x.warmup_steps, 0);
}

// parallel.pipeline: P, Megatron's and DeepSpeed's word for the stages, is pipeline.stages by
// another name. Given both with different values, the command line's (--set) wins over the
// file's; both in the file, or both with --set, is one line.
void read_parallel_pipeline(const Reader& r, const YAML::Node& root, const YAML::Node& pipeline, TrainConfig* c) {
  const YAML::Node par = root["parallel"];
  if (!par || !par["pipeline"]) return;
  int stages = 0;
  r.read(par, "parallel", "pipeline", &stages, "a whole number");
  r.positive(par, "parallel", "pipeline", stages, 1);
  const auto from_set = [&](const YAML::Node& n, const std::string& key) { return r.where(n, key).rfind("--set ", 0) == 0; };
  const bool written = pipeline && pipeline["stages"];
  if (written && c->pipeline.stages != stages) {
    const bool p_set = from_set(par["pipeline"], "parallel.pipeline"), s_set = from_set(pipeline["stages"], "pipeline.stages");
    if (p_set == s_set)
      throw UserError(r.where(par["pipeline"], "parallel.pipeline"),
                      std::to_string(stages) + " pipeline stages, but pipeline.stages says " + std::to_string(c->pipeline.stages),
                      "give the stages once (parallel.pipeline or pipeline.stages)");
    if (!p_set) return;  // --set pipeline.stages over the file's parallel.pipeline
  }
  c->pipeline.stages = stages;
}

void read_pipeline(const Reader& r, const YAML::Node& root, TrainConfig* c) {
  if (const YAML::Node q = root["pipeline"]) {
    const std::string p = "pipeline";
    r.check_keys(q, p, {"stages", "chunks", "micro_batches", "schedule", "partition", "cut_after", "recompute",
                        "memory_limit", "link", "bandwidth", "latency", "device_rate", "plan"});
    r.read(q, p, "stages", &c->pipeline.stages, "a whole number");
    r.positive(q, p, "stages", c->pipeline.stages, 1);
    r.read(q, p, "chunks", &c->pipeline.chunks, "a whole number");
    r.positive(q, p, "chunks", c->pipeline.chunks, 0);
    r.read(q, p, "micro_batches", &c->pipeline.micro_batches, "a whole number");
    r.positive(q, p, "micro_batches", c->pipeline.micro_batches, 1);
    r.read(q, p, "schedule", &c->pipeline.schedule, "a schedule kind or a CSV file");
    if (is_csv_schedule(c->pipeline.schedule)) c->pipeline.schedule = r.resolve(q["schedule"], "pipeline.schedule", c->pipeline.schedule);
    r.read(q, p, "partition", &c->pipeline.partition, "balanced, params, uniform or manual");
    r.one_of(q, p, "partition", c->pipeline.partition, {"balanced", "params", "uniform", "manual"});
    if (const YAML::Node cuts = q["cut_after"]) {
      if (!cuts.IsSequence())
        throw UserError(r.where(cuts, "pipeline.cut_after"), "expected a list of node names",
                        "write cut_after: [/blocks.1/Add_1, /blocks.3/Add_1]");
      for (const auto& item : cuts) c->pipeline.cut_after.push_back(item.as<std::string>());
    }
    if ((c->pipeline.partition == "manual") != !c->pipeline.cut_after.empty())
      throw UserError(r.where(q[c->pipeline.cut_after.empty() ? "partition" : "cut_after"],
                              c->pipeline.cut_after.empty() ? "pipeline.partition" : "pipeline.cut_after"),
                      c->pipeline.cut_after.empty() ? "manual needs pipeline.cut_after, the nodes to cut after"
                                                    : "applies only to partition: manual",
                      c->pipeline.cut_after.empty() ? "list the nodes (`pipetrain inspect --nodes` names them)"
                                                    : "set pipeline.partition: manual, or drop cut_after");
    r.read(q, p, "recompute", &c->pipeline.recompute, "a recompute policy");
    r.read(q, p, "memory_limit", &c->pipeline.memory_limit, "a size such as 8GiB");
    r.read(q, p, "plan", &c->pipeline.plan, "auto");
    if (q["plan"]) r.one_of(q, p, "plan", c->pipeline.plan, {"auto"});
    LinkArgs& l = c->pipeline.link;
    r.read(q, p, "link", &l.preset, "none, cpu, nvlink, pcie or tcp");
    r.read(q, p, "bandwidth", &l.bandwidth, "bytes per second such as 10GB/s");
    r.read(q, p, "latency", &l.latency, "a time such as 50us");
    r.read(q, p, "device_rate", &l.device_rate, "GFLOP/s");
    if (l.device_rate < 0)
      throw UserError(r.where(q["device_rate"], "pipeline.device_rate"), "must be positive", "give GFLOP/s, e.g. 100");
    LinkArgs check = l;  // a bad value is refused here, where the runtime's preset is not known
    if (check.preset.empty()) check.preset = "none";
    link_model(check, [&](const std::string& key) {
      return q[key] ? r.where(q[key], "pipeline." + key) : "config: pipeline." + key;
    });
  }
  read_parallel_pipeline(r, root, root["pipeline"], c);
  if (const YAML::Node f = root["parameters"]) {
    r.check_keys(f, "parameters", {"frozen", "tied", "untied", "trained"});
    const std::pair<const char*, std::vector<std::string>*> lists[] = {{"frozen", &c->frozen},
        {"tied", &c->parameters.tied}, {"untied", &c->parameters.untied}, {"trained", &c->parameters.trained}};
    for (const auto& [key, into] : lists)
      if (const YAML::Node list = f[key]) {
        if (!list.IsSequence())
          throw UserError(r.where(list, std::string("parameters.") + key), "expected a list of names or globs",
                          std::string("write ") + key + ": [mask, \"*.running_*\"]");
        for (const auto& item : list) into->push_back(item.as<std::string>());
      }
  }
  if (const YAML::Node k = root["checkpoint"]) {
    r.check_keys(k, "checkpoint", {"dir", "every"});
    read_path(r, k, "checkpoint", "dir", &c->checkpoint.dir, "a folder");
    r.read(k, "checkpoint", "every", &c->checkpoint.every, "a whole number");
    r.positive(k, "checkpoint", "every", c->checkpoint.every, 0);
  }
  if (const YAML::Node o = root["output"]) {
    r.check_keys(o, "output", {"model", "safetensors", "start_state", "metrics", "trace", "timeline", "dtype"});
    read_path(r, o, "output", "model", &c->output.model, "a file name");
    read_path(r, o, "output", "safetensors", &c->output.safetensors, "a file name");
    read_path(r, o, "output", "start_state", &c->output.start_state, "a file name");
    read_path(r, o, "output", "metrics", &c->output.metrics, "a file name");
    read_path(r, o, "output", "trace", &c->output.trace, "a file name");
    read_path(r, o, "output", "timeline", &c->output.timeline, "a file name");
    r.read(o, "output", "dtype", &c->output.dtype, "file or fp32");
    r.one_of(o, "output", "dtype", c->output.dtype, {"file", "fp32"});
  }
  // The trained weights go beside the trained model unless output.safetensors says otherwise.
  if (!c->places.count("output.safetensors") && !c->output.model.empty())
    c->output.safetensors = std::filesystem::path(c->output.model).replace_extension(".safetensors").string();
}

// yaml-cpp keeps both entries of a key written twice and reads the first: a second one is an
// error naming both lines, at any depth.
void check_no_duplicate_keys(const YAML::Node& n, const std::string& path, const std::string& prefix) {
  if (n.IsSequence())
    for (const auto& item : n) check_no_duplicate_keys(item, path, prefix);
  if (!n.IsMap()) return;
  std::map<std::string, int> lines;
  for (const auto& kv : n) {
    const std::string k = kv.first.Scalar();
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    const int line = kv.first.Mark().line + 1;
    auto [it, fresh] = lines.emplace(k, line);
    if (!fresh)
      throw UserError(path + ":" + std::to_string(line) + ": " + key,
                      "written twice, on lines " + std::to_string(it->second) + " and " + std::to_string(line),
                      "keep one of them");
    check_no_duplicate_keys(kv.second, path, key);
  }
}

}  // namespace

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node root;
  if (std::error_code ec; std::filesystem::is_directory(path, ec))
    throw UserError(path, "is a folder, not a config file", "give the YAML file, e.g. samples/charlm/train.yaml");
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw UserError(path, "cannot read the config file", "check the path");
  } catch (const YAML::ParserException& e) {
    throw UserError(path + ":" + std::to_string(e.mark.line + 1), "not valid YAML: " + e.msg,
                    "fix the syntax there");
  }
  if (!root || root.IsNull())
    throw UserError(path, "the file is empty (no keys)", "write the config's keys, starting from samples/charlm/train.yaml");
  check_no_duplicate_keys(root, path, "");
  std::vector<std::string> overridden;
  for (const std::string& o : overrides) {
    apply_override(root, o);
    overridden.push_back(o.substr(0, o.find('=')));
  }
  TrainConfig c;
  Reader r(path, &c.places, overridden);
  try {
    read_relative_to(r, root, &c);
    read_sections(r, root, &c);
    read_loss_data(r, root, &c);
    read_optimizer(r, root, &c);
    read_pipeline(r, root, &c);
  } catch (const YAML::Exception& e) {
    // Every key is read by name with its type checked; what yaml-cpp still refuses (a key that is
    // not a name, an alias it cannot follow) is named by its line.
    throw UserError(path + (e.mark.is_null() ? "" : ":" + std::to_string(e.mark.line + 1)),
                    "cannot read this part of the config: " + e.msg, "write it as samples/charlm/train.yaml does");
  }
  check_gpus(r, root, c);
  return c;
}

}  // namespace pt
