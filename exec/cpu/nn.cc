// exec/cpu/nn.cc: Conv, MaxPool, AveragePool, LayerNormalization, Softmax and LogSoftmax on
// oneDNN primitives (nn_channel.cc has BatchNormalization and GlobalAveragePool). Geometry,
// layouts, primitives and reorders are fixed when the kernel is made; run() binds the step's
// buffers and executes.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "exec/cpu/cpu_kernels.h"
#include "exec/cpu/dnnl_util.h"

namespace pt::cpu {
namespace {

using Dims = std::vector<int64_t>;
using dnnl::memory;

// ---------------------------------------------------------------------------------------------
// A kernel made of oneDNN primitives run in order (reorders, the op, reorders back).



// Whether `a` and `b` put every element at the same offset: equal descs, or dense descs of the
// same dims whose strides differ only on dims of size 1 (nchw and nhwc with H = W = 1).
bool same_bytes(const memory::desc& a, const memory::desc& b) {
  if (a == b) return true;
  const dnnl_memory_desc_t &x = a.data, &y = b.data;
  if (x.ndims != y.ndims || x.data_type != y.data_type || x.format_kind != dnnl_blocked ||
      y.format_kind != dnnl_blocked || x.format_desc.blocking.inner_nblks != 0 ||
      y.format_desc.blocking.inner_nblks != 0 || x.offset0 != y.offset0 ||
      a.get_size() != b.get_size())
    return false;
  for (int i = 0; i < x.ndims; ++i) {
    if (x.dims[i] != y.dims[i] || x.padded_dims[i] != y.padded_dims[i]) return false;
    if (x.dims[i] != 1 && x.format_desc.blocking.strides[i] != y.format_desc.blocking.strides[i])
      return false;
  }
  return true;
}

// Where an argument's data lives while the kernel runs.
struct Place {
  enum Kind { kInput, kOutput, kScratch, kScratchpad } kind = kInput;
  size_t at = 0;  // input or output index, or byte offset into the kernel's scratch
};

class DnnlKernel final : public Kernel {
 public:
  explicit DnnlKernel(CpuContext& ctx)
      : engine_(*ctx.engine), stream_(*ctx.stream), threads_(ctx.threads) {}

  const dnnl::engine& engine() const { return engine_; }

  // A region of `bytes` in the kernel's scratch, 64-byte aligned.
  Place reserve(size_t bytes) {
    const Place p{Place::kScratch, reserved_};
    reserved_ += round_up(bytes);
    return p;
  }

  // Appends `prim`; its user-mode scratchpad region is shared with the other steps, which run
  // one after another. args: (DNNL_ARG_*, layout, place).
  void add_step(const dnnl::primitive& prim, const memory::desc& scratchpad,
                const std::vector<std::tuple<int, memory::desc, Place>>& args) {
    Step step{prim, {}, {}, {}};
    for (const auto& [arg, md, place] : args) step.add(arg, md, place, engine_);
    if (scratchpad.get_size() > 0) {
      step.add(DNNL_ARG_SCRATCHPAD, scratchpad, {Place::kScratchpad, 0}, engine_);
      scratchpad_ = std::max(scratchpad_, scratchpad.get_size());
    }
    steps_.push_back(std::move(step));
  }

  // Data at `from` (laid out as `have`) as `want`: `from` itself when the layouts agree, else a
  // scratch copy made by a reorder step.
  Place reordered(Place from, const memory::desc& have, const memory::desc& want) {
    if (same_bytes(have, want)) return from;
    const Place to = reserve(want.get_size());
    add_reorder(from, have, to, want);
    return to;
  }

  void add_reorder(Place from, const memory::desc& have, Place to, const memory::desc& want) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::reorder::primitive_desc pd(engine_, have, engine_, want, attr);
    add_step(dnnl::reorder(pd), pd.scratchpad_desc(),
             {{DNNL_ARG_FROM, have, from}, {DNNL_ARG_TO, want, to}});
  }

  // Runs after the steps, e.g. to turn a variance into InvStdDev.
  using Epilogue = std::function<void(std::span<const Buffer> in, std::span<const Buffer> out,
                                      const std::byte* scratch)>;
  void set_epilogue(Epilogue f) { epilogue_ = std::move(f); }

  size_t scratch_bytes() const override {
    const size_t total = reserved_ + scratchpad_;
    return total > 0 ? total + kScratchAlign : 0;
  }

