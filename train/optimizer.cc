#include "train/optimizer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "core/error.h"
#include "exec/cpu/vector_clones.h"

namespace pt {
namespace {

// Below this many elements a loop runs on one thread. Every loop is elementwise or reduces in
// fixed chunks, so results do not depend on the thread count.
constexpr int64_t kParallelMin = 1 << 16;
constexpr int64_t kNormChunk = 1 << 14;

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void require(bool ok, const char* key, const std::string& what, const std::string& todo) {
  if (!ok) throw UserError(key, what, todo);
}

// Finite and >= 0 (NaN fails too).
void require_at_least_zero(double v, const char* key, const std::string& todo) {
  require(v >= 0 && std::isfinite(v), key, "got " + num(v) + ", must be >= 0", todo);
}

// The loops below run per ISA (exec/cpu/vector_clones.h): AVX-512 where the CPU has it, not
// the baseline's 4 floats at a time.
int threads() { return omp_get_max_threads(); }

// Sum of x[i]^2 in double: per fixed chunk in parallel, then the chunks in order.
int64_t norm_chunks(int64_t n) { return (n + kNormChunk - 1) / kNormChunk; }

PT_VECTOR_CLONES double chunk_squares(const float* x, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

// partial: capacity for norm_chunks(n) values.
double sum_squares(const float* x, int64_t n, std::vector<double>& partial) {
  const int64_t chunks = norm_chunks(n);
  partial.assign(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kNormChunk;
    partial[static_cast<size_t>(c)] = chunk_squares(x + begin, std::min(n, begin + kNormChunk) - begin);
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

PT_VECTOR_CLONES void sgd_block(float* __restrict p, const float* __restrict g, float* __restrict b,
                                int64_t n, const SgdScalars& s) {
  if (!s.momentum) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      float unused = 0;
      p[i] = sgd_element(p[i], g[i], unused, s);
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i] = sgd_element(p[i], g[i], b[i], s);
}

// SGD on one tensor, dampening 0 (torch _single_tensor_sgd; exec/parameter_update.h). wd = 0
// adds 0*p, which leaves d exact for finite p.
void sgd_tensor(float* p, const float* g, float* b, int64_t n, const SgdScalars& s) {
  cpu::for_blocks(n, threads(), kParallelMin, [&](int64_t begin, int64_t end) {
    sgd_block(p + begin, g + begin, b ? b + begin : nullptr, end - begin, s);
  });
}

PT_VECTOR_CLONES void adamw_block(float* __restrict p, const float* __restrict g, float* __restrict m,
                                  float* __restrict v, int64_t n, const AdamWScalars& s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i] = adamw_element(p[i], g[i], m[i], v[i], s);
}

// AdamW on one tensor (torch _single_tensor_adamw, amsgrad off; exec/parameter_update.h).
void adamw_tensor(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  cpu::for_blocks(n, threads(), kParallelMin, [&](int64_t begin, int64_t end) {
    adamw_block(p + begin, g + begin, m + begin, v + begin, end - begin, s);
  });
}

}  // namespace

OptimizerConfig::Kind parse_optimizer_kind(const std::string& name) {
  if (name == "sgd") return OptimizerConfig::Kind::kSgd;
  if (name == "adamw") return OptimizerConfig::Kind::kAdamW;
  throw UserError("optimizer.kind", "unknown optimizer '" + name + "'", "use sgd or adamw");
}

OptimizerConfig::Schedule parse_lr_schedule(const std::string& name) {
  if (name == "constant") return OptimizerConfig::Schedule::kConstant;
  if (name == "cosine") return OptimizerConfig::Schedule::kCosine;
  throw UserError("optimizer.schedule", "unknown schedule '" + name + "'",
                  "use constant or cosine");
}

const char* optimizer_kind_name(OptimizerConfig::Kind kind) {
  return kind == OptimizerConfig::Kind::kSgd ? "sgd" : "adamw";
}

const char* lr_schedule_name(OptimizerConfig::Schedule schedule) {
  return schedule == OptimizerConfig::Schedule::kConstant ? "constant" : "cosine";
}

void validate(const OptimizerConfig& c) {
  require_at_least_zero(c.lr, "optimizer.lr", "set a learning rate such as 0.001");
  require_at_least_zero(c.momentum, "optimizer.momentum", "set 0.9, say, or 0 for none");
  require(!c.nesterov || c.momentum > 0, "optimizer.nesterov", "needs a momentum > 0",
          "set optimizer.momentum (e.g. 0.9) or turn nesterov off");
  for (double beta : {c.beta1, c.beta2})
    require(beta >= 0 && beta < 1, "optimizer.betas", num(beta) + " is outside [0, 1)",
            "use values such as 0.9 and 0.999");
  require_at_least_zero(c.eps, "optimizer.eps", "set 1e-8, say");
  require_at_least_zero(c.weight_decay, "optimizer.weight_decay", "set 0 for none");
  require_at_least_zero(c.clip_grad_norm, "optimizer.clip_grad_norm",
                        "set the largest global gradient norm, or 0 for no clipping");
  require(c.warmup_steps >= 0, "optimizer.warmup_steps",
          "got " + std::to_string(c.warmup_steps) + ", must be >= 0", "set 0 for no warm-up");
  if (c.schedule != OptimizerConfig::Schedule::kCosine) return;
  require(c.total_steps > c.warmup_steps, "optimizer.total_steps",
          "got " + std::to_string(c.total_steps) + ", must exceed the " +
              std::to_string(c.warmup_steps) + " warm-up steps",
          "set the number of training steps the cosine schedule spans");
  require(c.min_lr >= 0 && c.min_lr <= c.lr, "optimizer.min_lr",
          "got " + num(c.min_lr) + ", must lie in [0, optimizer.lr = " + num(c.lr) + "]",
          "lower it, or raise optimizer.lr");
}

double learning_rate_at(const OptimizerConfig& c, int64_t step) {
  const auto t = static_cast<double>(step);
  const auto w = static_cast<double>(c.warmup_steps);
  if (step < c.warmup_steps) return c.lr * ((t + 1) / w);
  if (c.schedule == OptimizerConfig::Schedule::kConstant) return c.lr;
  const double r = c.lr > 0 ? c.min_lr / c.lr : 0.0;
  const double span = std::max(1.0, static_cast<double>(c.total_steps) - 1.0 - w);
  const double q = std::min(1.0, (t - w) / span);
  return c.lr * (r + (1.0 - r) * 0.5 * (1.0 + std::cos(std::numbers::pi * q)));
}

Optimizer::Optimizer(const OptimizerConfig& config, std::vector<OptimizerParam> params)
    : config_(config), params_(std::move(params)) {
  validate(config_);
  int64_t max_chunks = 0;
  for (const OptimizerParam& p : params_) {
    PT_CHECK(p.value && p.value->type.dtype == DType::kFloat32,
             "optimizer parameter '" + p.name + "' is not a float32 tensor");
    max_chunks = std::max(max_chunks, norm_chunks(p.value->type.numel()));
    if (config_.kind == OptimizerConfig::Kind::kSgd && config_.momentum > 0) {
      add_state(p.name + ".momentum_buffer", *p.value);
    } else if (config_.kind == OptimizerConfig::Kind::kAdamW) {
      add_state(p.name + ".exp_avg", *p.value);
      add_state(p.name + ".exp_avg_sq", *p.value);
    }
  }
  lookup_.resize(params_.size());
  partial_.reserve(static_cast<size_t>(max_chunks));
  for (const OptimizerParam& p : params_) numels_.push_back(p.value->type.numel());
}

Optimizer::~Optimizer() {
  for (float* p : device_state_) device_->release(p);
}

void Optimizer::bind_device(Backend& backend, std::vector<float*> device_params) {
  PT_CHECK(backend.updates_parameters(), std::string(backend.name()) + " does not update parameters");
  PT_CHECK(!device_ && device_params.size() == params_.size(), "one device address per parameter, bound once");
  device_ = &backend;
  device_params_ = std::move(device_params);
  for (const Tensor& t : state_) {
    auto* p = static_cast<float*>(backend.allocate(t.data.size()));
    backend.copy(p, t.data.data(), t.data.size());
    device_state_.push_back(p);
  }
}

void Optimizer::add_state(const std::string& name, const Tensor& like) {
  Tensor zeros;
  zeros.type = like.type;
  zeros.data.assign(static_cast<size_t>(like.type.bytes()), std::byte{0});  // like may still be in its file
  state_.push_back(std::move(zeros));
  state_names_.push_back(name);
}

double Optimizer::squared_norm(std::span<const float* const> grads) const {
  PT_CHECK(grads.size() == params_.size(), "one gradient per parameter");
  if (device_) {
    std::vector<double> terms(params_.size());
    device_->sum_squares(grads, numels_, terms);
    return sum_in_order(terms);
  }
  double total = 0;
  for (size_t k = 0; k < params_.size(); ++k)
    total += sum_squares(grads[k], numels_[k], partial_);
  return total;
}

double Optimizer::squared_norm(const std::map<std::string, Tensor>& grads) const {
  return squared_norm(lookup(grads));
}

double Optimizer::squared_norm(const std::vector<OptimizerParam>& params, const std::map<std::string, Tensor>& grads) {
  return sum_in_order(squares(params, grads));
}

std::vector<double> Optimizer::squares(const std::vector<OptimizerParam>& params, const std::map<std::string, Tensor>& grads,
                                       const std::vector<bool>& pick) {
  std::vector<double> partial, out(params.size(), 0.0);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!pick.empty() && !pick[i]) continue;
    const OptimizerParam& p = params[i];
    auto it = grads.find(p.name);
    PT_CHECK(it != grads.end() && it->second.type == p.value->type, "no float32 gradient for '" + p.name + "'");
    out[i] = sum_squares(it->second.as<float>(), p.value->type.numel(), partial);
  }
  return out;
}

