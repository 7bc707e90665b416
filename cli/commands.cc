#include "cli/commands.h"

#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>

#include "cli/driver.h"
#include "cli/schedule_args.h"
#include "cli/suggest.h"
#include "core/error.h"

namespace pt {
namespace {

constexpr const char* kVersion = "pipetrain 0.1.0";

void add_backward_args(CLI::App* cmd, BackwardArgs* b) {
  cmd->add_option("--loss", b->loss, "cross_entropy | mse | model (the output is the loss)");
  cmd->add_option("--loss-output", b->loss_output, "model output the loss reads (default: first)");
  cmd->add_option("--ignore-index", b->ignore_index, "cross_entropy: targets equal to it count nowhere");
  cmd->add_option("--recompute", b->recompute,
                  "none | full | every:N | selective | budget:BYTES; one, one per stage, or one per chunk "
                  "separated by commas");
  cmd->add_option("--frozen", b->frozen, "parameters (names or globs) that get no gradient")
      ->delimiter(',');
}

void add_model_args(CLI::App* cmd, ModelArgs* m, bool required = true) {
  CLI::Option* model = cmd->add_option("model", m->model, "ONNX model file");
  if (required) model->required();
  cmd->add_option("--micro-batch,-b", m->micro_batch, "binds the batch dimension")
      ->check(at_least_one())
      ->each([m](const std::string&) { m->micro_batch_given = true; });
  cmd->add_option("--dim", m->dims, "binds a named symbolic dimension: NAME=VALUE (repeatable)");
  cmd->add_option("--tied", m->tied, "initializers (names or globs) kept as one parameter where import would untie them");
  cmd->add_option("--untied", m->untied, "initializers (names or globs) given one copy per module that reads them");
  cmd->add_option("--trained", m->trained,
                  "constants the exporter folded from parameters (names or globs), trained as the file holds them");
}

}  // namespace

void add_fuse_attention_option(CLI::App* cmd, int64_t* from) {
  cmd->add_option("--fuse-attention-from", *from,
                  "fuses an attention over at least this many keys into one CPU kernel (default 256; 1: every one)")
      ->check(at_least_one());
}

void plan_gives(CLI::App* cmd, CLI::Option* plan, std::initializer_list<const char*> flags) {
  for (const char* f : flags) plan->excludes(cmd->get_option(f));
}

void add_link_args(CLI::App* cmd, LinkArgs* l) {
  cmd->add_option("--link", l->preset,
                  "how devices are joined, pricing transfers: none | cpu (default: stages in "
                  "one process) | nvlink | pcie | tcp");
  cmd->add_option("--bandwidth", l->bandwidth, "bytes per second between devices, e.g. 1GB/s (overrides --link's)");
  cmd->add_option("--latency", l->latency, "time per message, e.g. 50us (overrides --link's)");
  cmd->add_option("--device-rate", l->device_rate,
                  "GFLOP/s a device computes, converting transfer times to the cost model's units "
                  "(overrides --link's)")
      ->check(CLI::PositiveNumber);
}

namespace {

struct Command {
  const char* name;
  const char* help;
  std::function<void(CLI::App*)> define;  // adds options, binding them to the args below
  std::function<int()> run;
};

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"pipetrain: train ONNX models with pipeline parallelism"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kVersion, "print the version and exit");
  InspectArgs inspect;
  PartitionArgs partition;
  RunArgs forward;
  GradArgs grad;
  ScheduleArgs schedule;
  PlanArgs plan;
  TrainArgs train;

