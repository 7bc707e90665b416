// What the Trainer (train/trainer.h) gives besides its steps, without bringing the whole model to
// one rank: the held-out evaluation, each rank running its own chunks (train/evaluator.h), and
// the trained tensors streamed to rank 0's writers one at a time. Across processes both travel
// on a Comm of their own (make_host_comm).
#include <algorithm>
#include <thread>

#include "core/error.h"
#include "train/trainer.h"

namespace pt {
namespace {
// write_trained's messages: rank 0 asks a rank for a tensor by its index (-1: done), the rank
// sends its bytes.
constexpr const char* kAsk = "outputs/ask";
constexpr const char* kTensor = "outputs/tensor";
}  // namespace

// Alone: the whole model in one program, as it always was. Across processes: cut where the
// pipeline is, this rank's chunks here. Every rank makes it (the Comm's message plan is the same
// everywhere); replica 0's ranks run it.
void Trainer::make_evaluator(const std::vector<int>& placement) {
  host_comm_ = make_host_comm(rank_of_, ranks_);
  if (options_.eval_every > 0 && data_->eval_batches() > 0) {
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    int devices = 0;
    for (size_t d = 0; d < rank_of_.size(); ++d) devices += here(d);
    const auto threads = static_cast<int>(std::min<unsigned>(hw, static_cast<unsigned>(options_.threads * devices)));
    if (ranks_.alone()) {
      eval_ = std::make_unique<Evaluator>(model_, loss_, threads);
    } else {
      EvalCut cut;
      for (const BackwardGraphs& c : chunks_) cut.forwards.push_back(&c.forward);
      cut.placement = placement;
      for (size_t d = 0; d < rank_of_.size(); ++d) cut.local.push_back(here(d));
      eval_ = std::make_unique<Evaluator>(model_, loss_, cut, host_comm_.get(), threads);
    }
  }
  if (!host_comm_) return;
  std::vector<std::string> messages = eval_ ? eval_->message_names() : std::vector<std::string>{};
  messages.insert(messages.end(), {kAsk, kTensor});
  const std::vector<std::string> hunt = ReferenceStep::message_names(chunks_, *reference_cut());
  messages.insert(messages.end(), hunt.begin(), hunt.end());
  host_comm_->plan(messages, 1);
}

// Each rank of replica 0 its own chunks (the device copies of the parameters first, where the
// devices update them); the result from the rank of the last chunk, exactly (x + 0), to rank 0,
// which reports it.
void Trainer::evaluate(int64_t done, bool last, TrainObserver& observer) {
  pull_parameters();
  EvalResult r;
  if (ranks_.replica() == 0) r = eval_->run(*data_);
  if (!ranks_.alone()) {
    std::vector<double> v = {0, 0, 0};
    if (ranks_.replica() == 0 && eval_->reports()) v = {r.loss, r.accuracy, static_cast<double>(r.samples)};
    ranks_.sum(v);
    r = {v[0], v[1], static_cast<int64_t>(v[2])};
  }
  if (ranks_.rank() == 0) observer.evaluated(done, r, last);
}

int Trainer::mailbox_of(int rank) const {
  return static_cast<int>(std::find(rank_of_.begin(), rank_of_.end(), rank) - rank_of_.begin());
}

void Trainer::write_trained(const std::function<void(const TensorFetch& fetch)>& write) {
  executor_.reset();
  optimizers_.clear();
  eval_.reset();
  pull_parameters();
  const std::map<std::string, const Tensor*> tensors = trained_tensors();
  if (ranks_.alone()) {
    write([&](const std::string& name) -> const Tensor& {
      const Tensor& t = *tensors.at(name);
      t.load();
      return t;
    });
    return;
  }
  if (ranks_.replica() != 0) return;  // replica 0 holds every trained tensor
  std::vector<std::string> names;  // the same order on every rank
  for (const auto& [name, t] : tensors) names.push_back(name);
  if (ranks_.rank() != 0) return serve_trained(names, tensors);
  Tensor foreign;  // the one tensor of another rank held here
  write([&](const std::string& name) -> const Tensor& {
    const Tensor& t = *tensors.at(name);
    if (holds(name)) return t;
    const int64_t index = std::find(names.begin(), names.end(), name) - names.begin();
    const int from = mailbox_of(owner_of(name));
    foreign = Tensor();
    fetched_ = nullptr;
    host_comm_->send(kAsk, 0, 0, from, &index, sizeof index);
    foreign.type = t.type;
    foreign.data.resize(static_cast<size_t>(t.type.bytes()));
    host_comm_->recv(kTensor, 0, from, 0, foreign.data.data(), foreign.data.size());
    fetched_ = &foreign;
    return foreign;
  });
  fetched_ = nullptr;
  const int64_t done = -1;
  for (int r = 1; r < ranks_.size() / ranks_.replicas(); ++r) host_comm_->send(kAsk, 0, 0, mailbox_of(r), &done, sizeof done);
  host_comm_->reset();
}

void Trainer::serve_trained(const std::vector<std::string>& names, const std::map<std::string, const Tensor*>& tensors) {
  const int mine = mailbox_of(ranks_.rank());
  for (;;) {
    int64_t index = -1;
    host_comm_->recv(kAsk, 0, 0, mine, &index, sizeof index);
    if (index < 0) break;
    const Tensor& t = *tensors.at(names[static_cast<size_t>(index)]);
    PT_CHECK(owner_of(names[static_cast<size_t>(index)]) == ranks_.rank(),
             "rank 0 asked for '" + names[static_cast<size_t>(index)] + "', which another rank updates");
    host_comm_->send(kTensor, 0, mine, 0, t.data.data(), t.data.size());
  }
  host_comm_->reset();
}

int64_t Trainer::foreign_tensor_bytes() const {
  int64_t bytes = fetched_ ? static_cast<int64_t>(fetched_->data.size()) : 0;
  for (const auto& [name, t] : trained_tensors())
    if (!holds(name) && t->stored && t->resident()) bytes += static_cast<int64_t>(t->data.size());
  return bytes;
}

}  // namespace pt
