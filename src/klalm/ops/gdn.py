"""The gated delta rule of Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024/25, "Gated Delta Networks").

Per head, the state h is a [K, V] matrix (the transpose of the paper's S; fla's layout). With α_t = exp(g_t):

    h_t = α_t (I − β_t k_t k_tᵀ) h_{t−1} + β_t k_t v_tᵀ          o_t = scale · h_tᵀ q_t

equivalently u_t = β_t (v_t − α_t h_{t−1}ᵀ k_t) ("delta" of the value against the state's prediction) and
h_t = α_t h_{t−1} + k_t u_tᵀ. Layout and conventions follow flash-linear-attention: q, k [B, L, H, K],
v [B, L, H, V], g (log decay, ≤ 0) and beta (in [0, 1]) [B, L, H], state [B, H, K, V], scale 1/sqrt(K).

Backends (`GDN_BACKENDS`):
- "reference": the loop above, one token at a time; the oracle.
- "torch": the chunked WY/UT form (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta
  Rule over Sequence Length"). Inside a chunk of C tokens, with γ the within-chunk cumulative log decay,
  the pseudo-values solve a unit lower-triangular system

      (I + A) U = diag(β) V − diag(β e^γ) K h_0,     A_ti = β_t e^{γ_t − γ_i} k_tᵀk_i  (i < t),

  so U = Ũ − W h_0 with Ũ = (I + A)⁻¹ βV and W = (I + A)⁻¹ (β e^γ K); then
  O = scale · [(Q e^γ) h_0 + ((Q Kᵀ) ⊙ e^{γ_t − γ_i})_{i ≤ t} U] and h_C = e^{γ_C} h_0 + (K e^{γ_C − γ})ᵀ U.
  All chunks are solved at once, and the [K, V] state passes between them by composing the chunks' affine maps
  in groups of about √N chunks (`_chunk_states`). Every exponent is a difference γ_t − γ_i with i ≤ t (masked
  before exp), so nothing overflows; autograd through it is exact.
- "fla": flash-linear-attention's `chunk_gated_delta_rule` (CUDA only).
"auto" picks fla for CUDA tensors below float64 when a one-time probe (`fla_usable`, first use per device) shows it
runs forward and backward and agrees with the torch path, and torch otherwise (the policy of all three ops, in
`klalm.ops.backends`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from klalm.ops.backends import OpBackends, resolve_backend
from klalm.ops.common import compute_dtype

FLA_CHUNK_SIZES = (16, 32, 64)  # the chunk sizes fla's chunk_gated_delta_rule accepts
PROBE_RTOL = 1e-2  # fla's float32 path uses tf32 matmuls; the probe only guards against broken kernels


def gated_delta_rule_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None,
    scale: float,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Token-by-token loop in float32 (float64 stays float64); `chunk_size` is unused (one signature).

    Returns (o [B, L, H, V] in v's dtype, final state [B, H, K, V] in the compute dtype).
    """
    out_dtype, dt = v.dtype, compute_dtype(v.dtype)
    q, k, v, g, beta = (x.to(dt) for x in (q, k, v, g, beta))
    batch, length, heads, dk = k.shape
    h = k.new_zeros(batch, heads, dk, v.shape[-1]) if initial_state is None else initial_state.to(dt)
    outs = []
    for t in range(length):
        h = h * g[:, t].exp()[:, :, None, None]  # [B, H, K, V]
        k_t = k[:, t]  # [B, H, K]
        pred = torch.einsum("bhkv,bhk->bhv", h, k_t)  # [B, H, V]
        u = beta[:, t, :, None] * (v[:, t] - pred)  # [B, H, V]
        h = h + k_t[..., None] * u[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", h, q[:, t]) * scale)
    o = torch.stack(outs, 1) if outs else v.clone()  # [B, L, H, V]
    return o.to(out_dtype), h


def _to_chunks(x: Tensor, chunk_size: int, dtype: torch.dtype) -> Tensor:
    """[B, L, H, *F] -> contiguous [B, H, N, C, *F] in `dtype`, zero-padding L up to N·C (a zero step changes nothing).

    One copy does the cast and the layout: a [B, H, ...] view of the [B, L, H, ...] input could not be batched by
    matmul without a copy at every product that takes it (forward and backward). (`.to` alone returns the permuted
    view itself when the dtype is already right, hence the `.contiguous()`, a no-op after a cast.)"""
    x = x.movedim(1, 2).to(dtype=dtype, memory_format=torch.contiguous_format).contiguous()  # [B, H, L, *F]
    pad = -x.shape[2] % chunk_size
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], 2)
    return x.unflatten(2, (-1, chunk_size))  # [B, H, N, C, *F]


