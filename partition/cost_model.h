// partition/cost_model.h: per-node costs from shapes alone. In: an imported Graph (concrete
// shapes). Out: one NodeCost per node, which the partitioner sums into stage costs.
//
// Formulas (N = elements of the node's main output, shapes as in ONNX):
//   MatMul [..,M,K]x[..,K,N]   F = 2*b*M*K*N; each input's gradient costs the same again
//   Gemm                       as MatMul, plus M*N for the bias and its gradient; with transA (a
//                              weight gradient X^T dY) A's bytes are read and written once more:
//                              the product copies A into row blocks first
//   Conv                       F = 2*N_out*(C_in/group)*prod(kernel); dX and dW the same again
//   element-wise               F = N * per-element FLOPs (table in cost_model.cc); gradient
//                              per input N * per-element backward FLOPs
//   Softmax, LogSoftmax        F = 5N, dX = 4N
//   LayerNorm, BatchNorm       F = 8N, dX = 10N, dScale and dBias = 4N (BatchNormTraining too)
//   pooling, reductions        F = elements read, backward = elements written
//   data movement              0 FLOPs; bytes only (views such as Reshape move nothing)
//   Add after a MatMul or Gemm that alone reads the product (a row bias, or a weight gradient
//                              summed into its accumulator): the product applies it as it
//                              writes, so it runs no kernel and moves only its other operand;
//                              an accumulator of the product's shape moves nothing of its own
//                              (the product's sum reads each output line as its stores write it)
//   SoftmaxCrossEntropy        per logit: the row max, x - max, an exp, the sum (11); it sweeps the
//                              logits twice (max, then exp), so they are read twice. Its gradient
//                              (SoftmaxCrossEntropyGrad) the same plus the scale (12), reading the
//                              logits twice and writing dX then rescaling it in place: 3 reads,
//                              2 writes of the logits' size. (The loss autodiff/loss.h appends.)
//   FusedAttention             per visited (query, key) pair (causal: the pairs j <= i only)
//                              F = 2D + 2Dv + the softmax's 12; its one gradient kernel (all B)
//                              2 (2D + 2Dv + exp) + 2Dv + 4D + 3: q.k, the exp and dy.v are
//                              made twice (once for dQ, once for dK and dV). Kept: Q, K, V, the
//                              mask, Y and LogSumExp, never the scores
//   gradient ops               (core/pipetrain_ops.h: GeluGrad, LayerNormGrad, ConvGradWeight...)
//                              F = what the forward op's gradient costs above, so the B and W
//                              graphs autodiff derives are counted by these same rules
// A gradient that flows into a trainable parameter is W (weight-gradient) work; one that flows
// into an activation needing a gradient is B (input-gradient) work; none is counted for inputs
// that need no gradient (token ids, masks, images).
//
// Bytes are priced by where they sit: a kernel whose reads and writes together fit one core's L2
// (kCacheBytes) moves them at cache bandwidth (kFlopsPerCachedByte, NodeCost::cached_bytes), a
// bigger one streams them from memory (kFlopsPerByte).
//
// saved_bytes: bytes of this node's outputs that some consumer's backward reads (MatMul keeps its
// activation inputs, Relu and Softmax their outputs, Dropout its mask...): what F leaves for B.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ir.h"

namespace pt {

struct NodeCost {
  int64_t flops_fwd = 0;
  int64_t flops_bwd_input = 0;   // B: gradients of activation inputs
  int64_t flops_bwd_weight = 0;  // W: gradients of parameters
  int64_t bytes_read = 0;        // forward
  int64_t bytes_written = 0;     // forward
  int64_t param_bytes = 0;       // trainable parameters this node reads
  int64_t saved_bytes = 0;       // outputs kept for backward, per micro-batch
  int64_t launch = 0;            // FLOP-equivalents of running its kernel whatever its size
                                 // (launch_flops); 0 for a view (Graph::moves_no_bytes)
  int64_t cached_bytes = 0;      // of bytes_read + bytes_written, those a kernel whose whole
                                 // working set fits kCacheBytes moves within the cache

