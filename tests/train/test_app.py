"""The training app in-process on tiny synthetic runs: outputs, checkpoints, export, fail-fast config errors."""

import csv
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from hydra.errors import ConfigCompositionException
from transformers import AutoModelForCausalLM

from klalm.config_checks import ConfigError
from klalm.data.loader import NoDocumentsError
from klalm.models.checkpoint import find_latest, list_checkpoints, load_model
from klalm.models.export import export_step
from klalm.train import callbacks as callbacks_lib
from klalm.train import module as module_lib
from klalm.train.app import run
from klalm.train.module import NonFiniteLossError

from .conftest import RUN_ENV, TINY, compose_train, train_cmd

WITH_CKPT = ["callbacks=default", "callbacks.sampler=null", "callbacks.progress=null"]


def _rows(run_dir):
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_tiny_run_writes_metrics_checkpoints_export(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_train([*TINY, *WITH_CKPT, "callbacks.checkpoint.every_n_steps=2", "train.final_eval=true",
                         "train.export_hf=true", "train.plot=true"], run_dir)  # fmt: skip
    summary = run(cfg)
    assert summary["steps"] == 4 and summary["tokens_seen"] == 256  # 256 tokens / 64 per step
    rows = [r for r in _rows(run_dir) if r["train/loss"]]
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert [int(r["train/tokens_seen"]) for r in rows] == [64, 128, 192, 256]
    assert all(math.isfinite(float(r["train/loss"])) and float(r["perf/tokens_per_s"]) > 0 for r in rows)
    assert "perf/mfu" not in rows[0]  # CPU: MFU omitted
    assert [int(r["step"]) for r in _rows(run_dir) if r.get("val/loss")] == [4]  # the final evaluation
    assert math.log(128) - 1 < summary["val_loss"] < math.log(128) + 1  # random tokens: about ln V
    assert summary["val_ppl"] == pytest.approx(math.exp(summary["val_loss"]), rel=1e-5)
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-00000002.ckpt", "step-00000004.ckpt"]
    assert (run_dir / "loss.png").stat().st_size > 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 4

    # the export (of the last step, which it records), the run dir and the .ckpt all load to the same weights, and
    # `import klalm` suffices for Auto*
    assert export_step(run_dir / "hf") == 4
    exported = AutoModelForCausalLM.from_pretrained(run_dir / "hf")
    from_ckpt, tokenizer = load_model(find_latest([run_dir]))
    from_dir, _ = load_model(run_dir)
    assert tokenizer is None  # synthetic data has no tokenizer
    ids = torch.randint(0, 128, (2, 16))
    ref = exported(ids).logits
    torch.testing.assert_close(from_ckpt(ids).logits, ref, rtol=0, atol=0)
    torch.testing.assert_close(from_dir(ids).logits, ref, rtol=0, atol=0)


@pytest.mark.parametrize("during", ["final evaluation", "export", "plot"])
def test_a_sigterm_after_the_last_step_still_writes_the_summary(tmp_path, monkeypatch, during):
    """A SIGTERM once the fit had ended (its checkpoint written) left no summary.json: in the final evaluation
    Lightning's loop ended the run with exit status 0, and later (export, plot) the signal's default action ended the
    process at once. The finish stops there, writes the summary and exits 143. The summary says whether the export
    was written (`exported`): an earlier start's export that records no step is dated by its steps only then."""
    from klalm.train import app

    def sigterm():
        assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL, "a SIGTERM here ends the run at once, unsummarised"
        os.kill(os.getpid(), signal.SIGTERM)

    if during in ("export", "plot"):
        monkeypatch.setattr(app, {"export": "export_hf", "plot": "plot_losses"}[during], lambda *a, **kw: sigterm())
    else:
        step = module_lib.LMModule.validation_step

        def validation_step(self, *args, **kwargs):
            if self.trainer.state.fn == "validate":  # the final evaluation, not one during the fit
                sigterm()
            return step(self, *args, **kwargs)

        monkeypatch.setattr(module_lib.LMModule, "validation_step", validation_step)
    run_dir = tmp_path / "run"
    overrides = [*TINY, *WITH_CKPT, "train.final_eval=true", "train.export_hf=true", "train.plot=true",
                 "data.val_batches=3"]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        run(compose_train(overrides, run_dir))
    assert stopped.value.code == 143 and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["tokens_seen"] == 256
    assert (summary["val_loss"] is None) == (during == "final evaluation")  # the evaluation was cut short
    assert summary["exported"] == (during == "plot") == (run_dir / "hf" / "source.json").is_file()
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-00000004.ckpt"]


def test_a_sigterm_once_the_summary_is_written_counts_the_wall_time_once(tmp_path, monkeypatch):
    """A SIGTERM that came just after the finish wrote summary.json (before it returned) had it written again, this
    start's wall time added to the one just written as if an earlier start's: `wall_s` twice the run's."""
    from klalm.train import app

    write, signalled = app.write_atomic, []

    def write_then_sigterm(path, data):
        write(path, data)
        if path.name == "summary.json" and not signalled:  # once: the second write runs under the default action
            signalled.append(path)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(app, "write_atomic", write_then_sigterm)
    run_dir = tmp_path / "run"
    started = time.time()
    with pytest.raises(SystemExit) as stopped:
        run(compose_train([*TINY, *WITH_CKPT, "train.export_hf=true"], run_dir))
    elapsed = time.time() - started
    assert stopped.value.code == 143 and signalled
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["exported"] is True
    assert 0 < summary["wall_s"] <= elapsed + 0.1  # (rounded to 0.1 s)


def test_resume_auto_continues_from_latest(tmp_path):
    first = compose_train([*TINY, *WITH_CKPT, "run_name=r", "callbacks.checkpoint.every_n_steps=1"],
                          tmp_path / "r" / "a")  # fmt: skip
    run(first)
    longer = ["train.max_tokens=384", "resume=auto", "resume_allow_changes=true", "run_name=r",
              "callbacks.checkpoint.every_n_steps=1"]  # fmt: skip
    summary = run(compose_train([*TINY, *WITH_CKPT, *longer], tmp_path / "r" / "b"))
    assert summary["steps"] == 6 and summary["tokens_seen"] == 384
    steps = [int(r["step"]) for r in _rows(tmp_path / "r" / "b") if r["train/loss"]]
    assert steps == [5, 6]  # continued, not restarted


@pytest.mark.parametrize(
    ("override", "error", "key"),
    [
        ("train.max_tokenz=100", ConfigCompositionException, "max_tokenz"),
        ("optim.betaz=[0.9,0.9]", ConfigCompositionException, "betaz"),
        ("optim.lr=-1", ValueError, "optim.lr"),
        ("train.global_batch_tokens=100", ValueError, "train.global_batch_tokens"),
        ("train.max_tokens=10", ValueError, "train.max_tokens"),
        ("trainer.precision=16-mixed", ValueError, "trainer.precision"),
        ("train.max_bad_steps=0", ValueError, "train.max_bad_steps"),
        ("resume=/no/such/file.ckpt", ValueError, "resume"),
        ("scheduler.shape=cubic", ConfigCompositionException, "shape"),
    ],
)
def test_bad_config_fails_fast_naming_the_key(tmp_path, override, error, key):
    with pytest.raises(error, match=key):
        run(compose_train([*TINY, override], tmp_path / "run"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_folder_as_data_file_is_refused_naming_the_key(tmp_path):
    """An OSError the data target raises while it is built (here IsADirectoryError) is a one-line ConfigError
    naming the group, as a ValueError is, not Hydra's wrapped InstantiationException."""
    overrides = ["experiment=smoke", "data=files", f"data.train={tmp_path}", "data.tokenizer=bpe"]
    with pytest.raises(ConfigError, match=rf"^data: data path '{tmp_path}' names a directory .*\(IsADirectoryError;"):
        run(compose_train(overrides, tmp_path / "run"))


def test_a_warmup_longer_than_the_run_is_refused_in_one_line_and_leaves_no_folder(tmp_path):
    """Found from the config, before the data and the model (it was found once the run knew its length, inside fit,
    which still refuses a resume's, counted from its checkpoint)."""
    cmd = train_cmd(["experiment=smoke", "scheduler.warmup=50", "run_name=r", f"paths.log_dir={tmp_path}"], None)
    proc = subprocess.run(cmd, env=RUN_ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "klalm-train: scheduler.warmup=50 gives 50 warmup steps, not fewer than the run's 20 (train.max_tokens // "
        "train.global_batch_tokens): its lr would never reach optim.lr"
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("target", "refusal"),
    [
        ("torch.optim.AdamWW", """cannot be imported: ModuleNotFoundError("No module named 'torch.optim.AdamWW'")"""),
        ("klalm_test_broken.Opt", "cannot be imported: RuntimeError('broken at import')"),
        ("torch..optim", "cannot be imported: ValueError(\"Error loading 'torch..optim': invalid dotstring.\\nRelative "
         "imports are not supported.\")"),
        ("1", "is invalid: must be a dotted path such as torch.optim.AdamW"),
        ("math.pi", "is not a callable but of type float"),
    ],
    ids=["missing-name", "raises-at-import", "relative", "not-a-string", "not-callable"],
)  # fmt: skip
def test_a_target_that_cannot_be_resolved_is_refused_in_one_line_naming_it(tmp_path, monkeypatch, target, refusal):
    """A sweep's check of its jobs (`check_partial_targets`) skipped a target that did not import, and a target that
    is no string raised AttributeError, which Hydra turned into a warning, skipping the check of every job; each job
    (or a single run) then ended in Hydra's four lines, its run folder left behind."""
    from klalm.config_checks import check_partial_targets
    from klalm.train.app import instantiate_group

    (tmp_path / "klalm_test_broken.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = compose_train([*TINY, f"optim._target_={target}"])
    with pytest.raises(ConfigError) as checked:
        check_partial_targets(cfg)
    with pytest.raises(ConfigError) as built:
        instantiate_group(cfg, "optim")
    assert str(checked.value) == str(built.value) == f"optim._target_={target} {refusal}"


@pytest.mark.parametrize("target", ["os.remove", "shutil.rmtree", "builtins.exit", "pty.spawn"])
def test_a_target_hydra_refuses_is_refused_in_one_line_before_its_module_is_imported(monkeypatch, target):
    """`resolve_target` located a target before Hydra's target policy had seen its name: a sweep's check of its jobs
    (and a single run, once Hydra had refused the target in several lines) imported the module a config named, such
    as `pty` for `pty.spawn`, which Hydra refuses to instantiate."""
    from klalm.config_checks import check_partial_targets
    from klalm.train.app import instantiate_group

    monkeypatch.delitem(sys.modules, "pty", raising=False)  # not imported, as in a fresh run (put back after the test)
    cfg = compose_train([*TINY, f"optim._target_={target}"])
    with pytest.raises(ConfigError) as checked:
        check_partial_targets(cfg)
    with pytest.raises(ConfigError) as built:
        instantiate_group(cfg, "optim")
    assert str(checked.value) == str(built.value)
    assert str(checked.value).startswith(f"optim._target_={target} is refused by Hydra's target policy: Target ")
    assert "\n" not in str(checked.value) and "pty" not in sys.modules


def test_wsd_bad_shape_fails_naming_the_key(tmp_path):
    """Refused by the config check, before anything is built (was a KeyError from the scheduler, after the model)."""
    with pytest.raises(ConfigError, match="scheduler.shape='cubic' is invalid: must be linear, 1-sqrt or cosine"):
        run(compose_train([*TINY, "scheduler=wsd", "scheduler.shape=cubic"], tmp_path / "run"))


def _nan_loss_at(monkeypatch, bad_calls):
    """Makes the loss of the given (0-based) micro-batch calls NaN."""
    calls = {"n": 0}
    real = module_lib.lm_loss

    def patched(logits, labels):
        loss, count = real(logits, labels)
        index = calls["n"]
        calls["n"] += 1
        return (loss * float("nan") if index in bad_calls else loss), count

    monkeypatch.setattr(module_lib, "lm_loss", patched)


@pytest.mark.parametrize("trainer", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_non_finite_steps_are_skipped_and_counted_on_the_host_and_on_the_device(tmp_path, monkeypatch, trainer):
    """foreach AdamW skips a bad step after reading its flag on the host; fused AdamW from the flag on the device
    (`found_inf`), read by the host a step later. Both count the same steps, leave parameters and moments alone on
    them (AdamW's step count is the number of good steps) and give the same losses (to bf16 autocast's rounding of
    the two optimisers' last-bit differences on a GPU)."""
    summaries, losses, adam_steps = {}, {}, {}
    for fused in (False, True):
        _nan_loss_at(monkeypatch, {2, 5})  # step 2 (micro 2-3) and step 3 (micro 4-5) each get one NaN micro-batch
        run_dir = tmp_path / f"fused_{fused}"
        tiny = [o if o != "trainer=cpu" else f"trainer={trainer}" for o in TINY]
        overrides = [*tiny, *WITH_CKPT, "train.max_bad_steps=3", f"optim.fused={str(fused).lower()}"]
        summaries[fused] = run(compose_train(overrides, run_dir))
        losses[fused] = [float(r["train/loss"]) for r in _rows(run_dir) if r["train/loss"]]
        state = torch.load(find_latest([run_dir]), weights_only=True)["optimizer_states"][0]["state"]
        adam_steps[fused] = {float(s["step"]) for s in state.values()}
        if trainer == "gpu":  # the allocator's memory metrics (CUDA only)
            row = [r for r in _rows(run_dir) if r.get("perf/peak_mem_gb")][-1]
            assert float(row["perf/peak_reserved_gb"]) >= float(row["perf/peak_mem_gb"]) > 0
            assert float(row["perf/alloc_retries"]) == 0  # a tiny model: the allocator never ran out of blocks
    for summary in summaries.values():
        assert summary["skipped_steps"] == 2
        assert summary["steps"] == 4  # a skipped step is a step (its tokens, its learning rate) without an update
        assert summary["tokens_seen"] == 4 * 64
    assert adam_steps == {False: {2.0}, True: {2.0}}
    assert [math.isnan(x) for x in losses[True]] == [False, True, True, False]
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if trainer == "gpu" else {}
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), equal_nan=True, **tolerance)


@pytest.mark.parametrize("fused", ["false", "true"])  # the host reads the flag in the step / a step later
def test_too_many_non_finite_steps_stop_the_run(tmp_path, monkeypatch, fused):
    _nan_loss_at(monkeypatch, set(range(100)))
    with pytest.raises(NonFiniteLossError, match=r"3 consecutive .* step 2\)"):
        run(compose_train([*TINY, "train.max_bad_steps=3", f"optim.fused={fused}"], tmp_path / "run"))


def test_activation_checkpointing_gives_the_same_losses(tmp_path):
    plain = run(compose_train([*TINY, "train.max_tokens=192"], tmp_path / "a" / "plain"))
    ckpt = run(compose_train([*TINY, "train.max_tokens=192", "train.activation_checkpointing=true"],
                             tmp_path / "a" / "ckpt"))  # fmt: skip
    assert _rows(tmp_path / "a" / "ckpt")[-1]["train/loss"] == _rows(tmp_path / "a" / "plain")[-1]["train/loss"]
    assert ckpt["train/loss"] == plain["train/loss"]


def test_activation_checkpointing_wraps_every_block():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from klalm.models import build_model
    from klalm.train.budget import derive_budget
    from klalm.train.module import LMModule

    budget = derive_budget(max_tokens=64, global_batch_tokens=32, micro_batch_size=2, seq_len=16, world_size=1)
    module = LMModule(build_model("kla", preset="tiny", vocab_size=64), None, None, budget,
                      activation_checkpointing=True)  # fmt: skip
    module.configure_model()
    module.configure_model()  # idempotent: Lightning calls it for fit and again for validate
    assert all(isinstance(layer, CheckpointWrapper) for layer in module.model.model.layers)
    assert not isinstance(module.model.model.layers[0]._checkpoint_wrapped_module, CheckpointWrapper)


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="inductor on CPU needs a C++ compiler")
def test_compile_also_compiles_the_loss_to_the_same_values():
    """train.compile runs the loss through torch.compile (inductor): the same loss, count and logit gradient."""
    from klalm.loss import IGNORE_INDEX
    from klalm.models import build_model
    from klalm.train.budget import derive_budget
    from klalm.train.module import LMModule, lm_loss

    budget = derive_budget(max_tokens=64, global_batch_tokens=32, micro_batch_size=2, seq_len=16, world_size=1)
    module = LMModule(build_model("kla", preset="tiny", vocab_size=64), None, None, budget, compile=True)
    assert module.lm_loss is not lm_loss
    logits = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0)).bfloat16().requires_grad_()
    labels = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    labels[0, :5] = IGNORE_INDEX
    (loss, count), (want_loss, want_count) = module.lm_loss(logits, labels), lm_loss(logits, labels)
    (grad,), (want_grad,) = torch.autograd.grad(loss, logits), torch.autograd.grad(want_loss, logits)
    assert loss.dtype == torch.float32 and int(count) == int(want_count) == 27
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, want_grad, rtol=1e-2, atol=1e-5)  # bf16 gradients: within one rounding