def gated_delta_rule_torch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None,
    scale: float,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Chunked WY/UT form (module docstring); exact autograd. Same returns as the reference.

    Runs in float32 (float64 stays float64) with autocast off, whatever the caller's autocast setting.
    """
    with torch.autocast(q.device.type, enabled=False):
        return _chunked_gated_delta_rule(q, k, v, g, beta, initial_state, scale, chunk_size)


def _chunked_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None,
    scale: float,
    chunk_size: int,
) -> tuple[Tensor, Tensor]:
    out_dtype, dt = v.dtype, compute_dtype(v.dtype)
    batch, length, heads, dk = k.shape
    chunk_size = max(1, min(chunk_size, length))  # a short call (one-token decode) needs no padding to a full chunk
    q, k, v = (_to_chunks(x, chunk_size, dt) for x in (q, k, v))  # [B, H, N, C, K|V]
    g, beta = (_to_chunks(x, chunk_size, dt) for x in (g, beta))  # [B, H, N, C]
    gam = g.cumsum(-1)  # [B, H, N, C]
    diff = gam[..., :, None] - gam[..., None, :]  # [B, H, N, C, C]: γ_t − γ_i
    above = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    decay = diff.masked_fill(above, -math.inf).exp()  # e^{γ_t − γ_i} for i ≤ t, 0 above the diagonal
    k_beta = k * beta[..., None]
    # A's diagonal and upper triangle are never read: the unit lower-triangular solve takes 1 for the diagonal and
    # gives A's gradient below it only, so A needs no strict mask and no added identity
    a_mat = (k_beta @ k.transpose(-1, -2)) * decay
    gam_exp = gam.exp()[..., None]  # [B, H, N, C, 1]
    rhs = torch.cat([k_beta * gam_exp, v * beta[..., None]], -1)  # [B, H, N, C, K + V]
    w, u_tilde = torch.linalg.solve_triangular(a_mat, rhs, upper=False, unitriangular=True).split([dk, v.shape[-1]], -1)
    q = q * scale
    attn = (q @ k.transpose(-1, -2)) * decay  # [B, H, N, C, C]
    q_decay = q * gam_exp  # [B, H, N, C, K]
    k_decay = k * (gam[..., -1:] - gam).exp()[..., None]  # [B, H, N, C, K]
    chunk_decay = gam[..., -1].exp()[..., None, None]  # [B, H, N, 1, 1]
    h = q.new_zeros(batch, heads, dk, v.shape[-1]) if initial_state is None else initial_state.to(dt)
    o, h = _pass_state(h, u_tilde, w, q_decay, attn, k_decay, chunk_decay)  # [B, H, N, C, V], [B, H, K, V]
    o = o.flatten(2, 3)[:, :, :length]  # [B, H, L, V]
    return o.movedim(1, 2).to(out_dtype), h


def _pass_state(
    h: Tensor, u_tilde: Tensor, w: Tensor, q_decay: Tensor, attn: Tensor, k_decay: Tensor, chunk_decay: Tensor
) -> tuple[Tensor, Tensor]:
    """Carry the [K, V] state h_0 [B, H, K, V] across the N chunks; returns (o [B, H, N, C, V], final state).

    Chunk c maps its incoming state affinely, h_c = T_c h_{c−1} + b_c with T_c = e^{γ_C} I − (K e^{γ_C − γ})ᵀ W
    [K, K] and b_c = (K e^{γ_C − γ})ᵀ Ũ [K, V] (substitute U = Ũ − W h_{c−1} into h_C above). Every chunk's
    incoming state comes from `_chunk_states`, then every chunk's outputs at once.
    """
    k_t = k_decay.transpose(-1, -2)  # [B, H, N, K, C]
    eye = torch.eye(h.shape[-2], dtype=h.dtype, device=h.device)
    trans = chunk_decay * eye - k_t @ w  # [B, H, N, K, K]
    shift = k_t @ u_tilde  # [B, H, N, K, V]
    # h_1 .. h_N [B, H, N, K, V]; the groups' maps are recomputed in the backward, not saved (saved bytes 16.6
    # state-sized tensors against 19.8, the loop's 14.3: results/cpu_2026-12-04e)
    states = checkpoint(_chunk_states, h, trans, shift, use_reentrant=False)
    incoming = torch.cat([h[:, :, None], states[:, :, :-1]], 2)  # h_0 .. h_{N−1}
    u = u_tilde - w @ incoming  # [B, H, N, C, V]
    return q_decay @ incoming + attn @ u, states[:, :, -1]


def _chunk_states(h: Tensor, trans: Tensor, shift: Tensor) -> Tensor:
    """The states h_1 .. h_N [B, H, N, K, V] after the chunks' affine maps (T_c, b_c) [B, H, N, K, K | V] from h_0.

    Affine maps compose associatively, (T, b) after (T', b') = (T T', T b' + b), so the N chunks are taken in G
    groups of S ≈ √N: (1) within every group at once, S − 1 sequential steps compose each chunk's map from the
    group's start; (2) G − 1 sequential steps carry the state across the groups by their whole maps; (3) every
    chunk's state is its map from its group's start applied to the group's incoming state, all at once. About
    N·(K³ + 2K²V) multiply-adds in about 2√N sequential steps, where a loop over chunks takes N steps (dynamo
    unrolls it, so its compile grew with N: 22.6 s to trace one call at 32 chunks, results/cpu_2026-12-04) and a
    log-depth (Hillis–Steele) scan does N·log2(N) compositions (on the GPU gdn_180m ran 0.77× the loop's speed
    with it, results/gpu_2026-12-04f).
    """
    n_chunks = trans.shape[2]
    size = math.ceil(math.sqrt(n_chunks))  # chunks per group (math.isqrt does not trace on symbolic sizes)
    groups = -(-n_chunks // size)
    pad = groups * size - n_chunks  # identity maps after the last chunk
    if pad:
        eye = torch.eye(trans.shape[-1], dtype=trans.dtype, device=trans.device)
        trans = torch.cat([trans, eye.expand(*trans.shape[:2], pad, *eye.shape)], 2)
        shift = torch.cat([shift, shift.new_zeros(*shift.shape[:2], pad, *shift.shape[3:])], 2)
    # unbind, not an index per step: each indexed view's backward would write a zero tensor of the whole input
    trans = trans.unflatten(2, (groups, size)).unbind(3)  # S tensors [B, H, G, K, K]
    shift = shift.unflatten(2, (groups, size)).unbind(3)  # S tensors [B, H, G, K, V]
    maps_t, maps_b = [trans[0]], [shift[0]]  # map from the group's start to after chunk j
    for j in range(1, size):
        maps_b.append(trans[j] @ maps_b[-1] + shift[j])
        maps_t.append(trans[j] @ maps_t[-1])
    whole_t, whole_b = maps_t[-1].unbind(2), maps_b[-1].unbind(2)  # each group's whole map, G × [B, H, K, *]
    starts = [h]  # the state entering each group
    for g in range(groups - 1):
        starts.append(whole_t[g] @ starts[-1] + whole_b[g])
    # the S maps of a group stacked as rows ([S·K, K]) take the group's incoming state in one product, with no
    # broadcast of the state over S (which matmul would copy out)
    maps = torch.stack(maps_t, 3).flatten(3, 4)  # [B, H, G, S·K, K]
    states = (maps @ torch.stack(starts, 2)).unflatten(3, (size, -1)) + torch.stack(maps_b, 3)  # [B, H, G, S, K, V]
    return states.flatten(2, 3)[:, :, :n_chunks]


def gated_delta_rule_fla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None,
    scale: float,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """flash-linear-attention's chunked Triton kernels; CUDA tensors only. Same returns as the reference."""
    if q.device.type != "cuda":
        raise ValueError(f"gated_delta_rule backend 'fla' needs CUDA tensors, got q on {q.device}")
    if chunk_size not in FLA_CHUNK_SIZES:
        raise ValueError(f"gated_delta_rule backend 'fla' needs chunk_size in {FLA_CHUNK_SIZES}, got {chunk_size}")
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as err:
        raise ImportError(
            "gated_delta_rule backend 'fla' needs flash-linear-attention (`pip install flash-linear-attention`)"
        ) from err
    h0 = None if initial_state is None else initial_state.float()
    return chunk_gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True, chunk_size=chunk_size
    )


