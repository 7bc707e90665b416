// exec/cpu/nn_grad_norm.cc: LayerNormGrad and BatchNormGrad, pipetrain-domain ops
// (core/pipetrain_ops.h), as loops that vectorise. oneDNN's layer_normalization backward wants
// the variance, which LayerNormalization does not output (InvStdDev would have to be inverted
// back), and its batch normalization on plain NCHW is the slow reference path (see
// nn_channel.cc). dScale and dBias are optional outputs.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "exec/cpu/channel_stats.h"
#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dnnl_util.h"
#include "exec/cpu/lane_math.h"
#include "exec/cpu/parallel.h"

namespace pt::cpu {
namespace {

using Dims = std::vector<int64_t>;

constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements below which one thread runs

bool present(std::span<const Buffer> out, size_t k) { return k < out.size() && out[k].present(); }

// Inputs 0..count-1 present, and every input and wanted output float32.
bool floats_present(const KernelSpec& s, size_t count) {
  if (s.inputs.size() != count || s.outputs.size() > 3) return false;
  if (!wanted(s, 0) && !wanted(s, 1) && !wanted(s, 2)) return false;
  for (size_t i = 0; i < count; ++i)
    if (!s.has_input(i) || s.inputs[i].dtype != DType::kFloat32) return false;
  for (size_t k = 0; k < s.outputs.size(); ++k)
    if (wanted(s, k) && s.outputs[k].dtype != DType::kFloat32) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// LayerNormGrad

// X viewed as (outer, inner) rows around `axis`; Mean and InvStdDev hold one value per row,
// Scale, dScale and dBias one per column.
//   xhat = (X - Mean) * InvStdDev, g = dY * Scale
//   dX = InvStdDev * (g - mean_A(g) - xhat * mean_A(g * xhat))
//   dScale = sum over rows of dY * xhat, dBias = sum over rows of dY
// Rows split into `chunks_` fixed ranges, one per thread; each adds its dScale and dBias into its
// own partial row in scratch, and the partials are then added in chunk order: the result
// depends on the thread count only, not on scheduling.
class LayerNormGrad final : public Kernel {
 public:
  LayerNormGrad(int64_t outer, int64_t inner, int threads)
      : outer_(outer), inner_(inner), threads_(threads),
        chunks_(outer * inner >= kParallelMin ? std::clamp<int64_t>(threads, 1, outer) : 1) {}

  size_t scratch_bytes() const override {
    return static_cast<size_t>(2 * chunks_ * inner_) * sizeof(float);
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    float* partial = static_cast<float*>(scratch);  // per chunk: dScale row, then dBias row
    parallel_for(chunks_, threads_, chunks_ > 1, [&](int64_t c) {
      float* ps = partial + 2 * c * inner_;
      std::fill(ps, ps + 2 * inner_, 0.f);
      for (int64_t r = outer_ * c / chunks_; r < outer_ * (c + 1) / chunks_; ++r)
        row(in, present(out, 0) ? out[0].as<float>() : nullptr, r, ps, ps + inner_);
    });
    fold(partial, out, 1, 0);
    fold(partial, out, 2, inner_);
  }

 private:
  // dX of row r (unless dx_all is null: dX not wanted), and its dY * xhat and dY added into ps
  // and pb (this chunk's partial rows in scratch, apart from every buffer: restrict lets the
  // last loop vectorise).
  void row(std::span<const Buffer> in, float* dx_all, int64_t r, float* __restrict ps,
           float* __restrict pb) const {
    const float* dy = in[0].as<const float>() + r * inner_;
    const float* x = in[1].as<const float>() + r * inner_;
    const float* scale = in[2].as<const float>();
    const float mean = in[3].as<const float>()[r], istd = in[4].as<const float>()[r];
    if (!dx_all) {
      for (int64_t j = 0; j < inner_; ++j) {
        ps[j] += dy[j] * ((x[j] - mean) * istd);
        pb[j] += dy[j];
      }
      return;
    }
    float* dx = dx_all + r * inner_;
    // sum_A g and sum_A g * xhat: an OpenMP simd reduction (a fixed lane split for a given
    // build; the lane arrays of lane_sum did not stay in registers with two sums)
    float sg = 0.f, sgx = 0.f;
#pragma omp simd reduction(+ : sg, sgx)
    for (int64_t j = 0; j < inner_; ++j) {
      const float g = dy[j] * scale[j];
      sg += g;
      sgx += g * ((x[j] - mean) * istd);
    }
    const float mg = static_cast<float>(sg / double(inner_));
    const float mgx = static_cast<float>(sgx / double(inner_));
    for (int64_t j = 0; j < inner_; ++j) {
      const float xhat = (x[j] - mean) * istd;
      dx[j] = istd * (dy[j] * scale[j] - mg - xhat * mgx);
      ps[j] += dy[j] * xhat;
      pb[j] += dy[j];
    }
  }

  // Output k (dScale or dBias), when wanted, = sum over chunks of the partial rows at `offset`.
  void fold(const float* partial, std::span<const Buffer> out, size_t k, int64_t offset) const {
    if (!present(out, k)) return;
    float* o = out[k].as<float>();
    std::copy(partial + offset, partial + offset + inner_, o);
    for (int64_t c = 1; c < chunks_; ++c) {
      const float* p = partial + 2 * c * inner_ + offset;
      for (int64_t j = 0; j < inner_; ++j) o[j] += p[j];
    }
  }

  int64_t outer_, inner_;
  int threads_;
  int64_t chunks_;
};

// ---------------------------------------------------------------------------------------------
// BatchNormGrad

// Training-mode BatchNormalization's gradient per channel, from the batch's own statistics
// (channel_moments, as the forward computed them). X: (N, C, S); R = N * S values per channel.
//   dBias = sum_R(dY), dScale = istd * sum_R(dY * (X - mean))
//   dX = Scale * istd * (dY - dBias / R - xhat * dScale / R)
// Channels run in parallel, each on one thread.
class BatchNormGrad final : public ChannelKernel {
 public:
  using ChannelKernel::ChannelKernel;

 private:
  void channel(std::span<const Buffer> in, std::span<const Buffer> out, int64_t c) const override {
    const float* dy = in[0].as<const float>();
    const float* x = in[1].as<const float>();
    float mean, var;
    channel_moments(x, d_, c, &mean, &var);
    const float istd = 1.f / std::sqrt(var + eps_);
    double sum_dy = 0, sum_dy_xc = 0;
    for (int64_t n = 0; n < d_.n; ++n) {
      const int64_t at = (n * d_.c + c) * d_.s;
      sum_dy += lane_sum(dy + at, d_.s);
      sum_dy_xc += centered_dot(dy + at, x + at, mean);
    }
    const float dbias = static_cast<float>(sum_dy);
    const float dscale = static_cast<float>(sum_dy_xc * istd);
    if (present(out, 1)) out[1].as<float>()[c] = dscale;
    if (present(out, 2)) out[2].as<float>()[c] = dbias;
    if (!present(out, 0)) return;
    const float r = static_cast<float>(d_.n) * static_cast<float>(d_.s);
    const float a = in[2].as<const float>()[c] * istd, mb = dbias / r, ms = dscale / r;
    float* dx = out[0].as<float>();
    for (int64_t n = 0; n < d_.n; ++n) {
      const int64_t at = (n * d_.c + c) * d_.s;
      for (int64_t i = 0; i < d_.s; ++i)
        dx[at + i] = a * (dy[at + i] - mb - (x[at + i] - mean) * istd * ms);
    }
  }

  // sum_i dy[i] * (x[i] - mean) over one (n, c) run of S values, in lanes folded in double.
  double centered_dot(const float* dy, const float* x, float mean) const {
    float lane[kLanes] = {};
    double total = 0;
    int64_t i = 0;
    for (; i + kLanes <= d_.s; i += kLanes)
      for (int k = 0; k < kLanes; ++k) lane[k] += dy[i + k] * (x[i + k] - mean);
    for (; i < d_.s; ++i) total += double(dy[i]) * double(x[i] - mean);
    for (float l : lane) total += l;
    return total;
  }
};

}  // namespace

// LayerNormGrad(dY, X, Scale, Mean, InvStdDev) -> (dX, dScale?, dBias?), axis (default -1).
std::unique_ptr<Kernel> make_layer_norm_grad(const KernelSpec& s) {
  if (!floats_present(s, 5)) return nullptr;
  const Dims& x = s.inputs[1].shape;
  const int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = s.node.attr_int("axis", -1);
  if (axis < 0) axis += rank;
  if (rank == 0 || axis < 0 || axis >= rank) return nullptr;
  const int64_t outer = product(x, 0, static_cast<size_t>(axis));
  const int64_t inner = product(x, static_cast<size_t>(axis), x.size());
  if (s.inputs[0] != s.inputs[1] || (wanted(s, 0) && s.outputs[0] != s.inputs[1]) || inner == 0 ||
      s.inputs[2].numel() != inner || s.inputs[3].numel() != outer ||
      s.inputs[4].numel() != outer)
    return nullptr;
  for (size_t k = 1; k < 3; ++k)
    if (wanted(s, k) && s.outputs[k].shape != s.inputs[2].shape) return nullptr;
  return std::make_unique<LayerNormGrad>(outer, inner, s.cpu->threads);
}

// BatchNormGrad(dY, X, Scale) -> (dX, dScale?, dBias?), epsilon (default 1e-5). X: (N, C, ...).
std::unique_ptr<Kernel> make_batch_norm_grad(const KernelSpec& s) {
  if (!floats_present(s, 3)) return nullptr;
  const Dims& x = s.inputs[1].shape;
  if (x.size() < 2 || channel_dims(x).numel() == 0 || s.inputs[0] != s.inputs[1] ||
      (wanted(s, 0) && s.outputs[0] != s.inputs[1]) || s.inputs[2].shape != Dims{x[1]})
    return nullptr;
  for (size_t k = 1; k < 3; ++k)
    if (wanted(s, k) && s.outputs[k].shape != Dims{x[1]}) return nullptr;
  return std::make_unique<BatchNormGrad>(channel_dims(x), s.node.attr_float("epsilon", 1e-5f),
                                         s.cpu->threads);
}

}  // namespace pt::cpu
