// exec/cuda/cudnn_attention.cc: FusedAttention and FusedAttentionGrad (core/pipetrain_ops.h)
// under Precision::kBf16 and kFp16 on cuDNN's fused flash attention, composed with the cudnn
// frontend's graph API (cuDNN 9). Q, K and V (the gradient: also Y and dY) are rounded to bf16 or
// fp16 into the kernel's scratch; scores, softmax and sums stay fp32 inside cuDNN; the outputs
// are widened back to fp32. LogSumExp is cuDNN's softmax statistic, the natural log of the sum of exp of the
// scaled scores: the quantity the CPU and fp32 kernels write, so either gradient reads it.
//
// cuDNN is given no mask: the contract's fully masked rows (Y the mean of V, no gradient) have no
// cuDNN counterpart, so masked attention, and any geometry cuDNN's support check refuses, stays
// on attention.cu's fp32 kernels (the factories in attention.cc ask here first). Causal is
// top-left aligned, as the contract's. The backward asks for cuDNN's deterministic algorithm, so
// every run gives the same bits.
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "exec/cuda/cuda_kernels.h"
#include "exec/cuda/cudnn_util.h"
#include "exec/cuda/launch.h"
#include "exec/cuda/plan.h"

// The frontend is built to find cuDNN's functions with dlsym on this handle
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, exec/cuda/CMakeLists.txt): the libcudnn this backend
// links, set before the first graph is made.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace pt::cuda {
namespace {

namespace fe = cudnn_frontend;

void find_cudnn() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Loaded already, as this program's dependency: RTLD_NOLOAD hands back its handle.
    const std::string name = "libcudnn.so." + std::to_string(CUDNN_MAJOR);
    void* loaded = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
    fe::cudnn_dlhandle = loaded ? loaded : RTLD_DEFAULT;
  });
}
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
using GraphPtr = std::shared_ptr<const fe::graph::Graph>;

// The graph's tensors by uid (the execution's variant pack names them so).
enum Uid : int64_t { kQ = 1, kK, kV, kY, kLse, kDy, kDq, kDk, kDv };

using Dims4 = std::vector<int64_t>;

// Row-major strides of dims.
Dims4 packed(const Dims4& d) {
  Dims4 s(d.size(), 1);
  for (size_t i = d.size() - 1; i-- > 0;) s[i] = s[i + 1] * d[i + 1];
  return s;
}

int64_t count(const Dims4& d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

struct Shapes {
  Dims4 q, k, v, y, lse;
};
Shapes shapes(const AttentionGeometry& g) {
  return {{g.batch, g.heads, g.queries, g.dim},
          {g.batch, g.kv_heads, g.keys, g.dim},
          {g.batch, g.kv_heads, g.keys, g.vdim},
          {g.batch, g.heads, g.queries, g.vdim},
          {g.batch, g.heads, g.queries, 1}};
}

TensorPtr input(fe::graph::Graph& graph, const char* name, Uid uid, const Dims4& dims) {
  return graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(packed(dims)));
}

void mark_output(const TensorPtr& t, Uid uid, const Dims4& dims) {
  t->set_output(true).set_uid(uid).set_dim(dims).set_stride(packed(dims));
}

std::shared_ptr<fe::graph::Graph> half_graph(bool bf16) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

// Builds the graph's execution plan on the context's handle and reads its workspace; false where
// cuDNN does not support the graph on this device.
bool build(fe::graph::Graph& graph, const CudaContext& ctx, int64_t* workspace) {
  return graph.build(ctx.cudnn, {fe::HeurMode_t::A}).is_good() && graph.get_workspace_size(*workspace).is_good();
}

void execute(const fe::graph::Graph& graph, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack,
             void* workspace) {
  fe::error_t e = graph.execute(handle, pack, workspace);
  if (!e.is_good())
    library_failure("cuDNN", __FILE__, __LINE__, "cudnn_frontend::graph::Graph::execute (fused attention)",
                    e.get_message().c_str());
}

// Whether cuDNN is asked at all: bf16 or fp16 mode, no mask (see the top of the file).
bool wanted(const AttentionGeometry& g, const CudaContext& ctx) {
  return half_products(ctx.precision) && g.mask == AttentionGeometry::Mask::kNone && g.batch * g.heads > 0 &&
         g.queries > 0;
}

std::byte* at(void* scratch, size_t offset) { return ScratchLayout::base(scratch) + offset; }

}  // namespace