@pytest.mark.parametrize("arch", ["gdn", "gpt_kla"])
def test_compile_blocks_compiles_each_block_once_for_all(arch, monkeypatch, caplog):
    """train.compile=blocks compiles every backbone block on its own and leaves the embedding and head eager;
    identical blocks share one compiled graph (gpt_kla's two kinds of block: two), and the loss and gradients are
    eager's. A counting backend stands in for inductor."""
    from klalm.models import build_model
    from klalm.train.budget import derive_budget
    from klalm.train.distributed import block_classes
    from klalm.train.module import LMModule

    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    plain_compile = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: plain_compile(self, backend=counting))
    torch._dynamo.reset()
    budget = derive_budget(max_tokens=64, global_batch_tokens=32, micro_batch_size=2, seq_len=16, world_size=1)
    model = build_model(arch, preset="tiny", vocab_size=64)
    eager = build_model(arch, preset="tiny", vocab_size=64)
    eager.load_state_dict(model.state_dict())
    module = LMModule(model, None, None, budget, compile="blocks")
    with caplog.at_level(logging.WARNING, logger="klalm.train.module"):
        module.configure_model()
    assert "train.compile=blocks on the CPU" in caplog.text  # compiling for the CPU is slow: the run says so
    blocks = [m for m in model.modules() if isinstance(m, block_classes())]
    assert len(blocks) == 2 and all(b._compiled_call_impl is not None for b in blocks)
    assert model._compiled_call_impl is None
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    loss, want = model(ids, labels=ids).loss, eager(ids, labels=ids).loss
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    want_grads = torch.autograd.grad(want, list(eager.parameters()))
    torch.testing.assert_close(grads, want_grads, rtol=1e-5, atol=1e-6)
    assert len(graphs) == len({type(b.mixer) for b in blocks})
    torch._dynamo.reset()