GDN_BACKENDS: dict[str, Callable] = {
    "reference": gated_delta_rule_reference,
    "torch": gated_delta_rule_torch,
    "fla": gated_delta_rule_fla,
}


def fla_usable(device: torch.device) -> tuple[bool, str]:
    """Probe whether fla's chunked kernel runs forward+backward on `device` and matches "torch".

    fla refuses the gated chunked backward on Hopper with Triton in [3.4, 3.7.1) (fla-org/flash-linear-attention
    #640), and other Triton/GPU pairs may fail to compile; one tiny call, made once per device by "auto" at first
    use, finds out without a sync in the hot path. Returns (usable, reason).
    """
    # drawn on the CPU whatever the default device: Lightning calls configure_model (where a compiled model's choice
    # is made) under `torch.device(root_device)`, where a CPU generator alone fails (results/gpu_2026-12-04g)
    gen, cpu = torch.Generator(device="cpu").manual_seed(0), torch.device("cpu")
    shapes = {"q": (1, 80, 2, 16), "k": (1, 80, 2, 16), "v": (1, 80, 2, 32)}
    q, k, v = (torch.randn(*s, generator=gen, device=cpu) for s in shapes.values())
    k = torch.nn.functional.normalize(k, dim=-1)
    g = -torch.rand(1, 80, 2, generator=gen, device=cpu)
    beta = torch.rand(1, 80, 2, generator=gen, device=cpu)
    # the first call may come from inside no_grad / inference_mode / autocast (e.g. generation): undo them here
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        inputs = [x.to(device).requires_grad_() for x in (q, k, v, g, beta)]
        try:
            results = []
            for fn in (gated_delta_rule_fla, gated_delta_rule_torch):
                o, h = fn(*inputs, None, 16**-0.5)
                grads = torch.autograd.grad((o.square().sum() + h.square().sum()), inputs)
                results.append([o.float(), h.float(), *grads])
            err = max(((a - b).abs().max() / b.abs().max().clamp(min=1)).item() for a, b in zip(*results))
        except Exception as exc:  # noqa: BLE001 - any failure means "not usable"; the reason is reported
            return False, f"{type(exc).__name__}: {exc}"
    if not err < PROBE_RTOL:
        return False, f"fla disagrees with the torch path by {err:.2e} (relative) on the probe"
    return True, "fla chunk_gated_delta_rule runs and matches the torch path"