  void run(std::span<const Buffer> in, std::span<const Buffer> out, void* scratch) override {
    const auto p = reinterpret_cast<uintptr_t>(scratch);
    auto* base = reinterpret_cast<std::byte*>((p + kScratchAlign - 1) / kScratchAlign * kScratchAlign);
    const ThreadScope threads(threads_);
    for (const Step& s : steps_) {
      for (size_t i = 0; i < s.mems.size(); ++i)
        s.mems[i].set_data_handle(address(s.places[i], in, out, base));
      const dnnl_status_t st = dnnl_primitive_execute(
          s.prim.get(), stream_.get(), static_cast<int>(s.args.size()), s.args.data());
      PT_CHECK(st == dnnl_success, "oneDNN primitive failed with status " + std::to_string(st));
    }
    if (epilogue_) epilogue_(in, out, base);
  }

 private:
  struct Step {
    dnnl::primitive prim;
    std::vector<memory> mems;
    std::vector<Place> places;
    std::vector<dnnl_exec_arg_t> args;

    void add(int arg, const memory::desc& md, Place place, const dnnl::engine& eng) {
      mems.emplace_back(md, eng, static_cast<void*>(DNNL_MEMORY_NONE));
      places.push_back(place);
      args.push_back({arg, mems.back().get()});
    }
  };

  void* address(Place p, std::span<const Buffer> in, std::span<const Buffer> out,
                std::byte* base) const {
    switch (p.kind) {
      case Place::kInput: return in[p.at].data;
      case Place::kOutput: return out[p.at].data;
      case Place::kScratch: return base + p.at;
      case Place::kScratchpad: return base + reserved_;
    }
    return nullptr;
  }

  const dnnl::engine& engine_;
  dnnl::stream& stream_;
  int threads_;
  std::vector<Step> steps_;
  size_t reserved_ = 0;    // bytes of scratch regions; the shared scratchpad follows them
  size_t scratchpad_ = 0;  // bytes of the largest user-mode scratchpad
  Epilogue epilogue_;
};

// ---------------------------------------------------------------------------------------------
// Window geometry shared by Conv and pooling.

// A window op's spatial geometry in oneDNN's terms (dilation counted from 0: 0 is dense).
struct Window {
  Dims kernel, strides, dilation, pad_l, pad_r;
  bool ceil_padded = false;  // pad_r grew past the given pads so that the last window fits
};

Dims ints_or(const Node& n, const char* key, size_t count, int64_t fallback) {
  Dims v = n.attr_ints(key);
  if (v.empty()) v.assign(count, fallback);
  return v;
}

// Resolves kernel, strides, dilations, pads and auto_pad against the input `in` and output `out`
// (both (N, C, spatial...)) so that, per spatial dim, out = (in + pad_l + pad_r - dk) / s + 1
// with dk = (k - 1) * d + 1, as oneDNN requires. SAME_UPPER puts the odd pad at the end,
// SAME_LOWER at the start; pad_r grows where ceil_mode made the output one longer.
std::optional<Window> resolve_window(const Node& n, const Dims& in, const Dims& out,
                                     const Dims& kernel) {
  const size_t r = in.size() - 2;
  Window w;
  w.kernel = kernel;
  w.strides = ints_or(n, "strides", r, 1);
  const Dims dil = ints_or(n, "dilations", r, 1);
  const Dims pads = ints_or(n, "pads", 2 * r, 0);
  const std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  if (kernel.size() != r || w.strides.size() != r || dil.size() != r || pads.size() != 2 * r ||
      out.size() != in.size() || !(same || auto_pad == "NOTSET" || auto_pad == "VALID"))
    return std::nullopt;
  for (size_t i = 0; i < r; ++i) {
    const int64_t s = w.strides[i], dk = (kernel[i] - 1) * dil[i] + 1;
    const int64_t src = in[i + 2], dst = out[i + 2];
    if (s < 1 || dil[i] < 1 || kernel[i] < 1 || dst < 1) return std::nullopt;
    int64_t pl = auto_pad == "NOTSET" ? pads[i] : 0, pr = auto_pad == "NOTSET" ? pads[i + r] : 0;
    if (same) {
      const int64_t total = std::max<int64_t>(0, (dst - 1) * s + dk - src);
      pl = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pr = total - pl;
    }
    const int64_t need = (dst - 1) * s + dk - src - pl;
    if (need > pr) {
      pr = need;
      w.ceil_padded = true;
    }
    if (pl < 0 || (src + pl + pr - dk) / s + 1 != dst) return std::nullopt;
    w.dilation.push_back(dil[i] - 1);
    w.pad_l.push_back(pl);
    w.pad_r.push_back(pr);
  }
  return w;
}

bool float_only(const KernelSpec& s) {
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (s.has_input(i) && s.inputs[i].dtype != DType::kFloat32) return false;
  return s.outputs[0].dtype == DType::kFloat32;
}

// Only the first output is wanted (MaxPool's Indices omitted).
bool single_output(const KernelSpec& s) {
  for (size_t i = 1; i < s.outputs.size(); ++i)
    if (s.outputs[i].dtype != DType::kUndefined) return false;
  return !s.outputs.empty();
}

template <class Build>
std::unique_ptr<Kernel> build_or_null(const KernelSpec& s, Build build) {
  const ThreadScope threads(s.cpu->threads);
  try {
    return build();
  } catch (const dnnl::error&) {
    return nullptr;  // oneDNN has no implementation for this combination
  }
}

// ---------------------------------------------------------------------------------------------
// Conv

memory::desc any_layout(const Dims& dims) {
  return memory::desc(dims, memory::data_type::f32, memory::format_tag::any);
}

// Y = conv(X, W) + B with X: (N, C, in...), W: (M, C/group, k...), B: (M), Y: (N, M, out...).
// W is viewed as (group, M/group, C/group, k...) when grouped. oneDNN picks the layouts (blocked
// for speed); X and W are reordered into scratch before, Y out of it after, unless the chosen
// layout puts every element where the plain one does (nhwc with H = W = 1). A dense 1x1 conv is
// a GEMM on the plain layouts, faster there than the reorders it would need (about 3x on
// 48->8 channels at 16x16).
std::unique_ptr<Kernel> build_conv(const KernelSpec& s, const Window& w, int64_t group) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const Dims& x = s.inputs[0].shape;
  const Dims& y = s.outputs[0].shape;
  Dims wd = s.inputs[1].shape;
  if (group > 1) {
    wd[0] /= group;
    wd.insert(wd.begin(), group);
  }
  const memory::desc x_md = plain_desc(s.inputs[0]), y_md = plain_desc(s.outputs[0]);
  const memory::desc w_md = plain_desc(DType::kFloat32, wd);
  const memory::desc b_md = s.has_input(2) ? plain_desc(s.inputs[2]) : memory::desc();
  const bool pointwise =
      group == 1 && std::all_of(w.kernel.begin(), w.kernel.end(), [](int64_t k) { return k == 1; });
  const dnnl::convolution_forward::desc d(
      dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
      pointwise ? x_md : any_layout(x), pointwise ? w_md : any_layout(wd), b_md,
      pointwise ? y_md : any_layout(y), w.strides, w.dilation, w.pad_l, w.pad_r);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::convolution_forward::primitive_desc pd(d, attr, k->engine());

