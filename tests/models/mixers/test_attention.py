"""Attention: the SDPA path against the plain-torch math path (outputs and gradients), RoPE, KV cache."""

from __future__ import annotations

import math

import pytest
import torch

from klalm.models.mixers.attention import ATTENTION_BACKENDS, Attention, attend_math, attend_sdpa, rope_table, rotary


def _pair(d_model: int = 32, n_heads: int = 4) -> tuple[Attention, Attention]:
    torch.manual_seed(0)
    sdpa = Attention(d_model, n_heads=n_heads, backend="sdpa").double()
    math = Attention(d_model, n_heads=n_heads, backend="math").double()
    math.load_state_dict(sdpa.state_dict())
    return sdpa, math


@pytest.mark.parametrize("length", [1, 2, 13])
def test_sdpa_matches_math_outputs_and_grads(length):
    sdpa, math = _pair()
    x = torch.randn(2, length, 32, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y_s, _ = sdpa(x)
    y_m, _ = math(x2)
    torch.testing.assert_close(y_s, y_m, rtol=1e-10, atol=1e-12)
    grad_out = torch.randn_like(y_s)
    y_s.backward(grad_out)
    y_m.backward(grad_out)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-12)
    for (name, p_s), p_m in zip(sdpa.named_parameters(), math.parameters()):
        torch.testing.assert_close(p_s.grad, p_m.grad, rtol=1e-10, atol=1e-12, msg=f"grad of {name}")


def test_query_block_continuing_a_cache():
    """With Lq < Lk the mask is aligned bottom-right (queries are the last Lq positions), in both paths."""
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    k, v = torch.randn(1, 2, 7, 8, dtype=torch.float64), torch.randn(1, 2, 7, 8, dtype=torch.float64)
    expected = attend_math(torch.cat([torch.zeros(1, 2, 4, 8, dtype=torch.float64), q], dim=2), k, v)[:, :, 4:]
    torch.testing.assert_close(attend_math(q, k, v), expected)
    torch.testing.assert_close(attend_sdpa(q, k, v), expected)


def test_single_decode_query_sees_every_key():
    q = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    k, v = torch.randn(1, 2, 6, 8, dtype=torch.float64), torch.randn(1, 2, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(attend_sdpa(q, k, v), attend_math(q, k, v))


def test_rotary_scores_depend_only_on_relative_position():
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)
    score = lambda i, j: (rotary(q, i, 10_000.0) * rotary(k, j, 10_000.0)).sum()
    torch.testing.assert_close(score(3, 1), score(12, 10))
    assert not torch.allclose(score(3, 1), score(3, 2))


def test_rotary_reads_its_table_as_the_angles_give_it_across_a_regrowth():
    """The cached cos/sin table (grown to the next power of two as positions pass its end) against the rotation
    written out: pairs (x_i, x_{i+E/2}) turned by pos·θ^(−2i/E)."""
    theta, x = 500.0, torch.randn(2, 3, 7, 8, dtype=torch.float64)  # a θ no other test uses: a fresh table
    for offset in (0, 5, 40):  # 0..6 builds P = 8; 5..11 grows it to 16; 40..46 to 64
        angles = torch.arange(offset, offset + 7, dtype=torch.float64)[:, None] * theta ** (-torch.arange(4) / 4)
        cos, sin = angles.cos(), angles.sin()
        want = torch.cat((x[..., :4] * cos - x[..., 4:] * sin, x[..., 4:] * cos + x[..., :4] * sin), dim=-1)
        torch.testing.assert_close(rotary(x, offset, theta), want, rtol=1e-6, atol=1e-6)  # a float32 table


def test_rotary_preserves_norm_and_is_identity_at_zero():
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(rotary(x, 0, 10_000.0)[:, :, 0], x[:, :, 0])
    torch.testing.assert_close(rotary(x, 9, 10_000.0).norm(dim=-1), x.norm(dim=-1))


def test_kv_cache_grows_and_positions_continue():
    sdpa, _ = _pair()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    y, state = sdpa(x)
    assert state.k.shape == (2, 4, 9, 8) and state.v.shape == (2, 4, 9, 8)
    y1, st = sdpa(x[:, :5])
    y2, st = sdpa(x[:, 5:], st)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"n_heads": 5}, "not divisible by n_heads"), ({"n_heads": 32}, "must be even"), ({"backend": "flash"}, "math")],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Attention(32, **kwargs)


def test_backend_table():
    assert set(ATTENTION_BACKENDS) == {"sdpa", "math"}


def test_rope_table_op_passes_opcheck():
    """The table is a torch custom op (one opaque call in a compiled graph): its fake shape and registration."""
    for start, end in ((0, 8), (5, 6), (3, 11)):
        torch.library.opcheck(rope_table, (10_000.0, 4, start, end, torch.device("cpu")))
    table = rope_table(10_000.0, 4, 0, 8, torch.device("cpu"))
    assert table.shape == (2, 8, 4) and table.dtype == torch.float32
    table.zero_()  # a caller's copy: the cached table is unchanged
    assert rope_table(10_000.0, 4, 0, 8, torch.device("cpu"))[0, 0].eq(1).all()


def test_rope_table_rows_are_the_rows_of_the_whole_table():
    """Rows start..end (one row when decoding a token) are those rows of the table from position 0, across the
    power-of-two sizes the cache keeps (end 3 in the table of 4, 6 in that of 8, 11 in that of 16, 17 in that of
    32)."""
    whole = rope_table(10_000.0, 4, 0, 32, torch.device("cpu"))
    for start, end in ((5, 6), (3, 11), (0, 3), (9, 17)):
        torch.testing.assert_close(rope_table(10_000.0, 4, start, end, torch.device("cpu")), whole[:, start:end])
    angle = 7 * 10_000.0 ** (-1 / 4)  # position 7, frequency index 1 of 4
    torch.testing.assert_close(whole[:, 7, 1], torch.tensor([math.cos(angle), math.sin(angle)]))
