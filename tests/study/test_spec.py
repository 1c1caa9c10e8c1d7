"""klalm.study.spec: the shipped spec loads, and each kind of mistake is refused naming the key."""

from __future__ import annotations

import re

import pytest
import yaml

from klalm.study.spec import load_spec
from tests.study.conftest import spec_file


def test_the_shipped_spec_loads_and_names_its_cells():
    spec = load_spec()
    assert spec.experiment == "study_45m"
    assert [c.name for c in spec.run_cells()][:5] == [f"{m}-s1234" for m in spec.models]
    assert "kla_45m-lr0.0005" in [c.name for c in spec.sweep_cells()]
    assert spec.lr_source("mamba_45m") == "kla_45m" and spec.lr_source("gpt_45m") == "gpt_45m"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"extra_seeds": {"gtp_45m": [1]}}, "'gtp_45m' is used but not listed"),
        ({"models": {"gpt_45m": {"lr": "kla_tiny", "dynamics_lr_scale": 1.0}}}, "kla_tiny has no sweep.lrs entry"),
        ({"models": {"gpt_45m": {"lr": "sweep", "dyn": 1.0}}}, "study models.gpt_45m: keys must be"),
        ({"colour": "blue"}, "keys must be"),
        ({"cost": {"tokens": [1], "gpus": [1], "tokens_per_s_180m": {}}}, "study cost: keys must be bench_rows"),
    ],
)
def test_mistakes_are_refused(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        load_spec(str(spec_file(tmp_path, **changes)))


SHIPPED = load_spec()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"estimate": {**SHIPPED.estimate, "overhead": 45}}, r"study estimate: keys must be \['ddp_efficiency'"),
        ({"estimate": {**SHIPPED.estimate, "ddp_efficiency": 1.5}}, "estimate.ddp_efficiency=1.5 must be"),
        ({"estimate": {**SHIPPED.estimate, "prior_tokens_per_s": {"gpt_45m": "fast"}}}, "prior_tokens_per_s="),
        ({"eval": {**SHIPPED.eval, "task": ["piqa"]}}, r"study eval: keys must be \['batch_size'"),
        ({"eval": {**SHIPPED.eval, "tasks": []}}, "eval.tasks=\\[\\] must be a list of task names"),
        ({"eval": {**SHIPPED.eval, "limit": 0}}, "eval.limit=0 must be a positive whole number"),
        ({"eval": {**SHIPPED.eval, "batch_size": 0}}, "eval.batch_size=0 must be"),
        ({"sweep": {"lrs": {"gpt_45m": 1e-3, "kla_45m": [1e-3]}, "fraction": 0.1}}, "sweep.lrs.gpt_45m=0.001 must be"),
        ({"seeds": ["a"]}, r"study seeds=\['a'\] must be a list of whole numbers"),
        ({"extra_seeds": {"gpt_45m": [1.5]}}, "extra_seeds.gpt_45m="),
        ({"models": {**SHIPPED.models, "gpt_45m": {"lr": "sweep", "dynamics_lr_scale": "x"}}}, "dynamics_lr_scale='x'"),
        ({"overrides": [3]}, "overrides=\\[3\\] must be a list of Hydra overrides"),
        # after each cell's own budget on its command: it replaced every cell's, silently
        ({"overrides": ["data.seq_len=32", "train.max_tokens=1000"]},
         r"study overrides: 'train.max_tokens=1000' sets train.max_tokens, which the study sets per cell \(from one "
         "pass over the staged train split"),
        # a cell named twice: trained again once finished, or its folder deleted while it trained (two GPUs)
        ({"seeds": [1234, 1234]}, r"study seeds=\[1234, 1234\]: seed 1234 is given twice \(a cell, <model>-s1234,"),
        ({"extra_seeds": {"kla_45m": [1234]}}, r"extra_seeds.kla_45m=\[1234\]: seed 1234 is in seeds already"),
        ({"sweep": {"lrs": {"gpt_45m": [1e-3, 0.001], "kla_45m": [1e-3]}, "fraction": 0.1}},
         r"sweep.lrs.gpt_45m=\[0.001, 0.001\] names the cell gpt_45m-lr0.001 twice"),
    ],
)  # fmt: skip
def test_a_mistake_inside_a_section_is_refused_naming_the_key(tmp_path, changes, message):
    """Typos below the top level went through: a KeyError or TypeError later, or a seed named "a"."""
    with pytest.raises(ValueError, match=message):
        load_spec(str(spec_file(tmp_path, **changes)))