  const Place xp = k->reordered({Place::kInput, 0}, x_md, pd.src_desc());
  const Place wp = k->reordered({Place::kInput, 1}, w_md, pd.weights_desc());
  const bool y_plain = same_bytes(pd.dst_desc(), y_md);
  const Place yp = y_plain ? Place{Place::kOutput, 0} : k->reserve(pd.dst_desc().get_size());
  std::vector<std::tuple<int, memory::desc, Place>> args = {
      {DNNL_ARG_SRC, pd.src_desc(), xp},
      {DNNL_ARG_WEIGHTS, pd.weights_desc(), wp},
      {DNNL_ARG_DST, pd.dst_desc(), yp}};
  if (s.has_input(2)) args.emplace_back(DNNL_ARG_BIAS, b_md, Place{Place::kInput, 2});
  k->add_step(dnnl::convolution_forward(pd), pd.scratchpad_desc(), args);
  if (!y_plain) k->add_reorder(yp, pd.dst_desc(), {Place::kOutput, 0}, y_md);
  return k;
}

// ---------------------------------------------------------------------------------------------
// Pooling

// Y[n, c, o...] = max or mean of X[n, c, window(o)...], both in the user's plain layout.
std::unique_ptr<Kernel> build_pool(const KernelSpec& s, dnnl::algorithm alg,
                                   const memory::desc& x_md, const memory::desc& y_md,
                                   const Window& w) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, x_md, y_md,
                                         w.strides, w.kernel, w.dilation, w.pad_l, w.pad_r);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::pooling_v2_forward::primitive_desc pd(d, attr, k->engine());
  k->add_step(dnnl::pooling_v2_forward(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_SRC, x_md, {Place::kInput, 0}}, {DNNL_ARG_DST, y_md, {Place::kOutput, 0}}});
  return k;
}

