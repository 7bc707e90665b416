// onnx_import/attention_fusion.h: scaled dot-product attention as exporters write it, made one
// pipetrain FusedAttention node (core/pipetrain_ops.h), whose CPU kernel never holds the S x T
// scores: the backward keeps Q, K, V, Y and each row's log-sum-exp instead of the probabilities.
// The forms recognised, on imported graphs:
//
//   S = MatMul(Q, Kt)                       Q [B, H, S, D], Kt [B, H, D, T]
//   then, in any order, links each read by the next alone:
//       Mul(S, c) | Mul(c, S) | Div(S, c)   c a positive float scalar constant: the scale
//       Add(S, M) | Add(M, S)               M float, broadcastable to S, no parameter upstream
//       Where(C, S, m) | Where(C, m, S)     C bool, m a scalar constant <= -1e9 (or -inf)
//   P = Softmax(S', axis -1)
//   P' = P, or Where(IsNaN(P), 0, P)       (torch's decomposition of SDPA), then any Identity
//        or Dropout as inference runs it (dropout off), then at most one per-row op, Where(C, 0,
//        P') or Mul(P', r) with C, r [..., S, 1] (ONNX Attention's zeroed fully masked rows,
//        onnx_import/fused_ops.cc), which moves after the fused node (it commutes with @ V)
//   Y = MatMul(P', V)                       V [B, H, T, Dv]
//
// becomes Y = FusedAttention(Q, K, V, Mask) with K = Transpose(Kt) (composed with Kt's own
// Transpose where only this MatMul reads it), the masks combined into one (And, Where or Add
// nodes where there are several), and causal set where the combined mask's value is known at
// import (known_value in the .cc) and removes every key after its query (the mask then dropped
// where it is an initializer that removes nothing else). Scalar
// Muls of Q and K (the sqrt-scale form) stay as they are, with scale 1 on the fused node.
//
// Nothing is fused where another node reads the scores or the probabilities (attention dropout
// on the probabilities: the fused kernel has no dropout), where a float mask is scaled after it
// is added, or where a mask is computed from a parameter (the fused op gives a mask no
// gradient). describe_attention says, per Softmax of such a shape, why.
//
// The CUDA backend has no FusedAttention kernel: only CPU programs are fused (`train` with
// device cpu, `run` and `grad`, each once its training or inference form is made, so that dropout
// off fuses as an export without dropout does; `inspect` shows the import fused), so a CUDA
// program never meets the op.
#pragma once

#include <string>
#include <vector>

#include "core/ir.h"

namespace pt {

// Keys (T) from which an attention is fused by default. Below it the products on oneDNN, the
// Softmax and their gradients run faster than the fused kernel: charlm (T 64) trained a step in
// 0.119 s fused against 0.066 s unfused (Zen 5, 2 threads), while one layer at T 256 ran its
// forward and backward in 0.36 s fused against 0.59 s (docs/measured.md), and the fused kernel
// never holds the S x T scores. The commands' --fuse-attention-from sets it (1: every one).
constexpr int64_t kFusedAttentionMinKeys = 256;

// Rewrites each attention of g over at least min_keys keys as above, in place; returns how many.
// (import_model runs it when ImportOptions::fuse_attention is set.) masked false leaves the
// attentions whose fused node would read a mask as they are: CUDA in bf16, whose cuDNN kernel
// takes no mask (exec/cuda/cudnn_attention.cc), fuses only the others.
int fuse_attention(Graph& g, int64_t min_keys = kFusedAttentionMinKeys, bool masked = true);

// One line per attention of g for `pipetrain inspect`: "fused: <node> (causal, mask bool[...])"
// for each FusedAttention node, "unfused: <Softmax node>: <why>" for each Softmax between two
// MatMuls that fuse_attention left (over fewer than min_keys keys: that).
std::vector<std::string> describe_attention(const Graph& g, int64_t min_keys = kFusedAttentionMinKeys);

}  // namespace pt
