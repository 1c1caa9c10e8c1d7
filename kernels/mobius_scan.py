"""`kla_scan_triton`: the fused Triton KLA scan, differentiable in every tensor (backend "triton").

Oracle: `klalm.ops.reference.kla_scan_reference` (same arguments, same results up to float32 rounding).
The forward kernels are in mobius_scan_fwd.py and the backward kernels in mobius_scan_bwd.py; this file
checks inputs and registers them as two torch custom ops, `klalm::kla_scan_fwd` and `klalm::kla_scan_bwd`,
with fake (shape-only) implementations and the backward as the forward's autograd formula. `torch.compile`
therefore traces a model through the scan as one opaque node, with no graph break, and AOTAutograd puts
`kla_scan_bwd` in the backward graph.

On CPU tensors the kernels run only under Triton's interpreter (`TRITON_INTERPRET=1` set before
`triton` is imported), which is how the tests run them without a GPU.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from klalm.kernels.common import ScanConfig, check_config, check_kernel_device, check_offsets, state_pad
from klalm.kernels.mobius_scan_bwd import mobius_scan_bwd
from klalm.kernels.mobius_scan_fwd import mobius_scan_fwd
from klalm.ops.checks import check_inputs
from klalm.ops.common import KLAState

MAX_SCAN_STATE = 64  # key dimensions one scan holds in registers ([S_PAD, block_m] per state row)
MAX_STATE_SIZE = 256  # key dimensions of the layer: wider than MAX_SCAN_STATE runs as scans over slices (below)
DEFAULT_CONFIG = ScanConfig()  # the KLA scan's launch parameters up to S = 16: ScanConfig's defaults (kernels/NOTES.md)
# Wider keys. A program holds S_PAD x block_m numbers of each state row, so the S-16 defaults spill registers at
# S_PAD 32 and 64; smaller channel blocks were the first fix, timed on an H200 at MQAR's long cell (B256 L2048 M256,
# bf16 v, k, q), forward+backward of y in ms: S 32 29.07 -> 20.33 with bwd_block_m 8 (results/gpu_2026-12-02f,
# dstate_*.md), S 64 238.77 -> 52.58 with block_m 8, bwd_block_m 4 (no other whole-state config did better,
# results/gpu_2026-12-03b). Scans over slices of 16 key dimensions on the S-16 defaults do better at both: S 64
# 53.08 -> 40.83, S 32 20.93 -> 20.19 (the merged sliced path, `bench_scan.py --states`, results/gpu_2026-12-03d).
WIDE_STATE_CONFIG = DEFAULT_CONFIG._replace(state_slice=16)


def default_config(state_size: int) -> ScanConfig:
    """The launch parameters `kla_scan_triton` uses when none are given, for keys of `state_size` dimensions."""
    return DEFAULT_CONFIG if state_pad(state_size) <= 16 else WIDE_STATE_CONFIG


@torch.library.custom_op("klalm::kla_scan_fwd", mutates_args=())
def kla_scan_fwd_op(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    lam0: Tensor | None,
    eta0: Tensor | None,
    decode_from_prior: bool,
    config: list[int],
    save_ckpt: bool,
    precision_floor: float | None,
    with_variance: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y, y_var, λ, η, ckpt_P, ckpt_mu) of `mobius_scan_fwd` on contiguous inputs; `config` is a ScanConfig as a
    list; without `save_ckpt` the two chunk-state tensors are empty, without `with_variance` y_var is."""
    config = ScanConfig(*config)
    slices = state_slices(k.shape[-1], config)
    if len(slices) > 1:
        return _sliced_fwd(v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior, config, save_ckpt,
                           precision_floor, with_variance, slices)  # fmt: skip
    outs = mobius_scan_fwd(
        v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior, config, save_ckpt, precision_floor, with_variance
    )  # fmt: skip
    return *outs[:4], *(v.new_empty(0, dtype=torch.float32) if c is None else c for c in outs[4:])