GDN_OP = OpBackends("gated_delta_rule", GDN_BACKENDS, fast="fla", usable=fla_usable)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor | None) -> None:
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, L, H, K]; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, L, H, V] matching q {tuple(q.shape)}; got {tuple(v.shape)}")
    for name, x in (("g", g), ("beta", beta)):
        if x.shape != q.shape[:3]:
            raise ValueError(f"{name} must be [B, L, H] = {tuple(q.shape[:3])}; got {tuple(x.shape)}")
    want = (q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    if initial_state is not None and tuple(initial_state.shape) != want:
        raise ValueError(f"initial_state must be [B, H, K, V] = {want}; got {tuple(initial_state.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")


def gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    *,
    backend: str = "auto",
    scale: float | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Run the gated delta rule over a sequence (module docstring for the math and the backends).

    Args:
        q: queries, [B, L, H, K]; L2-normalised by the caller (the mixer does it).
        k: keys, [B, L, H, K]; L2-normalised (the chunked form assumes ‖k‖ ≤ 1 for conditioning).
        v: values, [B, L, H, V].
        g: log decay per token and head, [B, L, H], ≤ 0 (α = exp(g) in (0, 1]).
        beta: write strength, [B, L, H], in [0, 1].
        initial_state: state h_0, [B, H, K, V]; zeros when None.
        backend: "reference", "torch", "fla" or "auto" (`klalm.ops.backends` says what it picks).
        scale: readout scale; 1/sqrt(K) when None.
        chunk_size: tokens per chunk of the chunked paths (fla accepts 16, 32 or 64).

    Returns:
        (o [B, L, H, V] in v's dtype, final state [B, H, K, V] in float32, or float64 for float64 inputs).
        Differentiable in every tensor argument. Computation runs in float32 (float64 stays float64).
    """
    _check_inputs(q, k, v, g, beta, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    name = resolve_backend(GDN_OP, backend, q.device, q.dtype)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return GDN_BACKENDS[name](q, k, v, g, beta, initial_state, scale, chunk_size)