def test_compile_must_be_true_false_or_blocks():
    from klalm.models import build_model
    from klalm.train.budget import derive_budget
    from klalm.train.module import LMModule

    budget = derive_budget(max_tokens=64, global_batch_tokens=32, micro_batch_size=2, seq_len=16, world_size=1)
    with pytest.raises(ValueError, match="train.compile='layers' is invalid: must be true, false or blocks"):
        LMModule(build_model("gpt", preset="tiny", vocab_size=64), None, None, budget, compile="layers")


# The offline corpus through klalm.data.TextDataModule: smoke settings shrunk to 4 steps of 2 × 32-token micro-batches.
DOCS = [
    "experiment=smoke",
    "data.seq_len=32",
    "data.batch_size=2",
    "data.val_batches=1",
    "train.global_batch_tokens=128",
    "train.max_tokens=512",
    "trainer.log_every_n_steps=1",
    "trainer.limit_val_batches=1",
    "trainer.deterministic=true",
    "callbacks.progress=null",
    "callbacks.sampler.max_new_tokens=4",
    "callbacks.checkpoint.keep_last=10",
    "train.export_hf=false",
    "train.plot=false",
]


def test_resume_on_the_text_data_module_continues_the_token_stream(tmp_path):
    full_dir, resumed_dir = tmp_path / "f" / "full", tmp_path / "f" / "resumed"
    run(compose_train([*DOCS, "callbacks.checkpoint.every_n_steps=2"], full_dir))
    resume = f"resume={full_dir / 'checkpoints' / 'step-00000002.ckpt'}"
    run(compose_train([*DOCS, resume], resumed_dir))
    full = {r["step"]: r["train/loss"] for r in _rows(full_dir) if r["train/loss"]}
    resumed = {r["step"]: r["train/loss"] for r in _rows(resumed_dir) if r["train/loss"]}
    assert sorted(resumed) == ["3", "4"]
    assert resumed == {step: full[step] for step in ("3", "4")}  # same batches, same weights: same losses


