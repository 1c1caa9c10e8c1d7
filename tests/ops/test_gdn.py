"""The gated delta rule's chunked torch path against the recurrent reference and fla's naive recurrence."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
import torch.nn.functional as F

from klalm.ops import backends
from klalm.ops.backends import resolve_backend
from klalm.ops.common import compute_dtype
from klalm.ops.gdn import gated_delta_rule, gated_delta_rule_reference

gdn_ops = importlib.import_module("klalm.ops.gdn")


def make_inputs(length, batch=2, heads=2, dk=4, dv=6, dtype=torch.float64, seed=0, with_h0=True):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    inputs = {
        "q": F.normalize(rand(batch, length, heads, dk), dim=-1),
        "k": F.normalize(rand(batch, length, heads, dk), dim=-1),
        "v": rand(batch, length, heads, dv),
        "g": -torch.rand(batch, length, heads, generator=gen, dtype=dtype) * 1.5,
        "beta": torch.rand(batch, length, heads, generator=gen, dtype=dtype),
        "initial_state": rand(batch, heads, dk, dv) if with_h0 else None,
    }
    return {k: None if v is None else v.requires_grad_() for k, v in inputs.items()}


def outputs_and_grads(fn, inputs, seed=1):
    o, h = fn(*inputs.values())
    gen = torch.Generator().manual_seed(seed)
    # drawn in float64 on the CPU, then cast and moved: the same cotangents for every dtype and device
    wo, wh = (torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x) for x in (o, h))
    leaves = {k: v for k, v in inputs.items() if v is not None}
    grads = torch.autograd.grad((o * wo).sum() + (h * wh).sum(), list(leaves.values()))
    return o, h, dict(zip(leaves, grads))


@pytest.mark.parametrize("length", [1, 2, 37, 130], ids=lambda n: f"L{n}")
@pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "fresh"])
def test_torch_matches_reference(length, chunk_size, with_h0):
    inputs = make_inputs(length, with_h0=with_h0)
    ref = lambda *a: gated_delta_rule(*a, backend="reference")  # noqa: E731
    fast = lambda *a: gated_delta_rule(*a, backend="torch", chunk_size=chunk_size)  # noqa: E731
    o_ref, h_ref, g_ref = outputs_and_grads(ref, inputs)
    o, h, g = outputs_and_grads(fast, inputs)
    torch.testing.assert_close((o, h), (o_ref, h_ref), rtol=1e-10, atol=1e-10)
    assert g.keys() == g_ref.keys()
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-9, atol=1e-9, msg=lambda m, n=name: f"grad {n}: {m}")


def test_strong_decay_stays_finite():
    inputs = make_inputs(100, seed=2)
    inputs["g"] = (inputs["g"].detach() * 60).requires_grad_()  # per-step decay down to e^-90
    o, h, g = outputs_and_grads(lambda *a: gated_delta_rule(*a, backend="torch"), inputs)
    o_ref, h_ref, _ = outputs_and_grads(lambda *a: gated_delta_rule(*a, backend="reference"), inputs)
    assert all(torch.isfinite(t).all() for t in (o, h, *g.values()))
    torch.testing.assert_close((o, h), (o_ref, h_ref), rtol=1e-10, atol=1e-10)


def test_reference_gradcheck():
    inputs = make_inputs(4, batch=1, heads=1, dk=2, dv=3)
    fn = lambda *a: gated_delta_rule_reference(*a, scale=0.7)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(inputs.values()))


def test_torch_float32_close_to_float64():
    exact = make_inputs(70, seed=3)
    o64, h64 = gated_delta_rule(*exact.values(), backend="reference")
    o32, h32 = gated_delta_rule(*(x.detach().float() for x in exact.values()), backend="torch")
    assert o32.dtype == torch.float32 and h32.dtype == torch.float32
    torch.testing.assert_close((o32.double(), h32.double()), (o64.detach(), h64.detach()), rtol=1e-4, atol=1e-4)


def test_matches_fla_naive_recurrence():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fla warns that Triton has no GPU here
        naive = pytest.importorskip("fla.ops.gated_delta_rule.naive", reason="flash-linear-attention not importable")
    inputs = {k: v.detach().float() for k, v in make_inputs(45, seed=4).items()}
    q, k, v, g, beta, h0 = inputs.values()
    o_fla, h_fla = naive.naive_recurrent_gated_delta_rule(
        q, k, v, beta, g, scale=q.shape[-1] ** -0.5, initial_state=h0, output_final_state=True
    )
    o, h = gated_delta_rule(q, k, v, g, beta, h0, backend="torch", chunk_size=16)
    torch.testing.assert_close((o, h), (o_fla, h_fla), rtol=1e-5, atol=1e-5)


def test_auto_backend_choice(monkeypatch):
    monkeypatch.setattr(backends, "_AUTO", {})  # decide afresh
    assert resolve_backend(gdn_ops.GDN_OP, "auto", torch.device("cpu"), torch.float32) == "torch"
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(gdn_ops.GDN_OP, "usable", lambda device: (False, "RuntimeError: refused"))
    assert resolve_backend(gdn_ops.GDN_OP, "auto", cuda, torch.float32) == "torch"
    monkeypatch.setattr(gdn_ops.GDN_OP, "usable", lambda device: (True, "works"))
    backends._AUTO.clear()
    assert resolve_backend(gdn_ops.GDN_OP, "auto", cuda, torch.float32) == "fla"


def test_bad_backend_and_shapes_raise():
    inputs = [x.detach() for x in make_inputs(3).values()]
    with pytest.raises(ValueError, match="unknown gated_delta_rule backend 'cuda'.*fla"):
        gated_delta_rule(*inputs, backend="cuda")
    with pytest.raises(ValueError, match="'fla' needs CUDA"):
        gated_delta_rule(*inputs, backend="fla")
    bad = list(inputs)
    bad[3] = bad[3][:, :, :1]
    with pytest.raises(ValueError, match="g must be"):
        gated_delta_rule(*bad)
    bad = list(inputs)
    bad[5] = bad[5].transpose(-1, -2)
    with pytest.raises(ValueError, match="initial_state must be"):
        gated_delta_rule(*bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("length", [128, 100])  # whole chunks, and padded
def test_chunks_are_contiguous_copies_in_the_compute_dtype(dtype, length):
    # a permuted view would be copied again by every matmul that takes it, forward and backward
    x = torch.randn(2, length, 3, 8, dtype=dtype)
    chunks = gdn_ops._to_chunks(x, 64, compute_dtype(dtype))
    assert chunks.shape == (2, 3, 2, 64, 8) and chunks.dtype == compute_dtype(dtype) and chunks.is_contiguous()
    torch.testing.assert_close(chunks.flatten(2, 3)[:, :, :length], x.movedim(1, 2).to(chunks.dtype))


def test_fla_probe_draws_its_inputs_on_the_cpu_under_another_default_device():
    # Lightning calls configure_model, where a compiled model's backend choice is made, under
    # `torch.device(root_device)`, where the probe's CPU generator failed (on a GPU: "Expected a 'cuda' device type
    # for generator"); under "meta" the old draws landed on meta and failed to move to the CPU
    with torch.device("meta"):
        ok, reason = gdn_ops.fla_usable(torch.device("cpu"))
    assert not ok and "'fla' needs CUDA" in reason


@pytest.mark.gpu
def test_fla_probe_under_lightnings_default_device():
    cuda = torch.device("cuda", 0)
    with torch.device(cuda):
        ok, reason = gdn_ops.fla_usable(cuda)
    assert ok or "generator" not in reason, reason


@pytest.mark.gpu
def test_fla_matches_torch_on_cuda():
    ok, reason = gdn_ops.fla_usable(torch.device("cuda", 0))
    if not ok:
        pytest.skip(f"fla chunk_gated_delta_rule unusable on this GPU: {reason}")
    inputs = {k: v.detach().float().cuda().requires_grad_() for k, v in make_inputs(130, dk=16, dv=32).items()}
    o_ref, h_ref, g_ref = outputs_and_grads(lambda *a: gated_delta_rule(*a, backend="torch"), inputs)
    o, h, g = outputs_and_grads(lambda *a: gated_delta_rule(*a, backend="fla"), inputs)
    torch.testing.assert_close((o, h), (o_ref, h_ref), rtol=2e-3, atol=2e-3)
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=2e-3, atol=2e-3)


def test_torch_path_ignores_autocast():
    inputs = [x.detach().float() for x in make_inputs(40, seed=5).values()]
    o, h = gated_delta_rule(*inputs, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o_ac, h_ac = gated_delta_rule(*inputs, backend="torch")
    assert o_ac.dtype == torch.float32
    torch.testing.assert_close((o_ac, h_ac), (o, h), rtol=0, atol=0)


def test_auto_fallback_warns_once_with_the_reason(monkeypatch, caplog):
    monkeypatch.setattr(backends, "_AUTO", {})  # decide afresh
    monkeypatch.setattr(gdn_ops.GDN_OP, "usable", lambda device: (False, "RuntimeError: Triton 3.6 on Hopper"))
    with caplog.at_level("WARNING", logger="klalm.ops.backends"):
        for _ in range(3):
            resolve_backend(gdn_ops.GDN_OP, "auto", torch.device("cuda", 0), torch.float32)
    assert [r.getMessage() for r in caplog.records] == [
        "gated_delta_rule backend 'auto' on cuda:0 torch.float32: 'torch' (RuntimeError: Triton 3.6 on Hopper)"
    ]


def test_float32_long_sequence_as_accurate_as_the_float32_loop():
    inputs = {k: v.detach() for k, v in make_inputs(1024, batch=1, heads=2, dk=16, dv=16, seed=6).items()}
    inputs["g"] = inputs["g"] / 20  # slow decay (mean e^-0.04 per step): a long memory stresses the chunked form
    o64, _ = gated_delta_rule(*inputs.values(), backend="reference")
    o_torch, _ = gated_delta_rule(*(x.float() for x in inputs.values()), backend="torch")
    o_loop, _ = gated_delta_rule(*(x.float() for x in inputs.values()), backend="reference")
    scale = o64.abs().max()
    err_torch, err_loop = ((o - o64).abs().max() / scale for o in (o_torch.double(), o_loop.double()))
    assert err_torch < 1e-5 and err_torch < 4 * err_loop + 1e-7


def _traced_graphs(length, chunk_size=8):
    """The FX graphs dynamo traces for one call of the torch path at `length` (a recording backend, no compile)."""
    torch._dynamo.reset()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    inputs = [x.detach().float() for x in make_inputs(length, batch=1, heads=2, dk=4, dv=4, seed=7).values()]
    torch.compile(gdn_ops.gated_delta_rule_torch, backend=record, dynamic=False)(*inputs, 0.5, chunk_size)
    torch._dynamo.reset()
    return graphs


def test_compile_trace_grows_no_faster_than_sqrt_chunks():
    """The state passes between chunks in groups of about √N chunks (`_chunk_states`): about 2√N sequential steps,
    which dynamo unrolls. A loop over all chunks made the trace grow with the chunk count (22.6 s for one call at 32
    chunks, results/cpu_2026-12-04; 135, 315 and 1,035 FX nodes at 4, 16 and 64 chunks, 113, 161 and 353 with the
    loop inside the checkpoint). One graph; its nodes, the checkpointed pass's subgraph included (118, 138, 178),
    grow by at most twice as much from 16 to 64 chunks as from 4 to 16 (a loop: four times)."""
    traced = [_traced_graphs(n * 8) for n in (4, 16, 64)]  # 4, 16 and 64 chunks of 8
    assert [len(graphs) for graphs in traced] == [1, 1, 1], "the torch path should trace as one graph"
    nodes = [sum(len(m.graph.nodes) for m in graphs[0].modules() if hasattr(m, "graph")) for graphs in traced]
    assert nodes[1] > nodes[0], f"the count should see the checkpointed subgraph grow: {nodes}"
    assert nodes[2] - nodes[1] <= 2 * (nodes[1] - nodes[0]), f"traced FX nodes grow faster than √chunks: {nodes}"
    targets = {node.target for node in traced[2][0].graph.nodes}
    assert torch.linalg.solve_triangular in targets


@pytest.mark.parametrize("n_chunks", [1, 2, 3, 5, 8, 10])
def test_chunk_states_match_a_loop_over_chunks(n_chunks):
    """Every chunk count, a square or not (the last group padded with identity maps), against applying the maps
    one chunk at a time."""
    gen = torch.Generator().manual_seed(n_chunks)
    trans = torch.randn(2, 3, n_chunks, 4, 4, generator=gen, dtype=torch.float64) / 2
    shift = torch.randn(2, 3, n_chunks, 4, 5, generator=gen, dtype=torch.float64)
    h0 = h = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64)
    expected = []
    for c in range(n_chunks):
        h = trans[:, :, c] @ h + shift[:, :, c]
        expected.append(h)
    torch.testing.assert_close(gdn_ops._chunk_states(h0, trans, shift), torch.stack(expected, 2))


def test_compiled_torch_path_matches_eager():
    inputs = make_inputs(37, batch=1, heads=2, dk=4, dv=6, seed=8)
    eager = lambda *a: gdn_ops.gated_delta_rule_torch(*a, 0.5, 8)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(eager, backend="aot_eager", dynamic=False)
    o_ref, h_ref, g_ref = outputs_and_grads(eager, inputs)
    o, h, g = outputs_and_grads(compiled, inputs)
    torch._dynamo.reset()
    torch.testing.assert_close((o, h), (o_ref, h_ref), rtol=1e-12, atol=1e-12)
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-12, atol=1e-12, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_float32_at_32_chunks_outputs_and_grads_near_float64(device):
    """The torch path at a layer's head widths and 32 chunks of 32 (groups of 6, the last padded) in float32,
    outputs and every gradient against the float64 reference, relative to each tensor's largest entry. The loop over
    chunks (397be0f) and the log-depth scan (94ea0e4) that the groups replaced pass it too."""
    exact = make_inputs(1024, batch=1, heads=1, dk=48, dv=96, seed=9)
    exact["g"] = exact["g"] / 20  # slow decay: the state carries across many chunks
    o64, h64 = gated_delta_rule(*exact.values(), backend="reference")
    gen = torch.Generator().manual_seed(1)
    wo, wh = (torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in (o64, h64))  # one cotangent for both
    g64 = dict(zip(exact, torch.autograd.grad((o64 * wo).sum() + (h64 * wh).sum(), list(exact.values()))))
    inputs = {k: v.detach().float().to(device).requires_grad_() for k, v in exact.items()}
    o, h = gated_delta_rule(*inputs.values(), backend="torch", chunk_size=32)
    loss = (o * wo.float().to(device)).sum() + (h * wh.float().to(device)).sum()
    g = dict(zip(inputs, torch.autograd.grad(loss, list(inputs.values()))))
    pairs = {"o": (o, o64), "final state": (h, h64), **{f"grad {k}": (g[k], g64[k]) for k in g64}}
    for name, (got, want) in pairs.items():
        err = ((got.double().cpu() - want.detach()).abs().max() / want.abs().max()).item()
        assert err < 5e-6, f"{name}: largest error {err:.2e} of the largest entry"
