"""Parameter groups (decay / no decay / dynamics) and the lr schedules."""

import math

import pytest
import torch

from klalm.models import build_model
from klalm.train.optim import (
    classify_parameters,
    cosine_multiplier,
    cosine_multiplier_tensor,
    param_groups,
    warmup_cosine,
    warmup_stable_decay,
    wsd_multiplier,
)


@pytest.fixture(scope="module")
def tiny_kla():
    torch.manual_seed(0)
    return build_model("kla", preset="tiny", vocab_size=128)


def test_groups_follow_marks_and_rules(tiny_kla):
    classes = classify_parameters(tiny_kla)
    params = dict(tiny_kla.named_parameters())
    assert set(classes) == set(params)
    for name, group in classes.items():
        param = params[name]
        if getattr(param, "_no_weight_decay", False):
            assert group == "dynamics", name
        elif param.ndim < 2 or name.endswith("embed.weight"):
            assert group == "no_decay", name
        else:
            assert group == "decay", name
    assert {"dynamics", "no_decay", "decay"} == set(classes.values())
    assert classes["model.embed.weight"] == "no_decay"
    assert classes["model.layers.0.mixer.alpha_log"] == "dynamics"
    assert classes["model.layers.0.mlp.w_up.weight"] == "decay"


def test_param_groups_settings_and_wrapper_names(tiny_kla):
    classes = classify_parameters(tiny_kla)
    # names as torch.compile / activation checkpointing would show them still resolve
    named = [(f"_orig_mod.{n}", p) for n, p in tiny_kla.named_parameters()]
    groups = {g["name"]: g for g in param_groups(named, classes, lr=1e-3, weight_decay=0.1, dynamics_lr_scale=0.5)}
    assert groups["decay"]["weight_decay"] == 0.1 and groups["decay"]["lr"] == 1e-3
    assert groups["no_decay"]["weight_decay"] == 0.0
    assert groups["dynamics"]["weight_decay"] == 0.0 and groups["dynamics"]["lr"] == 5e-4
    total = sum(p.numel() for g in groups.values() for p in g["params"])
    assert total == sum(p.numel() for p in tiny_kla.parameters())  # each parameter exactly once (tied head once)


def test_unclassified_parameter_raises():
    with pytest.raises(KeyError, match="'w'"):
        param_groups([("w", torch.nn.Parameter(torch.ones(2, 2)))], {}, lr=1.0, weight_decay=0.0)


def test_cosine_schedule_shape():
    kw = {"warmup_steps": 10, "total_steps": 110, "min_lr_ratio": 0.1}
    assert cosine_multiplier(0, **kw) == pytest.approx(0.1)
    assert cosine_multiplier(9, **kw) == pytest.approx(1.0)
    assert cosine_multiplier(10, **kw) == pytest.approx(1.0)
    assert cosine_multiplier(60, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 50 / 99)))
    assert cosine_multiplier(109, **kw) == pytest.approx(0.1)
    values = [cosine_multiplier(s, **kw) for s in range(10, 110)]
    assert all(a >= b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize(
    "kw",
    [
        {"warmup_steps": 10, "total_steps": 110, "min_lr_ratio": 0.1},
        {"warmup_steps": 0, "total_steps": 37, "min_lr_ratio": 0.0},
        {"warmup_steps": 1000, "total_steps": 10_000, "min_lr_ratio": 0.01},  # the A5 recipe, shortened 10x
        {"warmup_steps": 3, "total_steps": 4, "min_lr_ratio": 1.0},
    ],
    ids=["w10-t110", "w0-t37", "w1000-t10000", "w3-t4"],
)
def test_tensor_cosine_schedule_equals_the_float_one_step_by_step(kw):
    """The device-tensor schedule of the captured synthetic trainer against `cosine_multiplier`, every step."""
    steps = torch.arange(kw["total_steps"])
    tensor = cosine_multiplier_tensor(steps, **kw)
    expected = torch.tensor([cosine_multiplier(int(s), **kw) for s in steps], dtype=torch.float64)
    assert tensor.dtype == torch.float64
    torch.testing.assert_close(tensor, expected, rtol=1e-13, atol=1e-15)
    one = cosine_multiplier_tensor(torch.tensor(kw["total_steps"] - 1), **kw)  # a 0-d counter, as the trainer's
    assert one.shape == () and one.item() == pytest.approx(expected[-1].item(), rel=1e-13)


@pytest.mark.parametrize("shape", ["linear", "1-sqrt", "cosine"])
def test_wsd_schedule_shape(shape):
    kw = {"warmup_steps": 5, "total_steps": 100, "decay_steps": 20, "min_lr_ratio": 0.0, "shape": shape}
    assert wsd_multiplier(4, **kw) == pytest.approx(1.0)
    assert all(wsd_multiplier(s, **kw) == 1.0 for s in range(5, 80))
    assert wsd_multiplier(99, **kw) == pytest.approx(0.0, abs=1e-12)
    decay = [wsd_multiplier(s, **kw) for s in range(80, 100)]
    assert all(a > b for a, b in zip(decay, decay[1:]))


def test_scheduler_factories_drive_the_optimizer_lr():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=2.0)
    sched = warmup_cosine(opt, 10, warmup=2, min_lr_ratio=0.5)
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0)  # step 0 of a 2-step warmup
    for _ in range(9):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0)  # 0.5 · 2.0 at the last step


@pytest.mark.parametrize(
    ("factory", "kwargs", "key"),
    [
        (warmup_cosine, {"warmup": 10}, "scheduler.warmup"),
        (warmup_cosine, {"min_lr_ratio": 2.0}, "min_lr_ratio"),
        (warmup_stable_decay, {"shape": "cubic"}, "shape"),
        (warmup_stable_decay, {"decay_frac": 0.0}, "decay_frac"),
    ],
)
def test_bad_schedules_name_the_key(factory, kwargs, key):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises((ValueError, KeyError), match=key):
        factory(opt, 10, **kwargs)
