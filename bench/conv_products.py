"""bf16 against fp32 convolutions on this CPU: ResNet-50's convolution shapes at micro-batch 8,
channels-last, forward and backward (input and weight gradients), best of 5 on the threads
below. The fp32 column is what precision.conv_products = fp32 runs: the bf16 operands widened,
the output rounded back (Note [Convolutions in fp32 where bf16 is slow],
recompute/src/conv_products.cpp).

    .venv/bin/python bench/conv_products.py [threads]
"""
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)


def best_ms(f):
    f()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


total = {"bf16": 0.0, "fp32": 0.0}
for cin, cout, k, hw in [(64, 64, 3, 56), (64, 256, 1, 56), (256, 64, 1, 56), (128, 128, 3, 28), (512, 128, 1, 28),
                         (256, 256, 3, 14), (1024, 256, 1, 14), (512, 512, 3, 7)]:
    x = torch.randn(8, cin, hw, hw).to(memory_format=torch.channels_last).to(torch.bfloat16)
    w = (torch.randn(cout, cin, k, k) * 0.05).to(memory_format=torch.channels_last).to(torch.bfloat16)
    g = torch.randn(8, cout, hw, hw).to(memory_format=torch.channels_last).to(torch.bfloat16)
    args = ([1, 1], [k // 2] * 2, [1, 1], False, [0, 0], 1)
    row = {}
    for name, cast in (("bf16", lambda t: t), ("fp32", lambda t: t.float())):
        fwd = best_ms(lambda: torch.ops.aten.convolution(cast(x), cast(w), None, *args).to(torch.bfloat16))
        bwd = best_ms(lambda: torch.ops.aten.convolution_backward(cast(g), cast(x), cast(w), None, *args,
                                                                  [True, True, False]))
        row[name] = (fwd, bwd)
        total[name] += fwd + bwd
    print(f"{cin}->{cout} {k}x{k} at {hw}x{hw}: bf16 forward {row['bf16'][0]:.1f} ms backward {row['bf16'][1]:.1f} ms"
          f" | fp32 products forward {row['fp32'][0]:.1f} ms backward {row['fp32'][1]:.1f} ms")
print(f"all: bf16 {total['bf16']:.1f} ms, fp32 products {total['fp32']:.1f} ms ({total['fp32'] / total['bf16']:.2f}x)")