// X: (N, C, spatial...) with 1 to 3 spatial dims, Y of the same rank.
bool pool_shapes_ok(const KernelSpec& s) {
  const size_t r = s.inputs[0].shape.size();
  return s.inputs.size() == 1 && r >= 3 && r <= 5 && s.outputs[0].shape.size() == r;
}

std::unique_ptr<Kernel> make_window_pool(const KernelSpec& s, dnnl::algorithm alg,
                                         bool count_include_pad) {
  const Dims& x = s.inputs[0].shape;
  const auto w = resolve_window(s.node, x, s.outputs[0].shape, s.node.attr_ints("kernel_shape"));
  // With count_include_pad, ONNX does not count the cells ceil_mode adds; oneDNN would.
  if (!w || (count_include_pad && w->ceil_padded)) return nullptr;
  return build_or_null(s, [&] {
    return build_pool(s, alg, plain_desc(s.inputs[0]), plain_desc(s.outputs[0]), *w);
  });
}

// ---------------------------------------------------------------------------------------------
// LayerNormalization and softmax


using Args = std::vector<std::tuple<int, memory::desc, Place>>;

// LayerNormalization over the dims from `axis` on: X viewed as (outer, inner), Scale and B as
// (inner). Y = (X - mean) / sqrt(var + epsilon) * Scale + B per row; the optional outputs are
// Mean and InvStdDev = 1 / sqrt(var + epsilon), (outer) values each.
std::unique_ptr<Kernel> build_layer_norm(const KernelSpec& s, int64_t outer, int64_t inner) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const memory::desc x_md = plain_desc(DType::kFloat32, {outer, inner});
  const memory::desc row_md = plain_desc(DType::kFloat32, {inner});
  const memory::desc stat_md = plain_desc(DType::kFloat32, {outer});
  const auto wanted = [&](size_t i) { return i < s.outputs.size() && s.outputs[i].dtype != DType::kUndefined; };
  const bool stats = wanted(1) || wanted(2);
  const bool shift = s.has_input(2);
  const float eps = s.node.attr_float("epsilon", 1e-5f);
  using F = dnnl::normalization_flags;
  const dnnl::layer_normalization_forward::desc d(
      stats ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, x_md,
      stat_md, eps, F::use_scale | (shift ? F::use_shift : F::none));
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::layer_normalization_forward::primitive_desc pd(d, attr, k->engine());

  Args args = {{DNNL_ARG_SRC, x_md, {Place::kInput, 0}},
               {DNNL_ARG_DST, x_md, {Place::kOutput, 0}},
               {DNNL_ARG_SCALE, row_md, {Place::kInput, 1}}};
  if (shift) args.emplace_back(DNNL_ARG_SHIFT, row_md, Place{Place::kInput, 2});
  const size_t stat_bytes = static_cast<size_t>(outer) * sizeof(float);
  const Place var = stats ? k->reserve(stat_bytes) : Place{};
  if (stats) {
    args.emplace_back(DNNL_ARG_MEAN, stat_md,
                      wanted(1) ? Place{Place::kOutput, 1} : k->reserve(stat_bytes));
    args.emplace_back(DNNL_ARG_VARIANCE, stat_md, var);
  }
  k->add_step(dnnl::layer_normalization_forward(pd), pd.scratchpad_desc(), args);
  if (wanted(2))
    k->set_epilogue([=](std::span<const Buffer>, std::span<const Buffer> out,
                        const std::byte* scratch) {
      const auto* v = reinterpret_cast<const float*>(scratch + var.at);
      float* inv_std = out[2].as<float>();
      for (int64_t i = 0; i < outer; ++i) inv_std[i] = 1.f / std::sqrt(v[i] + eps);
    });
  return k;
}

// Softmax (softmax_accurate) or LogSoftmax (softmax_log) along one axis of X (opset 13).
std::unique_ptr<Kernel> build_softmax(const KernelSpec& s, dnnl::algorithm alg, int axis) {
  auto k = std::make_unique<DnnlKernel>(*s.cpu);
  const memory::desc x_md = plain_desc(s.inputs[0]);
  const dnnl::softmax_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, x_md, x_md,
                                         axis);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::softmax_v2_forward::primitive_desc pd(d, attr, k->engine());
  k->add_step(dnnl::softmax_v2_forward(pd), pd.scratchpad_desc(),
              {{DNNL_ARG_SRC, x_md, {Place::kInput, 0}}, {DNNL_ARG_DST, x_md, {Place::kOutput, 0}}});
  return k;
}