  const std::vector<Command> commands = {
      {"version", "print the version", [](CLI::App*) {}, [] { std::cout << kVersion << "\n"; return 0; }},
      {"ops", "print the table of supported ops", [](CLI::App*) {}, [] { return run_ops(); }},
      {"inspect", "ops, parameters, FLOPs per sample, unsupported ops",
       [&](CLI::App* c) {
         add_model_args(c, &inspect.model);
         add_fuse_attention_option(c, &inspect.model.fuse_attention_from);
         c->add_flag("--nodes", inspect.nodes, "list every node with its cost");
         c->add_flag("--json", inspect.json, "print one JSON object");
       },
       [&] { return run_inspect(inspect); }},
      {"partition", "cut the model into balanced stages; --export writes them as ONNX",
       [&](CLI::App* c) {
         add_model_args(c, &partition.model, false);
         c->add_option("--stages,-s", partition.stages, "pipeline stages (devices)")->check(at_least_one());
         CLI::Option* plan = c->add_option("--plan", partition.plan,
                                           "the cuts of this plan (`plan --write`): its model, stages, chunks "
                                           "and link, on the graph train trains");
         c->add_option("--strategy", partition.strategy, "balanced | params | uniform | manual");
         c->add_option("--cut-after", partition.cut_after, "manual: node names to cut after")
             ->delimiter(',');
         c->add_option("--memory-limit", partition.memory_limit,
                       "per device: parameters, optimizer state, activations in flight");
         c->add_option("--slack", partition.slack,
                       "balanced: splits within this fraction of the best bottleneck may be "
                       "chosen for fewer bytes crossing cuts (0: exact minimum)")
             ->check(CLI::NonNegativeNumber);
         add_link_args(c, &partition.link);
         c->add_option("--chunks-per-stage", partition.chunks_per_stage,
                       "chunks per device (2: V-shaped placement)")
             ->check(at_least_one());
         c->add_option("--export", partition.export_dir, "write stage_K.onnx files here");
         c->add_flag("--json", partition.json, "print one JSON object");
         c->add_flag("--backward", partition.backward,
                     "also build each stage's F, B (input gradients) and W (weight gradients); "
                     "with --export writes stage_K_fwd/_bwd_input/_bwd_weight.onnx");
         c->add_flag("--portable", partition.portable,
                     "export backward graphs in standard ONNX ops only (onnxruntime runs them)");
         add_backward_args(c, &partition.bwd);
         plan_gives(c, plan, {"model", "--micro-batch", "--dim", "--stages", "--strategy", "--cut-after",
                              "--chunks-per-stage", "--link", "--bandwidth", "--latency", "--device-rate"});
       },
       [&] { return run_partition(partition); }},
      {"run", "forward inference on the CPU; every output written as .npy",
       [&](CLI::App* c) {
         c->add_option("model", forward.model, "ONNX model file")->required();
         c->add_option("--input,-i", forward.inputs, "NAME=FILE.npy (repeatable; none for a model without inputs)");
         c->add_option("--dim", forward.dims, "binds a named symbolic dimension: NAME=VALUE");
         c->add_option("--output,-o", forward.output_dir, "folder for the outputs")->required();
         c->add_option("--threads,-t", forward.threads, "CPU threads")->check(at_least_one());
         c->add_option("--repeats,-r", forward.repeats, "forward passes to time (prints the median)")
             ->check(at_least_one());
         add_fuse_attention_option(c, &forward.fuse_attention_from);
       },
       [&] { return run_forward(forward); }},
      {"grad", "one step's loss and parameter gradients on the CPU, written as .npy",
       [&](CLI::App* c) {
         c->add_option("model", grad.model, "ONNX model file")->required();
         c->add_option("--input,-i", grad.inputs, "NAME=FILE.npy, the global batch (repeatable)")
             ->required();
         c->add_option("--target", grad.target, ".npy of class indices (int64) or targets")
             ->required();
         c->add_option("--dim", grad.dims, "binds a named symbolic dimension: NAME=VALUE");
         c->add_option("--stages,-s", grad.stages, "pipeline stages")->check(at_least_one());
         add_fuse_attention_option(c, &grad.fuse_attention_from);
         c->add_option("--micro-batches,-m", grad.micro_batches, "split the batch into these")
             ->check(at_least_one());
         c->add_option("--threads,-t", grad.threads, "CPU threads")->check(at_least_one());
         c->add_option("--output,-o", grad.output_dir, "folder for loss.npy and the gradients")
             ->required();
         add_backward_args(c, &grad.bwd);
       },
       [&] { return run_grad(grad); }},
      {"train", "train a model as config.yaml says: pipelined, with progress, metrics, checkpoints",
       [&](CLI::App* c) {
         c->add_option("config", train.config, "the YAML config (see docs/configuration.md)")->required();
         c->add_option("--set", train.set, "override a config key: dotted.key=value (repeatable)");
         CLI::Option* resume = c->add_flag("--resume", train.resume, "continue from checkpoint.dir's latest checkpoint");
         c->add_flag("--overwrite", train.overwrite,
                     "start over: delete the checkpoints checkpoint.dir holds from an earlier run")
             ->excludes(resume);
         c->add_flag("--quiet,-q", train.quiet, "no progress lines");
         c->add_flag("--profile", train.profile,
                     "time every kernel from the second step on (slower steps) and print where the "
                     "step's time goes, per pass and op type, and its ten slowest nodes");
       },
       [&] { return run_train(train); }},
      {"schedule", "build or read a pipeline schedule; check, simulate and draw it",
       [&](CLI::App* c) { add_schedule_options(c, &schedule); },
       [&] { return run_schedule(schedule); }},
      {"plan", "choose chunks, cuts, recompute and schedule under a memory cap; --write a train config",
       [&](CLI::App* c) { add_plan_options(c, &plan); },
       [&] { return run_plan(plan); }},
  };

  std::vector<std::pair<CLI::App*, const Command*>> subs;
  for (const Command& cmd : commands) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.help);
    cmd.define(sub);
    subs.push_back({sub, &cmd});
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    bool command = false;  // argv[1] names a subcommand
    for (auto& [sub, cmd] : subs) command = command || (argc > 1 && sub->get_name() == argv[1]);
    std::cerr << "error: " << explain_parse_error(app, argc, argv, e.what()) << "; see `pipetrain "
              << (command ? std::string(argv[1]) + " " : "") << "--help`\n";
    return 2;
  }
  try {
    for (auto& [sub, cmd] : subs)
      if (sub->parsed()) return cmd->run();
  } catch (const UserError& e) {
    std::cout.flush();
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 2;
}

}  // namespace pt
