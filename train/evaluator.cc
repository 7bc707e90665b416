#include "train/evaluator.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autodiff/training_mode.h"

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

}  // namespace

Evaluator::Evaluator(const Graph& model, const LossSpec& loss, int threads)
    : graph_(inference_form(model)), backend_(threads), program_(graph_, backend_), loss_(loss) {
  const std::string out = loss.output.empty() ? graph_.value(graph_.outputs.front()).name : loss.output;
  for (size_t k = 0; k < graph_.outputs.size(); ++k)
    if (graph_.value(graph_.outputs[k]).name == out) output_ = k;
}

EvalResult Evaluator::run(const DataLoader& data) {
  EvalResult r;
  double sum = 0;
  int64_t counted = 0, right = 0;
  for (int64_t i = 0; i < data.eval_batches(); ++i) {
    FeedMap feeds = data.eval_batch(i);
    // A Bernoulli draw of the file (training_mode.h): the same draws at every evaluation.
    if (graph_.find(kDropoutKey) != kNoValue) feeds[kDropoutKey] = scalar_tensor(dropout_key_for(0, -1, i));
    std::vector<Buffer> in;
    for (ValueId v : graph_.inputs) {
      const Tensor& t = feeds.at(graph_.value(v).name);
      in.push_back({const_cast<std::byte*>(t.data.data()), &graph_.value(v).type});
    }
    program_.run(in);
    const Buffer y = program_.output(output_);
    const Tensor& target = feeds.at(kLossTarget);
    r.samples += data.rows();
    if (loss_.kind == LossSpec::Kind::kModel) {
      sum += *y.as<float>();
      ++counted;
    } else if (loss_.kind == LossSpec::Kind::kMse) {
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
        if (t == loss_.ignore_index) continue;
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
  r.loss = counted ? sum / static_cast<double>(counted) : 0;
  if (loss_.kind == LossSpec::Kind::kCrossEntropy && counted)
    r.accuracy = static_cast<double>(right) / static_cast<double>(counted);
  return r;
}

}  // namespace pt