def test_mfu_and_optimizer_groups_follow_the_config(tmp_path):
    from klalm.models import build_model
    from klalm.train.flops import train_flops_per_token

    run_dir = tmp_path / "m" / "run"
    overrides = [*TINY, *WITH_CKPT, "callbacks.metrics.peak_flops_per_device=1e9", "train.dynamics_lr_scale=0.25",
                 "optim.weight_decay=0.05"]  # fmt: skip
    run(compose_train(overrides, run_dir))
    row = [r for r in _rows(run_dir) if r["train/loss"]][-1]
    model = build_model("kla", preset="tiny", d_model=32, n_layers=2, vocab_size=128)
    expected = train_flops_per_token(model, 16) * float(row["perf/tokens_per_s"]) / 1e9
    assert float(row["perf/mfu"]) == pytest.approx(expected, rel=1e-6)

    groups = torch.load(find_latest([run_dir]), weights_only=True)["optimizer_states"][0]["param_groups"]
    by_name = {g["name"]: g for g in groups}
    assert by_name["decay"]["weight_decay"] == 0.05 and by_name["no_decay"]["weight_decay"] == 0.0
    assert by_name["dynamics"]["initial_lr"] == pytest.approx(0.25 * by_name["decay"]["initial_lr"])
    assert by_name["dynamics"]["weight_decay"] == 0.0