@pytest.mark.parametrize(
    "override",
    ["trainer=ddp", "trainer=fsdp", "trainer.devices=1", "++trainer.devices=4", "trainer.num_nodes=2",
     "trainer.strategy=fsdp"],
)  # fmt: skip
def test_an_override_of_the_trainer_the_study_launches_is_refused_naming_the_file(tmp_path, override):
    """The spec's overrides followed a multi-GPU run's own `trainer=ddp trainer.devices=<--gpus>` on its command, so
    one of these replaced the study's choice on every run (and gave each one-GPU sweep cell a trainer for several):
    they passed unrefused. A one-device trainer (a CPU rehearsal's trainer=cpu) stays allowed."""
    path = spec_file(tmp_path, overrides=["data.seq_len=32", override])  # (its models in yaml.safe_dump's order)
    key = override.lstrip("+").split("=")[0]
    refusal = (
        f"study spec {path}: overrides: '{override}' sets {key} for every model (gdn_45m, gpt_45m, gpt_kla_45m, "
        "kla_45m, mamba_45m), which the study sets itself: one GPU for a sweep cell, trainer=ddp "
        "trainer.devices=<--gpus> for a run on several (a one-device trainer=cpu or gpu may stay: the study's "
        "trainer=ddp comes after it)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
        load_spec(str(path))
    assert load_spec(str(spec_file(tmp_path, overrides=["trainer=cpu", "trainer.precision=32-true"]))).overrides


@pytest.mark.parametrize("fraction", [1.5, "abc"])
def test_sweep_fraction_must_be_a_fraction(tmp_path, fraction):
    raw = yaml.safe_load(spec_file(tmp_path).read_text())
    raw["sweep"]["fraction"] = fraction
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="sweep.fraction"):
        load_spec(str(tmp_path / "bad.yaml"))


def test_missing_specs_are_named():
    with pytest.raises(FileNotFoundError, match="no_such"):
        load_spec("no_such")
    with pytest.raises(FileNotFoundError, match="nowhere.yaml"):
        load_spec("nowhere.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"", r"spec.yaml: keys must be .*, got nothing"),
        (b"a: [1, 2\n", r"spec.yaml:2: not valid YAML: expected ',' or ']'"),
        (b"\xff\xfe", r"spec.yaml: not UTF-8 text"),
        (b"- 1\n- 2\n", r"spec.yaml: keys must be .*, got a list"),
    ],
)
def test_a_spec_file_that_is_not_a_mapping_is_refused_naming_it(tmp_path, text, message):
    (tmp_path / "spec.yaml").write_bytes(text)
    with pytest.raises(ValueError, match=message):
        load_spec(str(tmp_path / "spec.yaml"))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("models", ["gpt_45m"], r"models must be a mapping, got \['gpt_45m'\]"),
        ("models", {"gpt_45m": None}, "study models.gpt_45m: keys must be lr and dynamics_lr_scale, got None"),
        ("seeds", [], "study seeds: name at least one seed"),
        ("sweep", {"fraction": 0.1}, r"study sweep: keys must be fraction and lrs, got \['fraction'\]"),
    ],
)
def test_values_of_the_wrong_kind_are_refused_naming_the_key(tmp_path, key, value, message):
    with pytest.raises(ValueError, match=message):
        load_spec(str(spec_file(tmp_path, **{key: value})))
