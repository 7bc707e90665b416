// tests/autodiff/portable_cases.cc: the case list of portable_cases.h. Inputs are uniform random
// with a fixed seed per case; where an op's meaning depends on the data (ReLU's zeros, max-pool
// ties, ignored targets, negative and repeated indices) the data holds such entries.
#include "tests/autodiff/portable_cases.h"

#include <cmath>
#include <cstring>
#include <random>

#include "core/pipetrain_ops.h"

namespace pt {
namespace {

using Dims = std::vector<int64_t>;
using Attrs = std::map<std::string, AttrValue>;

const TensorType kOmitted{};

TensorType f32(const Dims& s) { return TensorType{DType::kFloat32, s}; }

Tensor make(DType t, const Dims& shape) {
  Tensor x;
  x.type = {t, shape};
  x.data.resize(static_cast<size_t>(x.type.bytes()));
  return x;
}

// Uniform in [lo, hi); `step` > 0 rounds to multiples of it (to make ties).
Tensor uniform(const Dims& shape, unsigned seed, float lo = -1.f, float hi = 1.f,
               float step = 0.f) {
  Tensor x = make(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < x.type.numel(); ++i) {
    const float v = u(rng);
    x.as<float>()[i] = step > 0 ? std::round(v / step) * step : v;
  }
  return x;
}

Tensor scalar(float v) {
  Tensor x = make(DType::kFloat32, {});
  *x.as<float>() = v;
  return x;
}

template <class I>
Tensor ints(const Dims& shape, const std::vector<I>& v) {
  Tensor x = make(dtype_of<I>(), shape);
  std::memcpy(x.data.data(), v.data(), x.data.size());
  return x;
}

// ---- element-wise, softmax ------------------------------------------------------------------

void add_elementwise(std::vector<PortableCase>& out) {
  const Dims s = {2, 3, 5};
  Tensor y = uniform(s, 2);
  for (int64_t i = 0; i < y.type.numel(); ++i) y.as<float>()[i] = std::max(y.as<float>()[i], 0.f);
  out.push_back({"relu_grad", "ReluGrad", {}, {{"dY", uniform(s, 1)}, {"Y", y}}, {{"dX", f32(s)}}});
  const auto clip = [&](const std::string& name, bool lo, bool hi) {
    PortableCase c{"clip_grad." + name,
                   "ClipGrad",
                   {},
                   {{"dY", uniform(s, 3)}, {"X", uniform(s, 4)}},
                   {{"dX", f32(s)}}};
    if (lo || hi)
      c.inputs.push_back(lo ? std::pair{std::string("min"), scalar(-0.4f)}
                            : std::pair{std::string(), Tensor{}});
    if (hi) c.inputs.push_back({"max", scalar(0.3f)});
    out.push_back(std::move(c));
  };
  clip("both", true, true);
  clip("min_only", true, false);
  clip("max_only", false, true);
  clip("no_bounds", false, false);
  out.push_back({"erf_grad",
                 "ErfGrad",
                 {},
                 {{"dY", uniform(s, 5)}, {"X", uniform(s, 6, -3, 3)}},
                 {{"dX", f32(s)}}});
  for (const char* mode : {"none", "tanh"})
    out.push_back({std::string("gelu_grad.") + mode,
                   "GeluGrad",
                   {{"approximate", std::string(mode)}},
                   {{"dY", uniform(s, 7)}, {"X", uniform(s, 8, -4, 4)}},
                   {{"dX", f32(s)}}});
  for (int64_t axis : {-1, 1, 0}) {
    const std::string tag = axis == -1 ? "last" : "axis" + std::to_string(axis);
    out.push_back({"softmax_grad." + tag,
                   "SoftmaxGrad",
                   {{"axis", axis}},
                   {{"dY", uniform(s, 9)}, {"Y", uniform(s, 10, 0, 1)}},
                   {{"dX", f32(s)}}});
    if (axis != 0)
      out.push_back({"log_softmax_grad." + tag,
                     "LogSoftmaxGrad",
                     {{"axis", axis}},
                     {{"dY", uniform(s, 11)}, {"Y", uniform(s, 12, -3, 0)}},
                     {{"dX", f32(s)}}});
  }
}

// ---- normalisation --------------------------------------------------------------------------

// LayerNormalization's Mean and InvStdDev of X over [axis, rank), kept as size-1 dims.
std::pair<Tensor, Tensor> layer_stats(const Tensor& x, size_t axis) {
  Dims kept = x.type.shape;
  int64_t inner = 1;
  for (size_t d = axis; d < kept.size(); ++d) inner *= kept[d], kept[d] = 1;
  Tensor mean = make(DType::kFloat32, kept), istd = make(DType::kFloat32, kept);
  for (int64_t r = 0; r < mean.type.numel(); ++r) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < inner; ++i) s += x.as<float>()[r * inner + i];
    const double m = s / static_cast<double>(inner);
    for (int64_t i = 0; i < inner; ++i) s2 += std::pow(x.as<float>()[r * inner + i] - m, 2);
    mean.as<float>()[r] = static_cast<float>(m);
    istd.as<float>()[r] = static_cast<float>(1 / std::sqrt(s2 / static_cast<double>(inner) + 1e-5));
  }
  return {mean, istd};
}