double Optimizer::sum_in_order(std::span<const double> squares) {
  double total = 0;
  for (double s : squares) total += s;
  return total;
}

double Optimizer::global_norm(std::span<const double> squared_norms) {
  double total = 0;
  for (double s : squared_norms) total += s;
  return std::sqrt(total);
}

// torch: clip_coef = max_norm / (total_norm + 1e-6) in float32, where Python's scalar / tensor
// is tensor.reciprocal() * scalar; then clamped to at most 1.
float Optimizer::clip_coefficient(double global_norm) const {
  if (config_.clip_grad_norm == 0) return 1.0f;
  const float denom = static_cast<float>(global_norm) + 1e-6f;
  const float coef = (1.0f / denom) * static_cast<float>(config_.clip_grad_norm);
  return std::min(coef, 1.0f);
}

void Optimizer::step(std::span<const float* const> grads, std::optional<double> global_norm) {
  PT_CHECK(grads.size() == params_.size(), "one gradient per parameter");
  PT_CHECK(config_.clip_grad_norm == 0 || global_norm.has_value(),
           "clipping needs the global gradient norm");
  const float clip = clip_coefficient(global_norm.value_or(0.0));
  const double lr = current_lr();
  if (config_.kind == OptimizerConfig::Kind::kSgd)
    sgd_step(grads, clip, lr);
  else
    adamw_step(grads, clip, lr);
  ++step_;
}