std::unique_ptr<Kernel> make_softmax_like(const KernelSpec& s, dnnl::algorithm alg) {
  if (s.inputs.size() != 1 || !single_output(s) || !float_only(s) || s.graph.opset() < 13)
    return nullptr;
  const int64_t rank = static_cast<int64_t>(s.inputs[0].shape.size());
  int64_t axis = s.node.attr_int("axis", -1);
  if (axis < 0) axis += rank;
  if (rank == 0 || axis < 0 || axis >= rank || s.outputs[0] != s.inputs[0]) return nullptr;
  return build_or_null(s, [&] { return build_softmax(s, alg, static_cast<int>(axis)); });
}

}  // namespace

std::unique_ptr<Kernel> make_conv(const KernelSpec& s) {
  if (s.inputs.size() < 2 || !single_output(s) || !float_only(s)) return nullptr;
  const Dims& x = s.inputs[0].shape;
  const Dims& wt = s.inputs[1].shape;
  const Dims& y = s.outputs[0].shape;
  const int64_t group = s.node.attr_int("group", 1);
  if (x.size() < 3 || x.size() > 5 || wt.size() != x.size() || y.size() != x.size() || group < 1)
    return nullptr;
  // X: (N, C, ...), W: (M, C/group, k...), Y: (N, M, ...), B: (M)
  const int64_t c = x[1], m = wt[0];
  if (c % group != 0 || m % group != 0 || wt[1] * group != c || y[0] != x[0] || y[1] != m)
    return nullptr;
  if (s.has_input(2) && s.inputs[2].shape != Dims{m}) return nullptr;
  const Dims kernel(wt.begin() + 2, wt.end());
  const Dims given = s.node.attr_ints("kernel_shape");
  if (!given.empty() && given != kernel) return nullptr;
  const auto w = resolve_window(s.node, x, y, kernel);
  if (!w) return nullptr;
  return build_or_null(s, [&] { return build_conv(s, *w, group); });
}

// MaxPool with 1 to 3 spatial dims (dilations through pooling_v2); the Indices output is not
// made, so a node that asks for it is declined. f32, u8 and s8.
std::unique_ptr<Kernel> make_max_pool(const KernelSpec& s) {
  if (!pool_shapes_ok(s) || !single_output(s)) return nullptr;
  const DType t = s.inputs[0].dtype;
  if (t != s.outputs[0].dtype || (t != DType::kFloat32 && t != DType::kUInt8 && t != DType::kInt8))
    return nullptr;
  return make_window_pool(s, dnnl::algorithm::pooling_max, false);
}

// AveragePool: count_include_pad chooses whether padded cells count in the divisor.
std::unique_ptr<Kernel> make_average_pool(const KernelSpec& s) {
  if (!pool_shapes_ok(s) || !single_output(s) || !float_only(s)) return nullptr;
  const bool include = s.node.attr_int("count_include_pad", 0) != 0;
  return make_window_pool(s,
                          include ? dnnl::algorithm::pooling_avg_include_padding
                                  : dnnl::algorithm::pooling_avg_exclude_padding,
                          include);
}

// LayerNormalization (opset 17): axis (negative counts from the end), epsilon, stash_type 1.
std::unique_ptr<Kernel> make_layer_norm(const KernelSpec& s) {
  if (s.inputs.size() < 2 || s.outputs.size() > 3 || !float_only(s) || !s.has_input(1))
    return nullptr;
  for (size_t i = 1; i < s.outputs.size(); ++i)
    if (s.outputs[i].dtype != DType::kUndefined && s.outputs[i].dtype != DType::kFloat32)
      return nullptr;
  const Dims& x = s.inputs[0].shape;
  const int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = s.node.attr_int("axis", -1);
  if (axis < 0) axis += rank;
  if (rank == 0 || axis < 0 || axis >= rank || s.node.attr_int("stash_type", 1) != 1)
    return nullptr;
  const int64_t outer = product(x, 0, static_cast<size_t>(axis));
  const int64_t inner = product(x, static_cast<size_t>(axis), x.size());
  if (s.inputs[1].numel() != inner || (s.has_input(2) && s.inputs[2].numel() != inner) ||
      s.outputs[0] != s.inputs[0])
    return nullptr;
  return build_or_null(s, [&] { return build_layer_norm(s, outer, inner); });
}

std::unique_ptr<Kernel> make_softmax(const KernelSpec& s) {
  return make_softmax_like(s, dnnl::algorithm::softmax_accurate);
}

std::unique_ptr<Kernel> make_log_softmax(const KernelSpec& s) {
  return make_softmax_like(s, dnnl::algorithm::softmax_log);
}

}  // namespace pt::cpu