void add_norm(std::vector<PortableCase>& out) {
  struct Ln {
    const char* name;
    Dims x;
    int64_t axis;
    bool dx, dscale, dbias;
  };
  for (const Ln& c :
       {Ln{"last", {2, 3, 8}, -1, true, true, true}, Ln{"axis1", {2, 3, 8}, 1, true, true, true},
        Ln{"axis0", {3, 4}, 0, true, true, true}, Ln{"dx_only", {4, 6}, -1, true, false, false},
        Ln{"params_only", {2, 3, 8}, -1, false, true, true},
        Ln{"dx_dbias", {2, 3, 8}, 2, true, false, true}}) {
    const size_t axis = static_cast<size_t>(c.axis < 0 ? c.axis + int64_t(c.x.size()) : c.axis);
    const Dims ps(c.x.begin() + static_cast<long>(axis), c.x.end());
    const Tensor x = uniform(c.x, 21, -2, 2);
    auto [mean, istd] = layer_stats(x, axis);
    out.push_back({std::string("layer_norm_grad.") + c.name,
                   "LayerNormGrad",
                   {{"axis", c.axis}},
                   {{"dY", uniform(c.x, 22)},
                    {"X", x},
                    {"Scale", uniform(ps, 23, 0.5, 1.5)},
                    {"Mean", mean},
                    {"InvStdDev", istd}},
                   {{"dX", c.dx ? f32(c.x) : kOmitted},
                    {"dScale", c.dscale ? f32(ps) : kOmitted},
                    {"dBias", c.dbias ? f32(ps) : kOmitted}}});
  }
  struct Bn {
    const char* name;
    Dims x;
    float epsilon;
    bool dx, dscale, dbias;
  };
  for (const Bn& c : {Bn{"nchw", {4, 3, 5, 5}, 1e-5f, true, true, true},
                      Bn{"nc", {6, 4}, 1e-5f, true, true, true},
                      Bn{"dx_only_ncl", {2, 3, 7}, 1e-5f, true, false, false},
                      Bn{"params_only_eps", {4, 3, 5, 5}, 1e-3f, false, true, true}}) {
    const Dims ch = {c.x[1]};
    out.push_back({std::string("batch_norm_grad.") + c.name,
                   "BatchNormGrad",
                   {{"epsilon", c.epsilon}},
                   {{"dY", uniform(c.x, 31)},
                    {"X", uniform(c.x, 32, -2, 3)},
                    {"Scale", uniform(ch, 33, 0.5, 1.5)}},
                   {{"dX", c.dx ? f32(c.x) : kOmitted},
                    {"dScale", c.dscale ? f32(ch) : kOmitted},
                    {"dBias", c.dbias ? f32(ch) : kOmitted}}});
  }
  // BatchNormTraining: with both statistics, Y only, and two values per channel (n - 1 = 1).
  struct Bt {
    const char* name;
    Dims x;
    float epsilon;
    bool stats;
  };
  for (const Bt& c : {Bt{"nchw", {4, 3, 5, 5}, 1e-5f, true}, Bt{"nc_y_only", {6, 4}, 1e-5f, false},
                      Bt{"two_per_channel_eps", {2, 3}, 1e-3f, true}}) {
    const Dims ch = {c.x[1]};
    out.push_back({std::string("batch_norm_training.") + c.name,
                   "BatchNormTraining",
                   {{"epsilon", c.epsilon}},
                   {{"X", uniform(c.x, 34, -2, 3)},
                    {"Scale", uniform(ch, 35, 0.5, 1.5)},
                    {"B", uniform(ch, 36)}},
                   {{"Y", f32(c.x)},
                    {"batch_mean", c.stats ? f32(ch) : kOmitted},
                    {"batch_var", c.stats ? f32(ch) : kOmitted}}});
  }
}

// ---- convolution and pooling ----------------------------------------------------------------

// Output length of a window op along one dim (ONNX's formula; ceil_mode rounds up).
int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe, bool ceil) {
  const int64_t span = in + pb + pe - ((k - 1) * d + 1);
  return (ceil ? (span + s - 1) / s : span / s) + 1;
}

