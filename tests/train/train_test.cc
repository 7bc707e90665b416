// `pipetrain train` as a user runs it: what it writes, that a run killed with SIGKILL resumes to
// the very parameters of an uninterrupted run with no checkpoint ever half-written, and that bad
// configs get one line naming the YAML line.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <thread>

#include "train/checkpoint.h"
#include "onnx_import/export.h"
#include "exec/npy.h"
#include "onnx_import/load.h"
#include "onnx_import/proto_convert.h"
#include "tests/cli/run_cli.h"
#include "tests/exec/safetensors_reader.h"

namespace {

std::string mlp_config(const fs::path& dir, int steps, int every) {
  std::ostringstream c;
  c << "model: samples/mlp/mlp.onnx\n"
    << "dims: {batch: 4}\n"
    << "data: {kind: synthetic, samples: 64, eval_fraction: 0.25}\n"
    << "optimizer: {kind: adamw, lr: 3.0e-3, clip_grad_norm: 1.0, warmup_steps: 2, schedule: cosine}\n"
    << "pipeline: {stages: 2, micro_batches: 4, schedule: zb-h1}\n"
    << "steps: " << steps << "\n"
    << "eval_every: 10\n"
    << "checkpoint: {dir: " << (dir / "ckpt").string() << ", every: " << every << "}\n"
    << "output: {model: " << (dir / "trained.onnx").string() << ", metrics: "
    << (dir / "metrics.jsonl").string() << ", trace: " << (dir / "trace.json").string()
    << ", timeline: " << (dir / "timeline.svg").string() << "}\n";
  return c.str();
}

std::vector<nlohmann::json> metric_lines(const fs::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Train, LearnsAndWritesEveryOutput) {
  const fs::path d = scratch("outputs");
  const Result r = run("train " + write(d / "c.yaml", mlp_config(d, 40, 20)).string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("eval after step 40: loss"), std::string::npos) << r.out;
  // Metrics: a line per step (loss, lr, bubble...) and one per evaluation.
  std::vector<double> losses;
  int evals = 0;
  int summaries = 0;
  for (const auto& j : metric_lines(d / "metrics.jsonl")) {
    if (j.contains("summary")) {
      ++summaries;
      EXPECT_EQ(j["summary"]["peak_kept_bytes_measured"], j["summary"]["peak_kept_bytes_planned"]);
      EXPECT_EQ(j["summary"]["chunk_costs_s"].size(), 2u);
      continue;
    }
    if (j.contains("eval_loss")) {
      ++evals;
      EXPECT_GE(j["eval_accuracy"].get<double>(), 0.0);
      continue;
    }
    EXPECT_EQ(j["step"].get<int>(), static_cast<int>(losses.size()) + 1);
    for (const char* key : {"lr", "grad_norm", "samples_per_s", "bubble", "peak_kept_bytes"})
      EXPECT_TRUE(j.contains(key)) << key;
    losses.push_back(j["loss"].get<double>());
  }
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_EQ(evals, 4);
  EXPECT_EQ(summaries, 1);
  // 48 training samples of random labels, seen 13 times: memorised, the loss falls.
  EXPECT_LT(losses.back(), 0.8 * losses.front());
  // The measured peak kept bytes per device equal the plan.
  const std::regex peak("peak kept activations per device, measured / planned: ([^\n]*)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, peak)) << r.out;
  const std::regex pair("([0-9.]+ [KMG]?i?B) / ([0-9.]+ [KMG]?i?B)");
  const std::string pairs = m[1];
  int devices = 0;
  for (std::sregex_iterator it(pairs.begin(), pairs.end(), pair), end; it != end; ++it, ++devices)
    EXPECT_EQ((*it)[1], (*it)[2]) << pairs;
  EXPECT_EQ(devices, 2);
  // Trace: complete events on one track per device; timeline: an SVG with both rows of boxes.
  const auto trace = nlohmann::json::parse(slurp(d / "trace.json"));
  std::set<int> tracks;
  std::map<int, std::string> track_names;  // "M" thread_name events name each track
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") track_names[e["tid"].get<int>()] = e["args"]["name"];
      continue;
    }
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    tracks.insert(e["tid"].get<int>());
  }
  EXPECT_EQ(tracks, (std::set<int>{0, 1}));
  EXPECT_EQ(track_names, (std::map<int, std::string>{{0, "device 0"}, {1, "device 1"}}));
  const std::string svg = slurp(d / "timeline.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("measured (last step)"), std::string::npos);
  EXPECT_NE(svg.find("simulated on measured costs"), std::string::npos);
  EXPECT_NE(svg.find(">time (ms)</text>"), std::string::npos);  // one axis, in ms
  EXPECT_NE(svg.find(">F forward</text>"), std::string::npos);  // the legend
  EXPECT_EQ(svg.find(" s</title>"), std::string::npos);
  // The trained model is the input model with new weights.
  EXPECT_TRUE(fs::exists(d / "trained.onnx"));
  EXPECT_NE(slurp(d / "trained.onnx"), slurp("samples/mlp/mlp.onnx"));
  // Beside it by default, the trained weights: a file without a module record (mlp, from torch
  // 1.13) gives every trained initializer under its own name, the trained model's bytes.
  EXPECT_NE(r.out.find("trained weights -> " + (d / "trained.safetensors").string() + "\n"), std::string::npos) << r.out;
  const pt::test::StFile st = pt::test::read_safetensors_for_test((d / "trained.safetensors").string());
  const onnx::ModelProto trained = pt::read_model((d / "trained.onnx").string());
  int float_inits = 0;
  for (const auto& t : trained.graph().initializer()) {
    if (t.data_type() != onnx::TensorProto::FLOAT) continue;
    ++float_inits;
    const pt::Tensor want = pt::tensor_from_proto(t, t.name());
    ASSERT_TRUE(st.tensors.count(t.name())) << t.name();
    EXPECT_EQ(st.tensors.at(t.name()).shape, want.type.shape);
    EXPECT_EQ(st.tensors.at(t.name()).bytes, std::string(reinterpret_cast<const char*>(want.data.data()), want.data.size()));
  }
  EXPECT_EQ(st.tensors.size(), static_cast<size_t>(float_inits));
  EXPECT_EQ(float_inits, 8);
}

// Starts `pipetrain args` in the background; returns its pid.
pid_t spawn(const std::string& args, const fs::path& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd = std::string(PT_BINARY) + " " + args + " >" + log.string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int64_t latest_step(const fs::path& dir) {
  std::ifstream in(dir / "latest");
  std::string name;
  if (!std::getline(in, name) || name.size() < 13) return -1;
  return std::stoll(name.substr(5, 8));
}

// Killed (SIGKILL) after its first checkpoints, then resumed: the trained model is byte for byte
// the uninterrupted run's, and every checkpoint file on disk reads whole.
TEST(Train, ResumeAfterSigkillMatchesAnUninterruptedRun) {
  const fs::path whole = scratch("whole"), cut = scratch("cut");
  const std::string steps = "steps: 400\n";
  std::string base = mlp_config(whole, 400, 10);
  ASSERT_EQ(run("train -q " + write(whole / "c.yaml", base).string()).code, 0);

  const fs::path cfg = write(cut / "c.yaml", mlp_config(cut, 400, 10));
  const pid_t pid = spawn("train -q " + cfg.string(), cut / "log1.txt");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (latest_step(cut / "ckpt") < 30 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run ended before it could be killed: " << slurp(cut / "log1.txt");
  const int64_t reached = latest_step(cut / "ckpt");
  ASSERT_GE(reached, 30);
  ASSERT_LT(reached, 400);
  for (const auto& e : fs::directory_iterator(cut / "ckpt")) {
    if (e.path().extension() == ".ckpt") {
      EXPECT_NO_THROW(pt::read_checkpoint(e.path().string())) << e.path();
    }
  }

  const Result r = run("train --resume " + cfg.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from step " + std::to_string(reached)), std::string::npos) << r.out;
  EXPECT_EQ(slurp(cut / "trained.onnx"), slurp(whole / "trained.onnx"));
  EXPECT_EQ(slurp(cut / "trained.safetensors"), slurp(whole / "trained.safetensors"));
  // The metrics hold each step once, as the uninterrupted run's do.
  std::vector<int> seen;
  for (const auto& j : metric_lines(cut / "metrics.jsonl"))
    if (j.contains("loss")) seen.push_back(j["step"].get<int>());
  ASSERT_EQ(seen.size(), 400u);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], static_cast<int>(i) + 1);
}

// Each bad config: exit 2, one line, the file and YAML line of the key at fault first.
TEST(Train, BadConfigsNameTheYamlLine) {
  const fs::path d = scratch("bad");
  pt::Tensor x;
  x.type = pt::TensorType{pt::DType::kFloat32, {16, 5}};
  x.data.resize(static_cast<size_t>(x.type.bytes()));
  pt::write_npy(x, (d / "x.npy").string());
  pt::Tensor y;
  y.type = pt::TensorType{pt::DType::kInt64, {16}};
  y.data.resize(static_cast<size_t>(y.type.bytes()));
  pt::write_npy(y, (d / "y.npy").string());
  const std::string head = "model: samples/mlp/mlp.onnx\ndims: {batch: 4}\n";
  struct Case {
    std::string name, yaml, start;
  };
  const std::string c = (d / "c.yaml").string();
  const std::vector<Case> cases = {
      {"unknown key", head + "stepz: 3\n", c + ":3: stepz: unknown key"},
      {"wrong type", head + "steps: many\n", c + ":3: steps: expected a whole number, got 'many'"},
      {"too many stages", head + "pipeline:\n  stages: 500\n", c + ":4: pipeline.stages: "},
      {"missing data file", head + "data:\n  kind: npy\n  inputs: {input: " + (d / "x.npy").string() +
                                "}\n  targets: " + (d / "nope.npy").string() + "\n",
       c + ":6: data.targets: file '" + (d / "nope.npy").string() + "' does not exist"},
      {"shape that does not fit", head + "data:\n  kind: npy\n  inputs: {input: " + (d / "x.npy").string() +
                                      "}\n  targets: " + (d / "y.npy").string() + "\n",
       c + ":5: data.inputs.input: "},
      {"unknown schedule", head + "pipeline: {stages: 2, schedule: zb-q}\n", c + ":3: pipeline.schedule: "},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    write(d / "c.yaml", k.yaml);
    const Result r = run("train " + c);
    expect_one_line_error_starting(r, k.start);
  }
  // Nothing was written for the failed runs.
  EXPECT_EQ(temp_files_in("out"), 0);
}

// A quick try shorter than the configured warm-up runs, with one line saying how the warm-up was
// shortened (the main job's own config has 20 warm-up steps; `--set steps=3` must still train).
// A config without `data:` trains on synthetic samples and says so, once, at the start, with how
// to give real data; one that names its data (synthetic included) and a quiet run (-q) do not.
TEST(Train, WithoutDataItSaysItTrainsOnSyntheticSamples) {
  const fs::path d = scratch("no_data");
  const fs::path cfg = write(d / "c.yaml", "model: samples/mlp/mlp.onnx\ndims: {batch: 2}\nsteps: 1\n");
  const Result r = run("train " + cfg.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string line = "data: the config names none, so this run trains on 256 synthetic samples (seeded random "
                           "inputs and targets); to train on yours add data: {kind: npy, inputs: {input: FILE.npy}, "
                           "targets: FILE.npy} or {kind: tokens, file: FILE}\n";
  EXPECT_EQ(r.out.rfind(line, 0), 0u) << r.out;  // the first line
  EXPECT_EQ(r.out.find("synthetic", line.size()), std::string::npos) << r.out;
  const Result named = run("train " + cfg.string() + " --set data.kind=synthetic");
  ASSERT_EQ(named.code, 0) << named.err;
  EXPECT_EQ(named.out.find("synthetic"), std::string::npos) << named.out;
  EXPECT_EQ(run("train " + cfg.string() + " -q").out.find("synthetic"), std::string::npos);  // as -q's other notes
}

TEST(Train, ShortRunShortensTheWarmUp) {
  const fs::path d = scratch("short");
  write(d / "c.yaml", mlp_config(d, 40, 100));
  const Result r = run("train " + (d / "c.yaml").string() + " --set steps=3 --set optimizer.warmup_steps=20");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("optimizer: warm-up shortened from 20 to 0 steps to fit steps: 3\n"), std::string::npos)
      << r.out;
  EXPECT_EQ(metric_lines(d / "metrics.jsonl").size(), 3u + 2u);  // 3 steps, the final eval, the summary
}

// input [batch, 6] -> MatMul(w) -> Tanh -> MatMul(w) -> Tanh -> MatMul(w) -> output: one weight
// read by three MatMuls (a tie, or initializers an exporter merged). With `dropout`, a Dropout as
// an export made in training mode writes it (ratio and training_mode as initializers, training_mode
// true) follows the first Tanh.
void save_tied_model(const fs::path& path, bool dropout) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("tied");
  auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(out);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
    return out;
  };
  std::string x = node("Tanh", {node("MatMul", {"input", "w"}, "h0")}, "a0");
  if (dropout) x = node("Dropout", {x, "ratio", "training"}, "dropped");
  x = node("Tanh", {node("MatMul", {x, "w"}, "h1")}, "a1");
  node("MatMul", {x, "w"}, "output");
  for (const char* name : {"input", "output"}) {
    auto* vi = std::string(name) == "input" ? g->add_input() : g->add_output();
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    tt->mutable_shape()->add_dim()->set_dim_param("batch");
    tt->mutable_shape()->add_dim()->set_dim_value(6);
  }
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(6);
  w->add_dims(6);
  for (int i = 0; i < 36; ++i) w->add_float_data(0.3f * std::sin(1.7f * static_cast<float>(i)));
  if (dropout) {
    auto* r = g->add_initializer();
    r->set_name("ratio");
    r->set_data_type(onnx::TensorProto::FLOAT);
    r->add_float_data(0.25f);
    auto* t = g->add_initializer();
    t->set_name("training");
    t->set_data_type(onnx::TensorProto::BOOL);
    t->add_int32_data(1);
  }
  pt::save_model(m, path.string());
}