@kla_scan_fwd_op.register_fake
def _(v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior, config, save_ckpt, precision_floor, with_variance):
    batch, length, channels = v.shape
    state_size, n_chunks = k.shape[-1], triton.cdiv(length, ScanConfig(*config).chunk)
    ckpt_shape = (batch, n_chunks, state_size, channels) if save_ckpt else (0,)
    state = v.new_empty(batch, channels, state_size, dtype=torch.float32)
    ckpt = v.new_empty(ckpt_shape, dtype=torch.float32)
    y_var = torch.empty_like(v) if with_variance else v.new_empty(0)
    return torch.empty_like(v), y_var, state, torch.empty_like(state), ckpt, torch.empty_like(ckpt)


@torch.library.custom_op("klalm::kla_scan_bwd", mutates_args=())
def kla_scan_bwd_op(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    lam0: Tensor | None,
    eta0: Tensor | None,
    lam: Tensor,
    eta: Tensor,
    ckpt_P: Tensor,
    ckpt_mu: Tensor,
    gy: Tensor,
    gyv: Tensor | None,
    glam: Tensor | None,
    geta: Tensor | None,
    decode_from_prior: bool,
    config: list[int],
    precision_floor: float | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (dv, dlambda_v, dk, dq, da, dp, dlam0, deta0) of `mobius_scan_bwd`; dlam0, deta0 are empty
    without an initial state; a None gyv, glam, geta means that output was unused (its terms are skipped)."""
    saved = (v, lambda_v, k, q, a, p, lam0, eta0, lam, eta, ckpt_P, ckpt_mu)
    config = ScanConfig(*config)
    slices = state_slices(k.shape[-1], config)
    if len(slices) > 1:
        grads = _sliced_bwd(saved, gy, gyv, glam, geta, decode_from_prior, config, precision_floor, slices)
    else:
        grads = mobius_scan_bwd(saved, gy, gyv, glam, geta, decode_from_prior, config, precision_floor)
    return *grads[:6], *(v.new_empty(0, dtype=torch.float32) if g is None else g for g in grads[6:])


@kla_scan_bwd_op.register_fake
def _(v, lambda_v, k, q, a, p, lam0, eta0, *rest):
    initial = [torch.empty_like(x) if x is not None else v.new_empty(0, dtype=torch.float32) for x in (lam0, eta0)]
    return (*(torch.empty_like(x) for x in (v, lambda_v, k, q, a, p)), *initial)


def state_slices(state_size: int, config: ScanConfig) -> list[slice]:
    """The key dimensions of each scan: all S at once, or consecutive slices of `config.state_slice`."""
    width = config.state_slice or state_size
    return [slice(i, min(i + width, state_size)) for i in range(0, state_size, width)]


# The sliced scan. Every (m, s) of the filter is its own recurrence (docs/kla.md): only y = Σ_s q_s·mean_{m,s} and
# y_var (and so the gradients of v and Λ) sum over s; the state, its checkpoints and the gradients of k, q, a, p and
# of the initial state are per s. So a scan of S key dimensions is the sum of scans over slices of k, q, a, p (and
# λ0, η0), each on the kernels of the slice's width. Their y, y_var, dv and dΛ are written in float32 and summed, so
# 16-bit outputs round once, as the whole scan's do. The chunk states of slice j are one contiguous [B, NC, W_j, M]
# block of the [B, NC, S, M] buffers, the blocks in slice order (the buffers' shape is the whole scan's, so the ops'
# fake implementations hold for both).


def _columns(x: Tensor | None, s: slice) -> Tensor | None:
    """x[..., s] as a contiguous tensor (the kernels read state-shaped inputs densely)."""
    return None if x is None else x[..., s].contiguous()


def _ckpt_blocks(buffers: tuple[Tensor, Tensor], slices: list[slice]) -> list[tuple[Tensor, Tensor]]:
    """Each slice's [B, NC, W, M] views of the chunk-state buffers [B, NC, S, M] (module comment above)."""
    batch, n_chunks, _, channels = buffers[0].shape
    per_dim = batch * n_chunks * channels
    return [tuple(b.view(-1)[s.start * per_dim : s.stop * per_dim].view(batch, n_chunks, s.stop - s.start, channels)
                  for b in buffers) for s in slices]  # fmt: skip


def _sliced_fwd(v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior, config, save_ckpt, precision_floor,
                with_variance, slices):  # fmt: skip
    """`kla_scan_fwd_op`'s outputs, as the sum of scans over `slices` of the state."""
    batch, length, channels = v.shape
    f32 = torch.float32
    ckpt = None
    if save_ckpt:
        ckpt = tuple(v.new_empty(batch, triton.cdiv(length, config.chunk), k.shape[-1], channels, dtype=f32)
                     for _ in range(2))  # fmt: skip
    blocks = _ckpt_blocks(ckpt, slices) if save_ckpt else [None] * len(slices)
    y = y_var = None
    lams, etas = [], []
    for s, block in zip(slices, blocks, strict=True):
        part = mobius_scan_fwd(
            v, lambda_v, _columns(k, s), _columns(q, s), _columns(a, s), _columns(p, s), _columns(lam0, s),
            _columns(eta0, s), decode_from_prior, config, save_ckpt, precision_floor, with_variance, f32, block,
        )  # fmt: skip
        y = part[0] if y is None else y.add_(part[0])
        y_var = part[1] if y_var is None else y_var.add_(part[1])
        lams.append(part[2])
        etas.append(part[3])
    ckpt = ckpt or tuple(v.new_empty(0, dtype=f32) for _ in range(2))  # two tensors: a custom op's outputs never alias
    y_var = y_var.to(v.dtype) if with_variance else v.new_empty(0)
    return y.to(v.dtype), y_var, torch.cat(lams, -1), torch.cat(etas, -1), *ckpt


def _sliced_bwd(saved, gy, gyv, glam, geta, decode_from_prior, config, precision_floor, slices):
    """`mobius_scan_bwd`'s gradients of the sliced scan: per slice, summed over slices for v and Λ (float32), put
    side by side over s for the rest."""
    v, lambda_v, k, q, a, p, lam0, eta0, lam, eta, ckpt_P, ckpt_mu = saved
    dv = dlv = None
    per_s = []  # per slice: dk, dq, da, dp, dlam0, deta0
    for s, (block_P, block_mu) in zip(slices, _ckpt_blocks((ckpt_P, ckpt_mu), slices), strict=True):
        part_saved = (v, lambda_v, *(_columns(x, s) for x in (k, q, a, p, lam0, eta0, lam, eta)), block_P, block_mu)
        grads = mobius_scan_bwd(part_saved, gy, gyv, _columns(glam, s), _columns(geta, s), decode_from_prior, config,
                                precision_floor, grad_dtype=torch.float32)  # fmt: skip
        dv = grads[0] if dv is None else dv.add_(grads[0])
        dlv = grads[1] if dlv is None else dlv.add_(grads[1])
        per_s.append(grads[2:])
    rest = [None if parts[0] is None else torch.cat(parts, -1) for parts in zip(*per_s, strict=True)]
    return dv.to(v.dtype), dlv.to(lambda_v.dtype), *rest


def _setup_context(ctx, inputs, output):
    v, lambda_v, k, q, a, p, lam0, eta0, decode_from_prior, config, _, precision_floor, _ = inputs
    _, _, lam, eta, ckpt_P, ckpt_mu = output
    ctx.save_for_backward(v, lambda_v, k, q, a, p, lam0, eta0, lam, eta, ckpt_P, ckpt_mu)
    ctx.decode_from_prior, ctx.config, ctx.precision_floor = decode_from_prior, config, precision_floor
    ctx.mark_non_differentiable(ckpt_P, ckpt_mu)
    ctx.set_materialize_grads(False)  # unused outputs (y_var in training, the final state) arrive as None


def _backward(ctx, gy, gyv, glam, geta, _gckpt_P, _gckpt_mu):
    saved = ctx.saved_tensors
    v, lam0 = saved[0], saved[6]
    gy = torch.zeros_like(v) if gy is None else gy.contiguous()
    # None: y_var unused (or not computed, without with_variance: then it is empty), the kernels skip its terms
    gyv = None if gyv is None or gyv.numel() == 0 else gyv.contiguous()
    grads = kla_scan_bwd_op(*saved, gy, gyv, glam, geta, ctx.decode_from_prior, ctx.config, ctx.precision_floor)
    initial = (None, None) if lam0 is None else grads[6:]
    return (*grads[:6], *initial, None, None, None, None, None)


kla_scan_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def kla_scan_triton(
    v: Tensor,
    lambda_v: Tensor,
    k: Tensor,
    q: Tensor,
    a: Tensor,
    p: Tensor,
    initial_state: KLAState | None = None,
    decode_from_prior: bool = False,
    config: ScanConfig | None = None,
    *,
    precision_floor: float | None = None,
    variance: bool = True,
) -> tuple[Tensor, Tensor | None, KLAState]:
    """Run the KLA filter over a sequence with the fused Triton kernels (differentiable in every tensor).

    Args:
        v: values, [B, L, M]; float16/bfloat16/float32, computed in float32 (16-bit rows are read in pairs).
        lambda_v: value precisions Λ, [B, L, M], > 0; or, with `precision_floor`, log σ² (any finite value).
        k: keys (observation map), [B, L, S], S ≤ 256 (each scan's slice of it ≤ 64, padded to a power of two).
        q: queries (readout), [B, L, S].
        a: discrete decay, [M, S], in (0, 1].
        p: discrete process noise, [M, S], ≥ 0.
        initial_state: KLAState(lam [B, M, S] > 0, eta [B, M, S]) or None for λ0 = 1, η0 = 0.
        decode_from_prior: read out the one-step-ahead prediction (a·μ, a²·σ² + p) instead of the posterior.
        config: launch parameters (`default_config(S)` by default; its `segment` picks the time-parallel split,
            its `state_slice` scans the state as slices of that many key dimensions).
        precision_floor: when given, lambda_v holds log σ² and the kernels form Λ = 1/(softplus(log σ²) +
            precision_floor) as they load it (no float32 [B, L, M] Λ in memory); its gradient is then d/d log σ².
        variance: False skips y_var (its products, reduction and store in the forward kernel) and returns None
            in its place.
    Returns:
        y, y_var [B, L, M] in v's dtype and the final KLAState (float32 [B, M, S] each), as the reference.
    Shapes and dtypes are always checked; values (Λ > 0 etc.) on CPU tensors or when $KLALM_CHECK_INPUTS=1
    (`klalm.ops.checks`), since on a GPU they cost a device synchronisation.
    """
    lambda_name = "lambda_v" if precision_floor is None else "logvar"
    check_inputs(v, lambda_v, k, q, a, p, initial_state, lambda_name=lambda_name)
    tensors = {"v": v, lambda_name: lambda_v, "k": k, "q": q, "a": a, "p": p}
    if initial_state is not None:
        tensors |= {"initial_state.lam": initial_state.lam, "initial_state.eta": initial_state.eta}
    check_kernel_device(tensors)
    state_size = k.shape[-1]
    if not 1 <= state_size <= MAX_STATE_SIZE:
        raise ValueError(f"state size S={state_size} must be in [1, {MAX_STATE_SIZE}] for the Triton kernels")
    check_offsets(v.shape[1], v.shape[2], state_size)
    config = config or default_config(state_size)
    check_config(config)
    if min(config.state_slice or state_size, state_size) > MAX_SCAN_STATE:
        raise ValueError(f"ScanConfig.state_slice={config.state_slice}: one scan holds at most {MAX_SCAN_STATE} key "
                         f"dimensions, so S={state_size} needs slices of at most that many")  # fmt: skip
    lam0, eta0 = (None, None) if initial_state is None else (initial_state.lam, initial_state.eta)
    if v.shape[1] == 0:
        y, y_var, state = _empty_scan(v, state_size, lam0, eta0)
        return y, y_var if variance else None, state
    args = [x.contiguous() if x is not None else None for x in (v, lambda_v, k, q, a, p, lam0, eta0)]
    save_ckpt = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args)
    options = (decode_from_prior, list(config), save_ckpt, precision_floor, variance)
    y, y_var, lam, eta, _, _ = kla_scan_fwd_op(*args, *options)
    return y, y_var if variance else None, KLAState(lam, eta)


def _empty_scan(v: Tensor, state_size: int, lam0: Tensor | None, eta0: Tensor | None):
    """L = 0: empty outputs and the initial state unchanged (float32), as the reference returns."""
    batch, _, channels = v.shape
    if lam0 is None:
        lam0 = torch.ones(batch, channels, state_size, device=v.device)
        eta0 = torch.zeros_like(lam0)
    return v.clone(), v.clone(), KLAState(lam0.float(), eta0.float())