  int64_t flops_bwd() const { return flops_bwd_input + flops_bwd_weight; }
  // FLOP-equivalents of the bytes moved: kFlopsPerCachedByte per cached byte, kFlopsPerByte per
  // other byte.
  int64_t byte_flops() const;
  // One number for balancing: FLOPs of F, B and W plus byte_flops and the kernel's fixed part
  // (launch), each counted three times for F, B and W, so memory-bound ops and small kernels
  // weigh what they cost in time (the ConvNeXt fixture at 4 stages left two stages a few
  // kernels of ~1 us each when the fixed parts were not counted).
  int64_t cost() const;
};

// FLOP-equivalents of moving one byte: the balance of a CPU doing ~100 GFLOP/s out of ~25 GB/s.
constexpr int64_t kFlopsPerByte = 4;

// A kernel's bytes when all it reads and writes fits one core's L2 (AMD Zen 5: 1 MiB; Zen 4 and
// recent Intel cores 1-2 MiB): its operands were written by the kernels just before it and stay
// there, so they move at L2's bandwidth, about twice the rate per byte of a stream from memory.
// Without it a small weight gradient's few KiB (its operands, the transposed operand's blocks,
// its accumulator) were priced as DRAM traffic: Llama's W at 0.65-0.74 of the measured share.
constexpr int64_t kCacheBytes = int64_t{1} << 20;
constexpr int64_t kFlopsPerCachedByte = 2;

// FLOP-equivalents of one exp (exp_poly: a degree-6 polynomial, the range reduction and the
// exponent placed), as the element-wise table prices Exp.
constexpr int64_t kFlopsPerExp = 8;

// FLOP-equivalents of running one kernel whatever its size, at the ~200 GFLOP-equivalents/s one
// CPU core's runs fit. Fitted over the actions of a few microseconds in the samples and
// samples/exports (bench/chunk_costs.py, AMD Zen 5, AVX-512), once pipetrain's own loops stopped
// entering an OpenMP region on one thread (~0.4 us each) and small Add, Sub and Mul left oneDNN's
// binary primitive: a convolution or a convolution gradient on oneDNN ~1.5 us (binding its
// arguments, its jit's blocking of small planes), a matrix product on oneDNN ~0.3 us; ~0.7 us
// oneDNN's pooling and layer normalisation and the kernels that normalise rows (softmax, layer
// and batch normalisation's gradients, the loss: a reduction per row before the row is written,
// most of them in an OpenMP region still); ~0.05 us a loop of pipetrain's own. A small model's
// chunks are mostly these (plan/chunk_costs.h work_units counts them). oneDNN's backward
// convolutions start for less than its forward one (~0.9 us the input gradient, ~1.1 us the
// weight gradient, ~1.5 us the forward): fitted by least squares over every chunk's F, B and W of
// the samples and samples/exports (bench/fit_costs.py; docs/measured.md).
constexpr int64_t kFlopsPerConvolution = 300'000;
constexpr int64_t kFlopsPerConvolutionGradInput = 190'000;
constexpr int64_t kFlopsPerConvolutionGradWeight = 230'000;
constexpr int64_t kFlopsPerProduct = 60'000;
constexpr int64_t kFlopsPerLibraryCall = 140'000;
constexpr int64_t kFlopsPerKernel = 10'000;

// Which values carry a gradient: trainable parameters and every floating-point value computed
// from one through differentiable ops. Graph inputs (images, token ids) need none.
// `seeds` are further values that need one (a chunk's activation inputs).
std::vector<bool> needs_gradient(const Graph& g, const std::vector<ValueId>& seeds = {});

// The other direction: per value, whether a gradient flows back to it from some graph output
// along differentiable inputs and outputs. A float initializer it is false for gets no gradient
// in training: a buffer (a mask, running statistics), not a weight.
std::vector<bool> gradient_reaches(const Graph& g);

// Input i of n carries a gradient when its value needs one (never index inputs, masks, shapes,
// axes, running statistics, dropout keys); output k of n passes a gradient back (never
// statistics, masks or indices). autodiff follows the same predicates.
bool input_differentiable(const Node& n, size_t i);
bool output_differentiable(const Node& n, size_t k);

// MatMul, Gemm, Conv and Conv's gradients (ConvGradInput, ConvGradWeight): the products a
// library runs on blocked FMA kernels.
bool is_product(const Node& n);

// The fixed part of running n's kernel (the constants above by the kind of kernel), for a node
// that runs one.
int64_t launch_flops(const Node& n);

std::vector<NodeCost> estimate_costs(const Graph& g);

// Sums for a whole graph, for `pipetrain inspect`.
NodeCost total_cost(const std::vector<NodeCost>& costs);

}  // namespace pt