// Trains the model at `path` (MSE on synthetic data, SGD with momentum, 4 micro-batches of 2,
// 3 steps) with the --set overrides in `sets`; returns the trained model's bytes.
std::string train_bytes(const fs::path& d, const fs::path& model, const std::string& name,
                        const std::string& sets) {
  write(d / "c.yaml", "model: " + model.string() + "\n" +
                          "dims: {batch: 2}\nloss: {kind: mse}\n"
                          "data: {kind: synthetic, samples: 24, shuffle: false}\n"
                          "optimizer: {kind: sgd, lr: 0.1, momentum: 0.9}\n"
                          "pipeline: {stages: 1, micro_batches: 4, schedule: 1f1b}\nsteps: 3\n"
                          "output: {metrics: \"\", trace: \"\", timeline: \"\"}\n"
                          "checkpoint: {dir: \"\", every: 0}\n");
  const fs::path out = d / (name + ".onnx");
  const Result r = run("train " + (d / "c.yaml").string() + " -q --set output.model=" + out.string() + sets);
  EXPECT_EQ(r.code, 0) << name << ": " << r.err;
  return slurp(out);
}

// Wherever the cut puts the three readers of one weight, the trained weight has the bits of the
// one-stage run (each reading site accumulates its own gradient, and the sites are added in node
// order before the update).
TEST(Train, AWeightReadAtSeveralStagesTrainsBitIdenticallyToOneStage) {
  const fs::path d = scratch("tied");
  save_tied_model(d / "tied.onnx", false);
  const std::string one = train_bytes(d, d / "tied.onnx", "one", "");
  ASSERT_FALSE(one.empty());
  EXPECT_NE(one, slurp(d / "tied.onnx"));  // the weight trained
  EXPECT_EQ(train_bytes(d, d / "tied.onnx", "two_1f1b", " --set pipeline.stages=2"), one);  // two readers on one stage
  EXPECT_EQ(train_bytes(d, d / "tied.onnx", "three_1f1b", " --set pipeline.stages=3"), one);
  EXPECT_EQ(train_bytes(d, d / "tied.onnx", "three_gpipe", " --set pipeline.stages=3 --set pipeline.schedule=gpipe"), one);
  EXPECT_EQ(train_bytes(d, d / "tied.onnx", "two_zbv",
                        " --set pipeline.stages=2 --set pipeline.schedule=zb-v --set pipeline.chunks=2"),
            one);
}

