#include "train/evaluator.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "autodiff/training_mode.h"
#include "core/error.h"

namespace pt {
namespace {

// The model as evaluation runs it: Dropout the identity (autodiff/training_mode.h), and every
// BatchNormalization on its running statistics, as PyTorch's eval() does. An export made in
// training mode writes training_mode=1 and the running statistics' outputs (which nothing reads:
// to_training_mode refuses the model otherwise); that BatchNormalization would normalize each
// held-out batch by its own statistics and never read the running ones the training keeps.
Graph inference_form(Graph g) {
  dropout_as_identity(g);
  for (Node& n : g.nodes)
    if ((n.domain.empty() || n.domain == "ai.onnx") && n.op_type == "BatchNormalization") {
      n.attrs.erase("training_mode");
      n.outputs.resize(1);
    }
  g.rebuild_uses();
  return g;
}

// The nodes of g that make `targets` from the values named in `available` and the initializers,
// in node order; *read gets the available values they (or the targets themselves) read.
std::vector<Node> nodes_making(const Graph& g, const std::set<std::string>& available, const std::vector<ValueId>& targets,
                               size_t chunk, std::set<ValueId>* read) {
  std::vector<bool> needed(g.nodes.size(), false);
  std::set<ValueId> seen;
  std::vector<ValueId> todo = targets;
  while (!todo.empty()) {
    const ValueId v = todo.back();
    todo.pop_back();
    if (v == kNoValue || !seen.insert(v).second || g.value(v).is_initializer()) continue;
    if (available.count(g.value(v).name)) {
      read->insert(v);
      continue;
    }
    const int p = g.value(v).producer;
    PT_CHECK(p >= 0, "evaluation chunk " + std::to_string(chunk) + " reads '" + g.value(v).name +
                         "', which does not cross into its training chunk");
    needed[static_cast<size_t>(p)] = true;
    for (ValueId in : g.nodes[static_cast<size_t>(p)].inputs) todo.push_back(in);
  }
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (needed[i]) nodes.push_back(g.nodes[i]);
  return nodes;
}

// The message that carries `value` into chunk c.
std::string eval_message(size_t c, const std::string& value) { return "eval/" + std::to_string(c) + "/" + value; }

// The held-out loss summed batch by batch, element by element, as one process sums it.
struct Tally {
  double sum = 0;
  int64_t counted = 0, right = 0;

  void add(const LossSpec& loss, const Buffer& y, const Tensor& target) {
    if (loss.kind == LossSpec::Kind::kModel) {
      sum += *y.as<float>();
      ++counted;
    } else if (loss.kind == LossSpec::Kind::kMse) {
      for (int64_t j = 0; j < y.numel(); ++j) {
        const double d = static_cast<double>(y.as<float>()[j]) - target.as<float>()[j];
        sum += d * d;
      }
      counted += y.numel();
    } else {
      const int64_t classes = y.type->shape.back();
      const int64_t rows = y.numel() / classes;
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t t = target.as<int64_t>()[j];
        if (t == loss.ignore_index) continue;
        const float* z = y.as<float>() + j * classes;
        const int64_t best = std::max_element(z, z + classes) - z;
        double top = z[best], lse = 0;
        for (int64_t k = 0; k < classes; ++k) lse += std::exp(static_cast<double>(z[k]) - top);
        sum += top + std::log(lse) - z[t];
        right += best == t;
        ++counted;
      }
    }
  }
};

}  // namespace

// One chunk of the evaluation. Its graph's inputs cross into it; its outputs are what the next
// chunk reads (the last chunk's: the loss's input).
struct Evaluator::Chunk {
  Graph graph;
  int device = 0;
  bool local = false;            // this process runs it
  std::unique_ptr<StageProgram> program;
  // Per input: a feed (kFeed), the previous chunk's output `previous[j]` on this process, or
  // the message received[j]'s bytes land in.
  static constexpr int kFeed = -1, kReceived = -2;
  std::vector<int> previous;
  std::vector<std::string> message;  // per input that crosses from the previous chunk
  std::vector<std::string> sent_as;  // per output: its message to the next chunk
  std::vector<std::vector<std::byte>> received;
};

Evaluator::Evaluator(const Graph& model, const LossSpec& loss, int threads)
    : Evaluator(model, loss, EvalCut{}, nullptr, threads) {}