def test_own_text_file_in_one_line_trains_and_exports(tmp_path, shared_data):
    """data=files with a txt file and a BPE trained on it; no validation files, so no validation loss."""
    run_dir = tmp_path / "o" / "run"
    overrides = ["data=files", f"data.train={shared_data / 'tinyshakespeare' / 'input.txt'}", "data.tokenizer=bpe",
                 "data.bpe_vocab_size=300", f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=32",
                 "data.batch_size=2", "data.num_workers=0", "train.global_batch_tokens=64", "train.max_tokens=256",
                 "callbacks.progress=null", "callbacks.sampler.max_new_tokens=4"]  # fmt: skip
    summary = run(compose_train(overrides, run_dir))
    assert summary["steps"] == 4 and summary["val_loss"] is None
    model, tokenizer = load_model(run_dir)
    assert len(tokenizer) == 300 and model.config.eos_token_id == tokenizer.eos_token_id


def test_validation_files_shorter_than_a_batch_in_one_pass_are_a_config_error(tmp_path, shared_data):
    """data.val_batches=null reads the validation files once; fewer tokens than one batch gave no batch, and the
    module's plain ValueError reached the user as Hydra's traceback (after the whole run, where no sanity check ran)."""
    (tmp_path / "val.txt").write_text("a few words")
    overrides = ["data=files", f"data.train={shared_data / 'tinyshakespeare' / 'input.txt'}",
                 f"data.val={tmp_path / 'val.txt'}", "data.val_batches=null", "data.tokenizer=bpe",
                 "data.bpe_vocab_size=300", f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=32",
                 "data.batch_size=2", "data.num_workers=0", "train.global_batch_tokens=64", "train.max_tokens=128",
                 "callbacks.progress=null", "callbacks.sampler=null"]  # fmt: skip
    with pytest.raises(ConfigError, match=r"^the validation data gave no batch: with data.val_batches=null \(one"):
        run(compose_train(overrides, tmp_path / "o" / "run"))


