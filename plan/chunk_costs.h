// plan/chunk_costs.h: what each chunk's F, B and W cost, counted on the graphs that run. In: the
// chunks' F, B and W graphs (autodiff/chunk_backward.h) and their partition plan. Out: per chunk
// the work of each graph, and Costs for the simulator, the schedulers and the planner.
//
// A graph's work is the sum of its nodes' forward costs under partition/cost_model.h: the B
// graph's nodes (recomputed forward nodes included) are B's FLOPs and bytes, the W graph's are
// W's. So W is priced where W does its work whatever form the exporter wrote: a weight stored
// transposed, MatMul against Transpose(weight), Gemm with transB, a weight read by several
// nodes. The cost model's per-node B/W split (NodeCost::flops_bwd_input/weight), which can only
// see which input is an initializer, is for balancing cuts, not for this.
//
// Time unit: FLOP-equivalents, as NodeCost::cost() and partition/link.h count them: FLOPs plus
// the bytes read or written (NodeCost::byte_flops: kFlopsPerCachedByte each for a kernel whose
// working set fits one core's L2, kFlopsPerByte otherwise), plus each kernel run's fixed part
// (partition/cost_model.h launch_flops), in units of 1e9 (GFLOP-equivalents).
#pragma once

#include <string>
#include <vector>

#include "autodiff/backward.h"
#include "partition/cost_model.h"
#include "partition/partitioner.h"
#include "schedule/costs.h"

namespace pt {

// One chunk per micro-batch: each graph's total (flops_fwd = its FLOPs; bytes_read and
// bytes_written as each node moves them).
struct ChunkWork {
  NodeCost f, b, w;
};

ChunkWork chunk_work(const BackwardGraphs& chunk);

// The time a graph's work takes in FLOP-equivalents / 1e9.
double work_units(const NodeCost& total);

// FLOP-equivalents of running one F, B or W action whatever its graph: the executor taking and
// releasing the action's slots and binding its program's buffers (train/executor.cc), measured
// ~0.5 us on chunks of one small kernel (a Relu of 1,024 elements: 1 us, the kernel's 0.3 us
// and the bytes the rest).
constexpr int64_t kFlopsPerAction = 100'000;

// One action's time (ChunkCost's f, b and w): work_units plus kFlopsPerAction; 0 for a graph
// that runs no kernel (a first chunk's B).
double action_units(const NodeCost& total);

// FLOP-equivalents an action pays above its graph's when its input came from another device: F
// of a chunk whose predecessor runs elsewhere, B of one whose successor does. Its device waited
// for that message, and after the wait its first kernels find less of their weights and code in
// the core's caches (~0.5 us on Zen 5, where the devices are threads sharing 2 cores). Fitted with
// the convolutions' fixed parts (partition/cost_model.h); without it the F of the chunks after
// the first was 1.2-1.3x its share on the small exports and the last chunk's B 0.7-0.8x.
constexpr int64_t kFlopsPerReceivedAction = 110'000;

// Per chunk: f, b and w = action_units of the F, B and W graphs, F and B with
// kFlopsPerReceivedAction where the chunk before or after is on another device (`devices`: each
// chunk's; empty: all on one); F keeps kept_bytes until B, and B leaves what W still reads
// (kept_for_weight) plus what it passes W, so the simulator's peak equals the executor's measured
// peak_kept_bytes(); comm 0, where no link prices the transfers.
Costs chunk_costs(const std::vector<BackwardGraphs>& chunks, const std::vector<int>& devices = {});
// The same on the plan's devices, with comm = the plan's link_out / 1e9.
Costs chunk_costs(const std::vector<BackwardGraphs>& chunks, const PartitionPlan& plan);

// The model's F, B and W work per micro-batch, as `inspect` shows it.
struct ModelWork {
  ChunkWork work;
  std::string cut_after;      // the node the derived chunks were cut after; empty: one chunk
  std::string why_estimated;  // empty: counted on the derived graphs
};

// `inspect`'s F, B and W: the model in training form (no dropout, nothing frozen) cut after its
// first node whose output carries a gradient (the embedding, the first layer), so that the rest
// splits its backward as a pipeline's chunks after the first do: B what passes the gradient down
// to that activation, W the parameters' gradients. Both chunks' B and W graphs are derived (no
// loss: B starts from the outputs' gradients) and counted as every chunk is (chunk_work), then
// summed. (The model as one chunk would put all its backward in W: no input of a token model
// carries a gradient.) Where autodiff refuses the model, the cost model's per-node
// totals instead (f, b, w.flops_fwd; no bytes), why_estimated saying why.
ModelWork model_work(const Graph& imported);

}  // namespace pt