// GPT-2 exported with optimize=False reads its token ids as Gather(wte, Reshape(ids, [-1, T])):
// synthetic data still finds the range of the ids (the table's rows) through the Reshape.
TEST(Train, SyntheticIdsFindTheirRangeThroughAReshape) {
  const fs::path d = scratch("viewed_ids");
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("viewed_ids");
  auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(out);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
  };
  node("Reshape", {"input", "view"}, "viewed");
  node("Gather", {"table", "viewed"}, "output");
  auto* in = g->add_input();
  in->set_name("input");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
  in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_param("batch");
  in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(4);
  auto* out = g->add_output();
  out->set_name("output");
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  out->mutable_type()->mutable_tensor_type()->mutable_shape();
  auto* view = g->add_initializer();
  view->set_name("view");
  view->set_data_type(onnx::TensorProto::INT64);
  view->add_dims(2);
  view->add_int64_data(-1);
  view->add_int64_data(4);
  auto* table = g->add_initializer();
  table->set_name("table");
  table->set_data_type(onnx::TensorProto::FLOAT);
  table->add_dims(10);
  table->add_dims(3);
  for (int i = 0; i < 30; ++i) table->add_float_data(0.1f * static_cast<float>(i % 7));
  pt::save_model(m, (d / "viewed_ids.onnx").string());
  const std::string trained = train_bytes(d, d / "viewed_ids.onnx", "trained", "");
  ASSERT_FALSE(trained.empty());
  EXPECT_NE(trained, slurp(d / "viewed_ids.onnx"));  // the table trained
}