def test_an_empty_validation_file_is_refused_before_the_first_step(tmp_path, shared_data, monkeypatch):
    """The CPU trainer config runs no sanity validation: an empty data.val was refused at the first validation,
    after train.val_every_n_steps steps (52 s into a smoke run), or here at the final evaluation."""
    (tmp_path / "empty.jsonl").write_text("")
    overrides = ["data=files", f"data.train={shared_data / 'tinyshakespeare' / 'input.txt'}",
                 f"data.val={tmp_path / 'empty.jsonl'}", f"data.tokenizer={shared_data / 'gpt2_tokenizer'}",
                 "model.d_model=32", "model.n_layers=1", "data.seq_len=32", "data.batch_size=2", "data.num_workers=0",
                 "train.global_batch_tokens=64", "train.max_tokens=128", "callbacks.progress=null",
                 "callbacks.sampler=null"]  # fmt: skip
    steps = []
    monkeypatch.setattr(module_lib.LMModule, "training_step", lambda self, *args: steps.append(args))
    with pytest.raises(NoDocumentsError, match=f"^validation source files \\['{tmp_path / 'empty.jsonl'}'\\] "):
        run(compose_train(overrides, tmp_path / "o" / "run"))
    assert steps == []


def test_skipped_records_reach_the_metrics_and_the_summary(tmp_path, shared_data, caplog):
    corpus = tmp_path / "mixed.jsonl"
    corpus.write_bytes(b'{"text": "a few good words of text here"}\n{"text": ""}\nnot json\n' * 40)
    overrides = [*DOCS, "data=enwiki_local", f"data.data_root={shared_data}", f"data.source.paths={corpus}",
                 f"data.val_source.paths={corpus}", "data.num_workers=0", "data.shuffle=false", "data.block_docs=8",
                 "callbacks.sampler=null", "callbacks.checkpoint=null"]  # fmt: skip
    with caplog.at_level(logging.WARNING):
        summary = run(compose_train(overrides, tmp_path / "run"))
    counts = summary["skipped_records"]
    assert set(counts) == {"empty_document", "corrupt_json"} and min(counts.values()) > 0
    column = [int(r["train/skipped_records"]) for r in _rows(tmp_path / "run") if r["train/loss"]]
    assert column == sorted(column) and column[-1] == sum(counts.values())  # a running total, per logged step
    assert any(f"skipped bad record at {corpus}:line 2: empty_document" in r.getMessage() for r in caplog.records)