void Optimizer::step(const std::map<std::string, Tensor>& grads,
                     std::optional<double> global_norm) {
  step(lookup(grads), global_norm);
}

void Optimizer::sgd_step(std::span<const float* const> grads, float clip, double lr) {
  const SgdScalars s{clip,
                     static_cast<float>(config_.weight_decay),
                     static_cast<float>(config_.momentum),
                     static_cast<float>(-lr),
                     config_.momentum > 0,
                     step_ == 0,
                     config_.nesterov};
  for (size_t k = 0; k < params_.size(); ++k) {
    if (device_) {
      device_->sgd_update(device_params_[k], grads[k], s.momentum ? device_state_[k] : nullptr, numels_[k], s);
      continue;
    }
    float* buf = s.momentum ? state_[k].as<float>() : nullptr;
    sgd_tensor(params_[k].value->as<float>(), grads[k], buf, numels_[k], s);
  }
}

void Optimizer::adamw_step(std::span<const float* const> grads, float clip, double lr) {
  // Python-side scalars of torch, in double, each rounded to float once.
  const double t = static_cast<double>(step_ + 1);
  const double bc1 = 1.0 - std::pow(config_.beta1, t);
  const double bc2 = 1.0 - std::pow(config_.beta2, t);
  const AdamWScalars s{clip,
                       static_cast<float>(1.0 - lr * config_.weight_decay),
                       static_cast<float>(config_.beta1),
                       static_cast<float>(1.0 - config_.beta1),
                       static_cast<float>(config_.beta2),
                       static_cast<float>(1.0 - config_.beta2),
                       static_cast<float>(std::sqrt(bc2)),
                       static_cast<float>(config_.eps),
                       static_cast<float>(-(lr / bc1))};
  for (size_t k = 0; k < params_.size(); ++k) {
    if (device_)
      device_->adamw_update(device_params_[k], grads[k], device_state_[2 * k], device_state_[2 * k + 1], numels_[k], s);
    else
      adamw_tensor(params_[k].value->as<float>(), grads[k], state_[2 * k].as<float>(), state_[2 * k + 1].as<float>(),
                   numels_[k], s);
  }
}

