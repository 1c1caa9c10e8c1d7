"""Divergence is handled the same way for every architecture: a non-finite loss, gradient or parameter is a skipped
and counted step, and `train.max_bad_steps` of them in a row end the run with an error naming the learning rate.
The KLA scan's input checks (which raise on non-finite values on the CPU) must not stand in for this."""

import logging

import pytest
import torch

from klalm.models import ARCH_LAYOUTS
from klalm.train import module as module_lib
from klalm.train.app import run
from klalm.train.distributed import HostFlag
from klalm.train.module import NonFiniteLossError

from .conftest import TINY, compose_train


def _overrides(arch: str, *extra: str) -> list[str]:
    return [o if o != "model=kla_tiny" else f"model={arch}_tiny" for o in TINY] + list(extra)


@pytest.mark.parametrize("arch", sorted(ARCH_LAYOUTS))
def test_a_diverging_run_is_skipped_counted_and_stopped_naming_the_lr(tmp_path, caplog, arch):
    overrides = _overrides(arch, "optim.lr=1e30", "train.max_bad_steps=2", "train.max_tokens=1280")
    with caplog.at_level(logging.WARNING), pytest.raises(NonFiniteLossError) as info:
        run(compose_train(overrides, tmp_path / "run"))
    message = str(info.value)
    assert "2 consecutive optimiser steps" in message and "optim.lr=1e+30" in message and "\n" not in message
    skipped = [r for r in caplog.records if "non-finite step skipped" in r.getMessage()]
    assert len(skipped) == 2  # each bad step was counted before the run stopped


def test_a_non_finite_parameter_is_a_bad_step(tmp_path, monkeypatch):
    real = module_lib.LMModule.training_step

    def poison_at_step_2(self, dataloader_iter):
        if self.global_step == 2:
            with torch.no_grad():
                next(self.model.parameters()).view(-1)[0] = float("inf")
        return real(self, dataloader_iter)

    monkeypatch.setattr(module_lib.LMModule, "training_step", poison_at_step_2)
    with pytest.raises(NonFiniteLossError, match=r"non-finite parameters.*step 2"):
        run(compose_train(_overrides("gpt", "train.max_bad_steps=1"), tmp_path / "run"))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", [0, 100_000, -1])
def test_all_finite_finds_one_bad_element_anywhere(device, bad, where):
    """One NaN or ±inf anywhere in a tensor of several 64K-element chunks (the multi-tensor kernels' unit on a GPU)
    makes it False; huge finite values, whose L2 norm overflows, do not; nor do empty tensors (a rank's empty FSDP2
    shard), alone or among others."""
    tensors = [torch.full((3, 5), 3e38), torch.randn(200_000), torch.empty(0), torch.randn(7, dtype=torch.bfloat16)]
    tensors = [t.to(device) for t in tensors]
    assert bool(module_lib._all_finite(tensors)) and bool(module_lib._all_finite(tensors[2:3]))
    assert not torch.isfinite(torch.nn.utils.get_total_norm(tensors, norm_type=2.0))  # why not an L2 norm
    tensors[1].view(-1)[where] = bad
    assert not bool(module_lib._all_finite(tensors))


def test_all_finite_hands_the_norm_detached_tensors(monkeypatch):
    """Parameters reach the norm detached: torch's foreach norm reduces tensors that require grad one at a time
    (kla_45m on an H200: 147 kernels for the check as parameters, 11 detached)."""
    seen = []
    real = torch.nn.utils.get_total_norm
    monkeypatch.setattr(torch.nn.utils, "get_total_norm", lambda ts, **kw: seen.extend(ts) or real(ts, **kw))
    params = [torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(2, 3))]
    assert bool(module_lib._all_finite(params))
    assert len(seen) == 2 and not any(t.requires_grad for t in seen)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_host_flag_reads_the_flag_without_waiting_for_later_work(device):
    """The sync-free step reads a step's bad flag a step later; on CUDA it must wait only for that flag's copy, not
    for the work launched after it (which `bool(tensor)` would queue behind and wait for)."""
    flags = [HostFlag(torch.tensor(v, device=device)) for v in (0.0, 1.0)]
    if device == "cuda":
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time queued behind the two copies
    assert [flag.value() for flag in flags] == [False, True]
    if device == "cuda":
        assert not torch.cuda.current_stream().query()  # the sleep still runs: value() did not wait for it
        torch.cuda.synchronize()


@pytest.mark.parametrize("fused", [False, True])
def test_only_the_host_path_reads_a_steps_flag_inside_that_step(tmp_path, monkeypatch, fused):
    """The sync-free step's contract: with fused AdamW, a training step reads only the flags of earlier steps (so it
    never waits for its own GPU work); with foreach AdamW it reads its own (the one synchronisation a step)."""
    reads, inside = [], {"step": None}
    real_init, real_value, real_step = HostFlag.__init__, HostFlag.value, module_lib.LMModule.training_step

    def tagged_init(self, flag):
        real_init(self, flag)
        self.made_in = inside["step"]

    def logged_value(self):
        if inside["step"] is not None:
            reads.append((self.made_in, inside["step"]))
        return real_value(self)

    def marked_step(self, dataloader_iter):
        inside["step"] = self.global_step
        try:
            return real_step(self, dataloader_iter)
        finally:
            inside["step"] = None

    monkeypatch.setattr(HostFlag, "__init__", tagged_init)
    monkeypatch.setattr(HostFlag, "value", logged_value)
    monkeypatch.setattr(module_lib.LMModule, "training_step", marked_step)
    overrides = [*TINY, f"optim.fused={str(fused).lower()}", "trainer.log_every_n_steps=4"]  # one metrics row
    run(compose_train(overrides, tmp_path / "run"))
    made = {m for m, _ in reads}
    assert made == ({0, 1, 2} if fused else {0, 1, 2, 3})  # fused: the last step's flag is read by the metrics row
    assert all(m < r for m, r in reads) if fused else all(m == r for m, r in reads)