// A Dropout as a training-mode export writes it (training_mode true, ratio an initializer):
// `train` draws seeded masks, bit-identical across stage counts and schedules, and differs from
// the run without it; `run` (and evaluation) treat it as the identity, as PyTorch's eval() does.
TEST(Train, TrainingModeDropoutTrainsAndRunsAsTheIdentity) {
  const fs::path d = scratch("dropout");
  save_tied_model(d / "plain.onnx", false);
  save_tied_model(d / "dropout.onnx", true);
  const std::string one = train_bytes(d, d / "dropout.onnx", "one", "");
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(train_bytes(d, d / "dropout.onnx", "two_1f1b", " --set pipeline.stages=2"), one);
  EXPECT_EQ(train_bytes(d, d / "dropout.onnx", "two_zbv",
                        " --set pipeline.stages=2 --set pipeline.schedule=zb-v --set pipeline.chunks=2"),
            one);
  train_bytes(d, d / "plain.onnx", "plain_trained", "");
  auto trained_w = [&](const std::string& name) {
    onnx::ModelProto m;
    EXPECT_TRUE(m.ParseFromString(slurp(d / (name + ".onnx"))));
    for (const auto& t : m.graph().initializer())
      if (t.name() == "w") return t.SerializeAsString();
    return std::string();
  };
  ASSERT_FALSE(trained_w("one").empty());
  EXPECT_NE(trained_w("one"), trained_w("plain_trained"));  // the masks changed the update
  pt::Tensor x;
  x.type = pt::TensorType{pt::DType::kFloat32, {3, 6}};
  x.data.resize(static_cast<size_t>(x.type.bytes()));
  for (int i = 0; i < 18; ++i) x.as<float>()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  pt::write_npy(x, (d / "x.npy").string());
  for (const char* m : {"plain", "dropout"}) {
    const Result r = run(std::string("run ") + (d / (std::string(m) + ".onnx")).string() + " --input input=" +
                         (d / "x.npy").string() + " --output " + (d / (std::string(m) + "_out")).string());
    ASSERT_EQ(r.code, 0) << m << ": " << r.err;
  }
  EXPECT_EQ(slurp(d / "dropout_out" / "output.npy"), slurp(d / "plain_out" / "output.npy"));
}

}  // namespace