Evaluator::Evaluator(const Graph& model, const LossSpec& loss, const EvalCut& cut, Comm* comm, int threads)
    : loss_(loss), backend_(threads), comm_(comm) {
  const Graph g = inference_form(model);
  std::set<std::string> feeds;
  for (ValueId v : g.inputs) feeds.insert(g.value(v).name);
  const size_t n = cut.forwards.empty() ? 1 : cut.forwards.size();
  // From the last chunk back: each makes what the one after it reads.
  std::vector<ValueId> targets = {g.find(loss.output.empty() ? g.value(g.outputs.front()).name : loss.output)};
  chunks_.resize(n);
  for (size_t c = n; c-- > 0;) {
    std::vector<std::string> crossing;  // in the training chunk's input order
    if (cut.forwards.empty()) {
      for (ValueId v : g.inputs) crossing.push_back(g.value(v).name);
    } else {
      for (ValueId v : cut.forwards[c]->inputs) crossing.push_back(cut.forwards[c]->value(v).name);
    }
    std::set<ValueId> read;
    const std::vector<Node> nodes = nodes_making(g, {crossing.begin(), crossing.end()}, targets, c, &read);
    std::vector<ValueId> inputs;
    for (const std::string& name : crossing)
      if (const ValueId v = g.find(name); v != kNoValue && read.count(v)) inputs.push_back(v);
    chunks_[c] = std::make_unique<Chunk>();
    Chunk& k = *chunks_[c];
    k.graph = extract_subgraph(g, g.name + "_eval" + std::to_string(c), nodes, inputs, targets);
    k.device = cut.forwards.empty() ? 0 : cut.placement[c];
    k.local = cut.forwards.empty() || cut.local[static_cast<size_t>(k.device)];
    targets.clear();
    for (ValueId v : inputs)
      if (!feeds.count(g.value(v).name)) targets.push_back(v);
  }
  PT_CHECK(targets.empty(), "the first evaluation chunk reads a value no feed gives");
  // Where each chunk's inputs come from.
  for (size_t c = 0; c < n; ++c) {
    Chunk& k = *chunks_[c];
    for (ValueId v : k.graph.inputs) {
      const std::string& name = k.graph.value(v).name;
      if (feeds.count(name)) {
        k.previous.push_back(Chunk::kFeed);
        k.message.emplace_back();
        continue;
      }
      const Graph& before = chunks_[c - 1]->graph;
      int at = 0;
      while (before.value(before.outputs[static_cast<size_t>(at)]).name != name) ++at;
      k.previous.push_back(chunks_[c - 1]->local ? at : Chunk::kReceived);
      k.message.push_back(eval_message(c, name));
    }
    for (ValueId v : k.graph.outputs) k.sent_as.push_back(c + 1 < n ? eval_message(c + 1, k.graph.value(v).name) : "");
  }
}

Evaluator::~Evaluator() = default;

bool Evaluator::reports() const { return chunks_.back()->local; }

std::vector<std::string> Evaluator::message_names() const {
  std::vector<std::string> out;
  for (const auto& k : chunks_)
    for (const std::string& m : k->message)
      if (!m.empty()) out.push_back(m);
  return out;
}

void Evaluator::compile() {
  for (const auto& k : chunks_) {
    if (!k->local || k->program) continue;
    k->program = std::make_unique<StageProgram>(k->graph, backend_);
    k->received.resize(k->graph.inputs.size());
    for (size_t j = 0; j < k->graph.inputs.size(); ++j)
      if (k->previous[j] == Chunk::kReceived)
        k->received[j].resize(static_cast<size_t>(k->graph.value(k->graph.inputs[j]).type.bytes()));
  }
}

// Chunk c on one held-out batch: its inputs gathered, its program run, its outputs sent on where
// the next chunk is another process's.
void Evaluator::run_chunk(size_t c, const FeedMap& feeds) {
  Chunk& k = *chunks_[c];
  std::vector<Buffer> in;
  for (size_t j = 0; j < k.graph.inputs.size(); ++j) {
    const Value& v = k.graph.value(k.graph.inputs[j]);
    void* data = nullptr;
    if (k.previous[j] == Chunk::kFeed) {
      data = const_cast<std::byte*>(feeds.at(v.name).data.data());
    } else if (k.previous[j] == Chunk::kReceived) {
      comm_->recv(k.message[j], 0, chunks_[c - 1]->device, k.device, k.received[j].data(), k.received[j].size());
      data = k.received[j].data();
    } else {
      data = chunks_[c - 1]->program->output(static_cast<size_t>(k.previous[j])).data;
    }
    in.push_back({data, &v.type});
  }
  k.program->run(in);
  if (c + 1 == chunks_.size() || chunks_[c + 1]->local) return;
  const Chunk& next = *chunks_[c + 1];
  for (size_t o = 0; o < k.graph.outputs.size(); ++o) {
    const Buffer y = k.program->output(o);
    comm_->send(k.sent_as[o], 0, k.device, next.device, y.data, static_cast<size_t>(y.type->bytes()));
  }
}

EvalResult Evaluator::run(const DataLoader& data) {
  compile();
  const bool keyed = std::any_of(chunks_.begin(), chunks_.end(), [](const auto& k) { return k->graph.find(kDropoutKey) != kNoValue; });
  EvalResult r;
  Tally tally;
  for (int64_t i = 0; i < data.eval_batches(); ++i) {
    FeedMap feeds = data.eval_batch(i);
    // A Bernoulli draw of the file (training_mode.h): the same draws at every evaluation.
    if (keyed) feeds[kDropoutKey] = scalar_tensor(dropout_key_for(0, -1, i));
    for (size_t c = 0; c < chunks_.size(); ++c)
      if (chunks_[c]->local) run_chunk(c, feeds);
    if (!reports()) continue;
    r.samples += data.rows();
    tally.add(loss_, chunks_.back()->program->output(output_), feeds.at(kLossTarget));
  }
  if (comm_) comm_->reset();  // every send of this evaluation taken
  r.loss = tally.counted ? tally.sum / static_cast<double>(tally.counted) : 0;
  if (loss_.kind == LossSpec::Kind::kCrossEntropy && tally.counted)
    r.accuracy = static_cast<double>(tally.right) / static_cast<double>(tally.counted);
  return r;
}

}  // namespace pt
