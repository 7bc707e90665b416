// train/optimizer.h: parameter updates after the gradients of one step are accumulated. In: an
// OptimizerConfig and, per pipeline stage, its parameters (float32 host tensors, borrowed) and
// every step the accumulated gradients; out: the parameters updated in place. State (momentum
// buffers, Adam moments, the step counter) is sized at construction and serialises to named
// Tensors for checkpoints.
//
// The global gradient norm spans every stage, so clipping is two-phase: each stage's Optimizer
// returns squared_norm() of its gradients, the caller sums them over stages (over devices, when
// the stages live on several), and hands global_norm() of the sums to every stage's step().
//
// Numerics follow torch.optim's single-tensor path (foreach=False) on the CPU, float32
// throughout, operation by operation:
//   clip (clip_grad_norm_):  c = min(1, max_norm * (1 / (norm + 1e-6)));  g = g * c
//   SGD (dampening 0):       d = g + wd * p;  b = d (first step) | b * mu + d;
//                            d = nesterov ? d + mu * b : b;  p = p + (-lr) * d
//   AdamW:                   p = p * (1 - lr * wd);  m = m * b1 + (1 - b1) * g;
//                            v = v * b2 + ((1 - b2) * g) * g;
//                            p = p + (-lr / (1 - b1^t) * m) / (sqrt(v) / sqrt(1 - b2^t) + eps)
// where scalars are computed in double and rounded to float once, as torch does with Python
// scalars, and t counts steps from 1 (exec/parameter_update.h).
//
// On a backend that updates parameters where they live (Backend::updates_parameters: the CUDA
// backend), bind_device() moves the state there: the norm and the update then run as that
// backend's kernels on its gradients and its copies of the parameters, and nothing crosses to
// the host but the norm's terms.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/ir.h"
#include "exec/backend.h"

namespace pt {

struct OptimizerConfig {
  enum class Kind { kSgd, kAdamW };
  enum class Schedule { kConstant, kCosine };

  Kind kind = Kind::kSgd;
  double lr = 1e-3;           // the peak learning rate
  // SGD (dampening is always 0).
  double momentum = 0;
  bool nesterov = false;      // needs momentum > 0
  // AdamW.
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // SGD: L2, added to the gradient; AdamW: decoupled, p *= 1 - lr * weight_decay.
  double weight_decay = 0;
  double clip_grad_norm = 0;  // max global L2 norm of all gradients; 0 = no clipping
  // Learning rate at step t (0-based: t steps were taken before), W = warmup_steps,
  // T = total_steps, r = min_lr / lr:
  //   lr_t = lr * f(t),  f(t) = (t + 1) / W                                  for t < W
  //                      f(t) = 1                                  (constant) for t >= W
  //                      f(t) = r + (1 - r) * 0.5 * (1 + cos(pi * q))  (cosine) for t >= W,
  //                             q = min(1, (t - W) / max(1, T - 1 - W))
  // so warm-up climbs linearly from lr / W at the first step (as nanoGPT's and Megatron's do: no
  // step runs at rate 0) to lr at step W - 1, and the cosine reaches min_lr at the last step,
  // T - 1, and stays there. This is torch.optim.lr_scheduler.LambdaLR with lambda f, stepped
  // once after every optimizer step.
  int64_t warmup_steps = 0;
  Schedule schedule = Schedule::kConstant;
  int64_t total_steps = 0;    // cosine only
  double min_lr = 0;          // cosine only
};

// "sgd" | "adamw"; "constant" | "cosine". UserError naming optimizer.kind / optimizer.schedule.
OptimizerConfig::Kind parse_optimizer_kind(const std::string& name);
OptimizerConfig::Schedule parse_lr_schedule(const std::string& name);
const char* optimizer_kind_name(OptimizerConfig::Kind kind);
const char* lr_schedule_name(OptimizerConfig::Schedule schedule);

// UserError naming the key ("optimizer.lr") and the fix, for the first bad value.
void validate(const OptimizerConfig& config);
// The learning rate of step t (0-based), by the formula on OptimizerConfig.
double learning_rate_at(const OptimizerConfig& config, int64_t step);

// A parameter the optimizer updates: the caller owns the tensor, which must outlive the optimizer.
struct OptimizerParam {
  std::string name;
  Tensor* value;  // float32
};

// Checkpoint form: one tensor per parameter and state kind, named "<param>.momentum_buffer"
// (SGD with momentum), "<param>.exp_avg" and "<param>.exp_avg_sq" (AdamW), in parameter order.
struct OptimizerState {
  int64_t step = 0;  // steps taken
  std::vector<std::pair<std::string, Tensor>> tensors;
};

class Optimizer {
 public:
  // Validates the config (UserError) and sizes the state for params.
  Optimizer(const OptimizerConfig& config, std::vector<OptimizerParam> params);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // From now on parameter k lives at device_params[k] in `backend`'s memory (its copy of the
  // host tensor, Backend::device_constant), which must update parameters: the state moves there,
  // the pointer overloads of squared_norm() and step() take gradients in that memory, and step()
  // writes the device copies only (the caller copies them back when the host needs them).
  // state() and load_state() read and write the state there.
  void bind_device(Backend& backend, std::vector<float*> device_params);
  bool on_device() const { return device_ != nullptr; }

