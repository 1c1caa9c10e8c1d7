"""Does inductor recompute RoPE's cos/sin inside its kernels? Compiles one Attention mixer (d 128, 4 heads, x [2, 256, 128])
forward and backward on the CPU and counts the generated lines that mention cos; also the graphs and breaks
(torch._dynamo.explain) on the first call and once the table is cached. Run from the tree to check."""
import os
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/rope_probe_cache")
import torch, torch._dynamo
from klalm.models.mixers import attention as A
print(A.__file__)
m = A.Attention(128, n_heads=4)
fn = lambda x: m(x)[0]
x = torch.randn(2, 256, 128, requires_grad=True)
exp1 = torch._dynamo.explain(fn)(x)
print("first call: graphs", exp1.graph_count, "breaks", exp1.graph_break_count)
exp2 = torch._dynamo.explain(fn)(x)
print("table cached: graphs", exp2.graph_count, "breaks", exp2.graph_break_count)
torch._dynamo.reset()
import torch._inductor.config as ic
from torch._inductor.utils import run_and_get_code
f = torch.compile(fn)
out, codes = run_and_get_code(lambda: f(x).sum().backward())
code = "\n".join(codes)
print("kernels computing cos/sin:", code.count("std::cos") + code.count("cos("), "| lines mentioning cos:", sum("cos" in l for l in code.splitlines()))
