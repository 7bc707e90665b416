#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on this GPU: the figure pipetrain's fused attention is
held to (bench/gpu_bench's FusedAttention rows, the same shape and FLOP count).

    python3 bench/gpu_attention.py [--batch 2 --heads 16 --context 2048 --head-dim 64]

Causal attention, forward and forward + backward, per dtype (fp32, bf16, fp16) and per backend
torch offers for it (flash, cuDNN, memory-efficient, math), median of --runs timed with CUDA
events after warm-up. FLOPs as FlashAttention counts them: 4 * B * H * T^2 * D for the forward,
halved for the causal mask; the backward 2.5x the forward.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, runs):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    b, h, t, d = args.batch, args.heads, args.context, args.head_dim
    forward_flops = 4.0 * b * h * t * t * d / 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: causal SDPA {b}x{h}x{t}x{d}")
    print(f"{'dtype':6s} {'backend':10s} {'fwd ms':>9s} {'fwd TFLOP/s':>12s} {'fwd+bwd ms':>11s} "
          f"{'fwd+bwd TFLOP/s':>16s}")
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dtype, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(b, h, t, d, device="cuda", dtype=dtype)
        for name, backend in backends.items():
            try:
                with sdpa_kernel(backend):
                    def forward():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, k, v, is_causal=True)

                    def both():
                        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        y.backward(grad)

                    fwd = timed(forward, args.runs)
                    total = timed(both, args.runs)
            except RuntimeError as e:
                print(f"{str(dtype)[6:]:6s} {name:10s} not offered ({str(e).splitlines()[0][:60]})")
                continue
            print(f"{str(dtype)[6:]:6s} {name:10s} {fwd:9.3f} {forward_flops / fwd / 1e9:12.1f} "
                  f"{total:11.3f} {3.5 * forward_flops / total / 1e9:16.1f}")


if __name__ == "__main__":
    main()