std::unique_ptr<Kernel> make_cudnn_attention(const AttentionGeometry& g, CudaContext& ctx) {
  if (!wanted(g, ctx)) return nullptr;
  find_cudnn();
  const Shapes d = shapes(g);
  const bool bf16 = ctx.precision == Precision::kBf16;
  std::shared_ptr<fe::graph::Graph> graph = half_graph(bf16);
  const TensorPtr q = input(*graph, "Q", kQ, d.q), k = input(*graph, "K", kK, d.k), v = input(*graph, "V", kV, d.v);
  auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_attn_scale(g.scale);
  if (g.causal) options.set_causal_mask(true);
  const auto [y, lse] = graph->sdpa(q, k, v, options);
  mark_output(y, kY, d.y);
  mark_output(lse, kLse, d.lse);
  lse->set_data_type(fe::DataType_t::FLOAT);
  int64_t workspace = 0;
  if (!build(*graph, ctx, &workspace)) return nullptr;

  ScratchLayout layout;
  const size_t half = sizeof(uint16_t);
  const size_t q16 = layout.reserve(half * count(d.q)), k16 = layout.reserve(half * count(d.k)),
               v16 = layout.reserve(half * count(d.v)), y16 = layout.reserve(half * count(d.y)),
               lse32 = layout.reserve(sizeof(float) * count(d.lse)),
               ws = layout.reserve(static_cast<size_t>(workspace));
  const cudaStream_t stream = ctx.stream;
  const cudnnHandle_t handle = ctx.cudnn;
  return fn_kernel(
      [graph = GraphPtr(graph), d, q16, k16, v16, y16, lse32, ws, bf16, stream, handle](Args in, Args out, void* scratch) {
        launch_to_half(in[0].as<const float>(), at(scratch, q16), count(d.q), bf16, stream);
        launch_to_half(in[1].as<const float>(), at(scratch, k16), count(d.k), bf16, stream);
        launch_to_half(in[2].as<const float>(), at(scratch, v16), count(d.v), bf16, stream);
        void* lse = out.size() > 1 && out[1].present() ? out[1].data : at(scratch, lse32);
        std::unordered_map<int64_t, void*> pack{{kQ, at(scratch, q16)}, {kK, at(scratch, k16)},
                                                {kV, at(scratch, v16)}, {kY, at(scratch, y16)},
                                                {kLse, lse}};
        execute(*graph, handle, pack, at(scratch, ws));
        launch_from_half(at(scratch, y16), out[0].as<float>(), count(d.y), bf16, stream);
      },
      layout.bytes());
}

std::unique_ptr<Kernel> make_cudnn_attention_grad(const AttentionGeometry& g, CudaContext& ctx) {
  if (!wanted(g, ctx)) return nullptr;
  find_cudnn();
  const Shapes d = shapes(g);
  const bool bf16 = ctx.precision == Precision::kBf16;
  std::shared_ptr<fe::graph::Graph> graph = half_graph(bf16);
  const TensorPtr q = input(*graph, "Q", kQ, d.q), k = input(*graph, "K", kK, d.k), v = input(*graph, "V", kV, d.v),
                  y = input(*graph, "Y", kY, d.y), dy = input(*graph, "dY", kDy, d.y),
                  lse = input(*graph, "LogSumExp", kLse, d.lse);
  lse->set_data_type(fe::DataType_t::FLOAT);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_grad")
                     .set_attn_scale(g.scale)
                     .set_deterministic_algorithm(true);
  if (g.causal) options.set_causal_mask(true);
  const auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, y, dy, lse, options);
  mark_output(dq, kDq, d.q);
  mark_output(dk, kDk, d.k);
  mark_output(dv, kDv, d.v);
  int64_t workspace = 0;
  if (!build(*graph, ctx, &workspace)) return nullptr;

  ScratchLayout layout;
  const size_t half = sizeof(uint16_t);
  struct Regions {
    size_t q, k, v, y, dy, dq, dk, dv, ws;
  };
  const Regions r{layout.reserve(half * count(d.q)),  layout.reserve(half * count(d.k)),
                  layout.reserve(half * count(d.v)),  layout.reserve(half * count(d.y)),
                  layout.reserve(half * count(d.y)),  layout.reserve(half * count(d.q)),
                  layout.reserve(half * count(d.k)),  layout.reserve(half * count(d.v)),
                  layout.reserve(static_cast<size_t>(workspace))};
  const cudaStream_t stream = ctx.stream;
  const cudnnHandle_t handle = ctx.cudnn;
  // FusedAttentionGrad(dY, Q, K, V, Y, LogSumExp) -> (dQ?, dK?, dV?): cuDNN writes all three.
  return fn_kernel(
      [graph = GraphPtr(graph), d, r, bf16, stream, handle](Args in, Args out, void* scratch) {
        launch_to_half(in[0].as<const float>(), at(scratch, r.dy), count(d.y), bf16, stream);
        launch_to_half(in[1].as<const float>(), at(scratch, r.q), count(d.q), bf16, stream);
        launch_to_half(in[2].as<const float>(), at(scratch, r.k), count(d.k), bf16, stream);
        launch_to_half(in[3].as<const float>(), at(scratch, r.v), count(d.v), bf16, stream);
        launch_to_half(in[4].as<const float>(), at(scratch, r.y), count(d.y), bf16, stream);
        std::unordered_map<int64_t, void*> pack{
            {kQ, at(scratch, r.q)},   {kK, at(scratch, r.k)},   {kV, at(scratch, r.v)},
            {kY, at(scratch, r.y)},   {kDy, at(scratch, r.dy)}, {kLse, in[5].data},
            {kDq, at(scratch, r.dq)}, {kDk, at(scratch, r.dk)}, {kDv, at(scratch, r.dv)}};
        execute(*graph, handle, pack, at(scratch, r.ws));
        if (out[0].present()) launch_from_half(at(scratch, r.dq), out[0].as<float>(), count(d.q), bf16, stream);
        if (out[1].present()) launch_from_half(at(scratch, r.dk), out[1].as<float>(), count(d.k), bf16, stream);
        if (out[2].present()) launch_from_half(at(scratch, r.dv), out[2].as<float>(), count(d.v), bf16, stream);
      },
      layout.bytes());
}

}  // namespace pt::cuda
