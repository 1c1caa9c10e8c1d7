"""Why the training step's parameter finiteness check (`klalm.train.module._all_finite`, an inf-norm over the
parameters) ran as 105 per-tensor reductions (0.63 ms) in the fourteenth session's kla_45m profile, where torch's
`_foreach_norm` has a multi-tensor path for the inf-norm: the check on kla_45m's parameters as the step calls it
(grad mode on, tensors that require grad), under no_grad, on detached tensors, and `torch._foreach_max` of the
detached tensors, each with the kernels it launched and their GPU time (torch.profiler). Prints one Markdown table."""

import torch
from torch.profiler import ProfilerActivity, profile

from klalm.models import build_model
from klalm.train.module import _all_finite

device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU run only checks that the script works
model = build_model("kla", "45m").to(device)
params = list(model.parameters())
variants = {
    "as the step calls it": lambda: _all_finite(params),
    "under torch.no_grad()": lambda: torch.no_grad()(_all_finite)(params),
    "on p.detach()": lambda: _all_finite([p.detach() for p in params]),
    "torch._foreach_max of p.detach()": lambda: torch.stack(torch._foreach_max([p.detach() for p in params])).max(),
}
print("| variant | kernels launched | GPU ms | result |\n| --- | ---: | ---: | --- |")
for name, fn in variants.items():
    for _ in range(3):
        fn()  # warm up
    if device == "cuda":
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU]) as prof:
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == device.upper()]
    ms = sum(e.device_time for e in kernels) / 1e3
    print(f"| {name} | {len(kernels)} | {ms:.3f} | {out.item()} |", flush=True)