def test_metrics_show_one_slow_step_in_a_window(tmp_path, monkeypatch):
    """perf/step_time_ms_median and _max time the window's steps one by one: one slow step shows in the max alone. The
    step marks read a clock that advances 10 ms a step and 1.5 s more in step 5, so the row does not depend on how
    loaded the machine is (a real 1.5 s sleep once lost to a 3.2 s median step on a busy 2-core machine)."""
    clock = [0.0]

    def fake_mark(device):
        clock[0] += 0.010
        return clock[0]

    real = module_lib.LMModule.training_step

    def slow_step_5(self, dataloader_iter):
        if self.global_step == 5:
            clock[0] += 1.5
        return real(self, dataloader_iter)

    monkeypatch.setattr(callbacks_lib, "_time_mark", fake_mark)
    monkeypatch.setattr(module_lib.LMModule, "training_step", slow_step_5)
    run(compose_train([*TINY, "trainer.log_every_n_steps=8", "train.max_tokens=512"], tmp_path / "run"))
    (row,) = [r for r in _rows(tmp_path / "run") if r["train/loss"]]
    median, slowest = float(row["perf/step_time_ms_median"]), float(row["perf/step_time_ms_max"])
    assert median == pytest.approx(10.0) and slowest == pytest.approx(1510.0)  # one of the window's eight steps