  // Gradients come as one pointer per parameter, in constructor order, each to numel floats;
  // the overloads taking a map look them up by parameter name (ReferenceStep::grads()).
  // Sum of squares of every gradient element, in double; deterministic for any thread count.
  double squared_norm(std::span<const float* const> grads) const;
  double squared_norm(const std::map<std::string, Tensor>& grads) const;
  // The same sum over any list of parameters (in its order): what squared_norm() of an optimizer
  // over that list returns, bit for bit (ZeRO: each replica steps a shard, the norm is the whole's).
  static double squared_norm(const std::vector<OptimizerParam>& params, const std::map<std::string, Tensor>& grads);
  // Its terms: per parameter of the list, the sum of its gradient's squares (only where `pick`
  // is empty or pick[i]; 0 elsewhere). squared_norm adds them in list order from 0, so terms
  // computed in several places and brought together give its very bits (ZeRO-1's shards).
  static std::vector<double> squares(const std::vector<OptimizerParam>& params, const std::map<std::string, Tensor>& grads,
                                     const std::vector<bool>& pick = {});
  static double sum_in_order(std::span<const double> squares);
  // sqrt of the sum of every stage's squared_norm().
  static double global_norm(std::span<const double> squared_norms);

  // One update at learning_rate_at(config, steps()), then steps() += 1. global_norm: over all
  // stages' gradients; required when clip_grad_norm > 0, ignored otherwise. Grads are not changed.
  void step(std::span<const float* const> grads, std::optional<double> global_norm = {});
  void step(const std::map<std::string, Tensor>& grads, std::optional<double> global_norm = {});

  // The factor clipping multiplies every gradient by at this norm (1 when off or under the limit).
  float clip_coefficient(double global_norm) const;
  int64_t steps() const { return step_; }
  double current_lr() const { return learning_rate_at(config_, step_); }
  const OptimizerConfig& config() const { return config_; }

  OptimizerState state() const;
  // The state as the host holds it, each tensor itself (no copy), in state()'s order and names;
  // empty where it lives on a device (bind_device: state() copies it from there).
  std::vector<std::pair<std::string, const Tensor*>> host_state() const;
  const std::vector<std::string>& state_names() const { return state_names_; }
  int64_t state_bytes() const;  // momentum buffers or Adam moments held
  // UserError when names, order, types or shapes differ from state()'s for these parameters.
  // Takes the tensors' bytes (a checkpoint's, moved in: no second copy of the state).
  void load_state(OptimizerState state);
  // A reader filling the state in place (a checkpoint read straight into it): where state tensor
  // `name` of `type` lives on the host, or null for a name or type it does not hold; then
  // loaded_in_place(step) ends as load_state() does (the device's copy, the step count).
  std::byte* state_place(const std::string& name, const TensorType& type);
  void loaded_in_place(int64_t step);

 private:
  OptimizerConfig config_;
  std::vector<OptimizerParam> params_;
  // Per parameter, in order: SGD with momentum {momentum_buffer}, AdamW {exp_avg, exp_avg_sq},
  // plain SGD nothing; named as OptimizerState says.
  std::vector<Tensor> state_;
  std::vector<std::string> state_names_;
  int64_t step_ = 0;
  mutable std::vector<const float*> lookup_;  // the map overloads' pointer list, sized once
  mutable std::vector<double> partial_;       // squared_norm's per-chunk sums, sized once

  Backend* device_ = nullptr;           // bind_device's
  std::vector<float*> device_params_;   // [parameter]
  std::vector<float*> device_state_;    // as state_
  std::vector<int64_t> numels_;         // [parameter]

  void sgd_step(std::span<const float* const> grads, float clip, double lr);
  void adamw_step(std::span<const float* const> grads, float clip, double lr);
  std::span<const float* const> lookup(const std::map<std::string, Tensor>& grads) const;
  void add_state(const std::string& name, const Tensor& like);
};

}  // namespace pt