std::span<const float* const> Optimizer::lookup(const std::map<std::string, Tensor>& grads) const {
  for (size_t k = 0; k < params_.size(); ++k) {
    auto it = grads.find(params_[k].name);
    PT_CHECK(it != grads.end(), "no gradient for parameter '" + params_[k].name + "'");
    PT_CHECK(it->second.type == params_[k].value->type,
             "gradient of '" + params_[k].name + "' is " + it->second.type.str() +
                 ", the parameter " + params_[k].value->type.str());
    lookup_[k] = it->second.as<float>();
  }
  return lookup_;
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const Tensor& t : state_) n += t.type.bytes();
  return n;
}

OptimizerState Optimizer::state() const {
  OptimizerState out;
  out.step = step_;
  for (size_t i = 0; i < state_.size(); ++i) {
    out.tensors.emplace_back(state_names_[i], state_[i]);
    Tensor& t = out.tensors.back().second;
    if (device_) device_->copy(t.data.data(), device_state_[i], t.data.size());
  }
  return out;
}

std::vector<std::pair<std::string, const Tensor*>> Optimizer::host_state() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  if (device_) return out;
  for (size_t i = 0; i < state_.size(); ++i) out.emplace_back(state_names_[i], &state_[i]);
  return out;
}

std::byte* Optimizer::state_place(const std::string& name, const TensorType& type) {
  for (size_t i = 0; i < state_.size(); ++i)
    if (state_names_[i] == name) return state_[i].type == type ? state_[i].data.data() : nullptr;
  return nullptr;
}

void Optimizer::loaded_in_place(int64_t step) {
  if (step < 0)
    throw UserError("optimizer state", "step " + std::to_string(step) + " < 0",
                    "load a checkpoint written with the same optimizer and model");
  for (size_t i = 0; i < state_.size() && device_; ++i)
    device_->copy(device_state_[i], state_[i].data.data(), state_[i].data.size());
  step_ = step;
}

void Optimizer::load_state(OptimizerState state) {
  const char* where = "optimizer state";
  const std::string todo = "load a checkpoint written with the same optimizer and model";
  if (state.tensors.size() != state_.size())
    throw UserError(where, "has " + std::to_string(state.tensors.size()) + " tensors, " +
                    optimizer_kind_name(config_.kind) + " here needs " +
                    std::to_string(state_.size()), todo);
  if (state.step < 0) throw UserError(where, "step " + std::to_string(state.step) + " < 0", todo);
  for (size_t i = 0; i < state_.size(); ++i) {
    const auto& [name, t] = state.tensors[i];
    if (name != state_names_[i])
      throw UserError(where, "tensor " + std::to_string(i) + " is '" + name + "', expected '" +
                      state_names_[i] + "'", todo);
    if (!(t.type == state_[i].type) || t.data.size() != state_[i].data.size())
      throw UserError(where, "'" + name + "' is " + t.type.str() + ", expected " +
                      state_[i].type.str(), todo);
  }
  for (size_t i = 0; i < state_.size(); ++i) {
    state_[i].data = std::move(state.tensors[i].second.data);
    if (device_) device_->copy(device_state_[i], state_[i].data.data(), state_[i].data.size());
  }
  step_ = state.step;
}

}  // namespace pt