Dims window_shape(const Dims& x, int64_t channels, const Dims& k, const Dims& s, const Dims& d,
                  const Dims& pads, bool ceil) {
  const size_t r = k.size();
  Dims y = {x[0], channels};
  for (size_t i = 0; i < r; ++i)
    y.push_back(window_out(x[i + 2], k[i], s[i], d[i], pads[i], pads[i + r], ceil));
  return y;
}

void add_conv(std::vector<PortableCase>& out) {
  struct Conv {
    const char* name;
    Dims x, w, strides, dilations, pads;
    int64_t group;
  };
  for (const Conv& c : {
           Conv{"basic", {2, 4, 9, 9}, {6, 4, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1},
           Conv{"strided_dilated", {2, 4, 9, 9}, {5, 4, 3, 2}, {2, 1}, {2, 1}, {1, 0, 2, 1}, 1},
           Conv{"grouped_floor", {2, 4, 10, 10}, {6, 2, 3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, 2},
           Conv{"depthwise", {2, 4, 9, 9}, {4, 1, 3, 3}, {1, 1}, {2, 2}, {2, 2, 2, 2}, 4},
           Conv{
               "depthwise_x2_strided", {1, 3, 9, 9}, {6, 1, 2, 2}, {3, 3}, {1, 1}, {0, 0, 1, 1}, 3},
           Conv{"conv1d", {2, 3, 11}, {4, 3, 3}, {3}, {1}, {2, 0}, 1},
           Conv{"conv3d",
                {1, 2, 5, 6, 4},
                {3, 2, 2, 3, 2},
                {2, 1, 2},
                {1, 1, 1},
                {1, 1, 0, 0, 1, 1},
                1},
       }) {
    const Dims k(c.w.begin() + 2, c.w.end());
    const Dims y = window_shape(c.x, c.w[0], k, c.strides, c.dilations, c.pads, false);
    const Attrs a{{"strides", c.strides},
                  {"dilations", c.dilations},
                  {"pads", c.pads},
                  {"group", c.group},
                  {"kernel_shape", k}};
    Attrs ai = a, aw = a;
    ai["input_shape"] = c.x;
    aw["weight_shape"] = c.w;
    out.push_back({std::string("conv_grad_input.") + c.name,
                   "ConvGradInput",
                   ai,
                   {{"dY", uniform(y, 41)}, {"W", uniform(c.w, 42)}},
                   {{"dX", f32(c.x)}}});
    out.push_back({std::string("conv_grad_weight.") + c.name,
                   "ConvGradWeight",
                   aw,
                   {{"dY", uniform(y, 43)}, {"X", uniform(c.x, 44)}},
                   {{"dW", f32(c.w)}}});
  }
}

void add_pool(std::vector<PortableCase>& out) {
  struct Pool {
    const char* name;
    Dims x, kernel, strides, pads, dilations;
    int64_t ceil_mode, count_include_pad;
    float step;  // > 0: X on a coarse grid, so windows hold ties
  };
  const std::vector<Pool> max_pools = {
      {"k2s2", {2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 0, 0, 0.f},
      {"pads_ties", {2, 3, 8, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 0, 0.5f},
      {"overlap_ties", {1, 2, 7, 7}, {3, 3}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 0, 0, 1.f},
      {"ceil", {2, 3, 8, 8}, {3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, 0, 0.f},
      {"dilated", {2, 3, 8, 8}, {2, 2}, {1, 1}, {1, 1, 0, 0}, {2, 2}, 0, 0, 0.f},
      {"pool1d", {2, 3, 10}, {3}, {2}, {1, 1}, {1}, 0, 0, 0.f},
  };
  // The attributes both pooling ops take, and dY's shape.
  const auto attrs = [](const Pool& p) {
    return Attrs{{"kernel_shape", p.kernel}, {"strides", p.strides}, {"pads", p.pads},
                 {"ceil_mode", p.ceil_mode}};
  };
  const auto dy_shape = [](const Pool& p) {
    return window_shape(p.x, p.x[1], p.kernel, p.strides, p.dilations, p.pads, p.ceil_mode);
  };
  for (const Pool& p : max_pools) {
    Attrs a = attrs(p);
    a["dilations"] = p.dilations;
    out.push_back({std::string("max_pool_grad.") + p.name, "MaxPoolGrad", a,
                   {{"dY", uniform(dy_shape(p), 51)}, {"X", uniform(p.x, 52, -2, 2, p.step)}},
                   {{"dX", f32(p.x)}}});
  }
  const std::vector<Pool> average_pools = {
      {"exclude_pad", {2, 3, 8, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 0, 0.f},
      {"include_pad", {2, 3, 8, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 1, 0.f},
      {"end_pad_exclude", {2, 3, 7, 7}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 0, 0.f},
      {"end_pad_include", {2, 3, 7, 7}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 1, 0.f},
      {"ceil", {2, 3, 8, 8}, {3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, 0, 0.f},
      {"ceil_pads", {2, 3, 8, 8}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1, 0, 0.f},
      {"asym_1d_include_pad", {2, 3, 11}, {4}, {3}, {2, 1}, {1}, 0, 1, 0.f},
      {"floor_drop", {2, 3, 9, 9}, {2, 2}, {3, 3}, {0, 0, 0, 0}, {1, 1}, 0, 0, 0.f},
  };
  for (const Pool& p : average_pools) {
    Attrs a = attrs(p);
    a["count_include_pad"] = p.count_include_pad;
    a["input_shape"] = p.x;
    out.push_back({std::string("average_pool_grad.") + p.name, "AveragePoolGrad", a,
                   {{"dY", uniform(dy_shape(p), 53)}}, {{"dX", f32(p.x)}}});
  }
}

// ---- gather and loss ------------------------------------------------------------------------

void add_gather(std::vector<PortableCase>& out) {
  const auto gather = [&](const std::string& name, int64_t axis, const Dims& data, Tensor indices,
                          const Dims& dy) {
    out.push_back({"gather_grad." + name,
                   "GatherGrad",
                   {{"axis", axis}, {"data_shape", data}},
                   {{"dY", uniform(dy, 61)}, {"Indices", std::move(indices)}},
                   {{"dData", f32(data)}}});
  };
  gather("axis0", 0, {7, 4}, ints<int64_t>({2, 3}, {1, -1, 3, 1, 0, -7}), {2, 3, 4});
  gather("axis1_int32", 1, {3, 6, 2}, ints<int32_t>({4}, {5, -1, 2, 2}), {3, 4, 2});
  gather("axis_last", -1, {3, 5}, ints<int64_t>({2, 2}, {4, -5, 0, 4}), {3, 2, 2});
  gather("scalar_index", 0, {5, 3}, ints<int64_t>({}, {-2}), {3});
}

void add_loss(std::vector<PortableCase>& out) {
  struct Ce {
    const char* name;
    Dims logits;
    std::vector<int64_t> target;
    int64_t ignore_index;
  };
  for (const Ce& c : {Ce{"default_ignore", {6, 5}, {0, -100, 4, 2, -100, 1}, -100},
                      Ce{"ignore2_3d", {2, 3, 4}, {2, 0, 3, 2, 1, 3}, 2}}) {
    const Dims ts(c.logits.begin(), c.logits.end() - 1);
    const Attrs a{{"ignore_index", c.ignore_index}};
    const Tensor logits = uniform(c.logits, 71, -3, 3);
    out.push_back({std::string("softmax_cross_entropy.") + c.name,
                   "SoftmaxCrossEntropy",
                   a,
                   {{"Logits", logits}, {"Target", ints(ts, c.target)}, {"Scale", scalar(0.25f)}},
                   {{"Loss", f32({})}}});
    out.push_back({std::string("softmax_cross_entropy_grad.") + c.name,
                   "SoftmaxCrossEntropyGrad",
                   a,
                   {{"dLoss", scalar(1.5f)},
                    {"Logits", logits},
                    {"Target", ints(ts, c.target)},
                    {"Scale", scalar(0.25f)}},
                   {{"dLogits", f32(c.logits)}}});
  }
}

// ---- attention ------------------------------------------------------------------------------

struct AttentionCase {
  const char* name;
  int64_t b, h, hkv, s, t, d, dv;
  bool causal;
  DType mask;  // kUndefined: none
  Dims mask_shape;
};

// The mask's additive value at (b, h, i, j), right-aligned broadcast.
double mask_value(const AttentionCase& c, const Tensor& m, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (c.mask == DType::kUndefined) return 0;
  const int64_t at[4] = {b, h, i, j};
  int64_t off = 0;
  const size_t rank = c.mask_shape.size();
  for (size_t r = 0; r < rank; ++r) off = off * c.mask_shape[r] + (c.mask_shape[r] == 1 ? 0 : at[4 - rank + r]);
  if (c.mask == DType::kBool) return m.as<bool>()[off] ? 0 : -INFINITY;
  return m.as<float>()[off];
}

// Y and LogSumExp of FusedAttention in double (the gradient's inputs must be the forward's).
std::pair<Tensor, Tensor> attention_forward(const AttentionCase& c, float scale, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& m) {
  Tensor y = make(DType::kFloat32, {c.b, c.h, c.s, c.dv}), lse = make(DType::kFloat32, {c.b, c.h, c.s});
  std::vector<double> p(static_cast<size_t>(c.t));
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.h; ++h)
      for (int64_t i = 0; i < c.s; ++i) {
        const int64_t row = (b * c.h + h) * c.s + i, kv = b * c.hkv + h / (c.h / c.hkv);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < c.t; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < c.d; ++x) dot += double(q.as<float>()[row * c.d + x]) * k.as<float>()[(kv * c.t + j) * c.d + x];
          p[j] = c.causal && j > i ? -INFINITY : dot * scale + mask_value(c, m, b, h, i, j);
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j < c.t; ++j) sum += p[j] = std::exp(p[j] - mx);
        lse.as<float>()[row] = static_cast<float>(mx + std::log(sum));
        for (int64_t x = 0; x < c.dv; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < c.t; ++j) acc += p[j] / sum * v.as<float>()[(kv * c.t + j) * c.dv + x];
          y.as<float>()[row * c.dv + x] = static_cast<float>(acc);
        }
      }
  return {std::move(y), std::move(lse)};
}

void add_attention(std::vector<PortableCase>& out) {
  for (const AttentionCase& c :
       {AttentionCase{"causal_gqa_float_mask", 1, 4, 2, 7, 7, 4, 3, true, DType::kFloat32, {7}},
        AttentionCase{"bool_mask", 2, 2, 2, 5, 6, 4, 4, false, DType::kBool, {2, 1, 5, 6}}}) {
    const Tensor q = uniform({c.b, c.h, c.s, c.d}, 81), k = uniform({c.b, c.hkv, c.t, c.d}, 82),
                 v = uniform({c.b, c.hkv, c.t, c.dv}, 83), dy = uniform({c.b, c.h, c.s, c.dv}, 84);
    Tensor m = c.mask == DType::kBool ? make(DType::kBool, c.mask_shape) : uniform(c.mask_shape, 85, -2.f, 0.f);
    if (c.mask == DType::kBool)  // key 0 always seen: no row fully masked
      for (int64_t x = 0; x < m.type.numel(); ++x) m.as<bool>()[x] = x % c.t == 0 || x % 3 != 1;
    else
      m.as<float>()[3] = -INFINITY;
    const float scale = 0.5f;  // an attribute on the causal case, the default 1/sqrt(D) on the other
    Attrs a{{"causal", int64_t{c.causal ? 1 : 0}}};
    if (c.causal) a["scale"] = scale;
    const auto [y, lse] = attention_forward(c, scale, q, k, v, m);
    out.push_back({std::string("fused_attention.") + c.name, "FusedAttention", a,
                   {{"Q", q}, {"K", k}, {"V", v}, {"Mask", m}},
                   {{"Y", f32({c.b, c.h, c.s, c.dv})}, {"LogSumExp", f32({c.b, c.h, c.s})}}});
    out.push_back({std::string("fused_attention_grad.") + c.name, "FusedAttentionGrad", a,
                   {{"dY", dy}, {"Q", q}, {"K", k}, {"V", v}, {"Y", y}, {"LogSumExp", lse}, {"Mask", m}},
                   {{"dQ", q.type}, {"dK", k.type}, {"dV", v.type}}});
  }
}

}  // namespace

std::vector<PortableCase> portable_cases() {
  std::vector<PortableCase> out;
  add_elementwise(out);
  add_norm(out);
  add_conv(out);
  add_pool(out);
  add_gather(out);
  add_loss(out);
  add_attention(out);
  return out;
}

Graph case_graph(const PortableCase& c) {
  Graph g;
  g.name = c.name;
  g.opsets = {{"", 17}, {kPipetrainDomain, 1}};
  Node n;
  n.name = c.op;
  n.op_type = c.op;
  n.domain = kPipetrainDomain;
  n.attrs = c.attrs;
  for (const auto& [name, tensor] : c.inputs) {
    if (name.empty()) {
      n.inputs.push_back(kNoValue);
      continue;
    }
    n.inputs.push_back(g.add_value(name, tensor.type));
    g.inputs.push_back(n.inputs.back());
  }
  for (const auto& [name, type] : c.outputs) {
    if (type.dtype == DType::kUndefined) {
      n.outputs.push_back(kNoValue);
      continue;
    }
    n.outputs.push_back(g.add_value(name, type));
    g.outputs.push_back(n.outputs.back());
  }
  g.add_node(std::move(n));
  g.rebuild_uses();
  return g;
}

}  // namespace pt
