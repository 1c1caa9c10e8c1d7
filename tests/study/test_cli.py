"""klalm-study refuses bad input with one line on stderr, a non-zero exit, and nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from klalm.study.cli import main
from klalm.study.spec import Cell
from tests.study.conftest import spec_file, write_run_dir

REPO = Path(__file__).resolve().parents[2]


def refused(capsys, argv: list[str]) -> str:
    """The one stderr line of a refused command (`sys.exit` with it: exit status 1; nothing on stdout)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, _ = capsys.readouterr()
    message = str(exit_.value.code)
    assert message.startswith("klalm-study: ") and len(message.splitlines()) == 1 and out == "", message
    return message


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    copy = tmp_path / "RESULTS.md"
    shutil.copy(REPO / "docs/RESULTS.md", copy)
    return copy


def test_report_refuses_a_missing_results_folder_and_keeps_the_doc(capsys, tmp_path, doc):
    before = doc.read_bytes()
    err = refused(capsys, ["report", "--results", str(tmp_path / "nope"), "--doc", str(doc)])
    assert f"results folder {tmp_path / 'nope'} does not exist" in err
    assert doc.read_bytes() == before and not (tmp_path / "img").exists()


def test_report_refuses_a_results_folder_without_finished_cells(capsys, tmp_path, doc):
    before = doc.read_bytes()
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    err = refused(capsys, ["report", "--results", str(tmp_path / "empty"), "--doc", str(doc)])
    assert "holds no finished cell" in err and doc.read_bytes() == before


def test_report_refuses_a_missing_doc_or_one_without_markers(capsys, tmp_path):
    results = str(REPO / "results/study_45m")
    assert "--doc" in refused(capsys, ["report", "--results", results, "--doc", str(tmp_path / "nope.md")])
    assert f"--doc {tmp_path} is a folder, expected the Markdown document" in refused(
        capsys, ["report", "--results", results, "--doc", str(tmp_path)]
    )
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    assert "<!-- study:setup -->" in refused(capsys, ["report", "--results", results, "--doc", str(plain)])
    assert plain.read_text() == "no markers\n"


def test_report_refuses_a_plot_folder_that_is_a_file_before_writing_the_doc(capsys, tmp_path, doc):
    before = doc.read_bytes()
    (tmp_path / "img").write_text("not a folder")
    err = refused(capsys, ["report", "--results", str(REPO / "results/study_45m"), "--doc", str(doc)])
    assert f"the plot's folder {tmp_path / 'img'} is a file, expected a folder" in err
    assert doc.read_bytes() == before


@pytest.mark.parametrize("name", ["run.json", "eval.json"])
def test_report_names_a_results_file_that_does_not_parse_and_keeps_the_doc(capsys, tmp_path, doc, name):
    before = doc.read_bytes()
    shutil.copytree(REPO / "results/study_45m", tmp_path / "res")
    (tmp_path / "res/runs/gpt_45m-s1234" / name).write_text("{")
    err = refused(capsys, ["report", "--results", str(tmp_path / "res"), "--doc", str(doc)])
    assert f"gpt_45m-s1234/{name}:1: not valid JSON" in err and doc.read_bytes() == before


def test_report_refuses_bench_rows_it_cannot_find(capsys, tmp_path, doc, monkeypatch):
    before = doc.read_bytes()
    monkeypatch.chdir(tmp_path)  # cost.bench_rows are relative to the repository root
    err = refused(capsys, ["report", "--results", str(REPO / "results/study_45m"), "--doc", str(doc)])
    assert "cost.bench_rows: results/gpu_2026-12-01b/lm_45m.json does not exist" in err
    assert doc.read_bytes() == before


def test_collect_refuses_a_missing_or_wrong_work_folder(capsys, tmp_path):
    spec = str(spec_file(tmp_path))
    assert f"--work folder {tmp_path / 'nope'} does not exist" in refused(
        capsys, ["collect", "--spec", spec, "--work", str(tmp_path / "nope")]
    )
    assert "neither sweep/ nor runs/" in refused(capsys, ["collect", "--spec", spec, "--work", str(tmp_path)])
    assert f"--work {tmp_path / 'spec.yaml'} is a file, expected a folder" in refused(
        capsys, ["collect", "--spec", spec, "--work", str(tmp_path / "spec.yaml")]
    )
    assert not (tmp_path / "results").exists()


def test_collect_refuses_an_unfinished_run_folder_and_writes_nothing(capsys, tmp_path):
    cell = Cell("gpt_45m", 1234)
    write_run_dir(tmp_path / "work/runs" / cell.name, cell, 2e-3, 4.5)
    (tmp_path / "work/runs" / cell.name / "csv/metrics.csv").unlink()
    err = refused(capsys, ["collect", "--spec", str(spec_file(tmp_path)), "--work", str(tmp_path / "work")])
    assert "lacks csv/metrics.csv" in err and not (tmp_path / "results").exists()


def test_plan_names_the_missing_shard_index_and_the_command_that_stages_it(capsys, tmp_path):
    err = refused(capsys, ["plan", "--gpus", "4", "--shards", str(tmp_path / "shards")])
    assert f"{tmp_path / 'shards/train/index.json'} does not exist" in err and "klalm-study stage" in err


def test_plan_refuses_shards_that_make_no_whole_global_batch(capsys, tmp_path, shard_folder):
    (tmp_path / "results").mkdir()
    err = refused(capsys, ["plan", "--spec", str(spec_file(tmp_path)), "--shards", str(shard_folder)])
    assert f"{shard_folder / 'train/index.json'}: its" in err and "no whole global batch of 131,072 tokens" in err


def test_an_unknown_spec_lists_the_available_ones(capsys, tmp_path):
    assert "no study spec 'nope'" in (err := refused(capsys, ["plan", "--spec", "nope"])) and "enwiki_45m" in err
    assert "nope.yaml does not exist" in refused(capsys, ["plan", "--spec", str(tmp_path / "nope.yaml")])
    bad = spec_file(tmp_path, typo=1)
    assert "keys must be" in refused(capsys, ["plan", "--spec", str(bad)])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--gpus", "0"], "--gpus must be at least 1, got 0"),
        (["sweep", "--gpus", "-1", "--minutes", "5"], "--gpus must be at least 1, got -1"),
        (["sweep", "--minutes", "0"], "--minutes must be a positive number, got 0.0"),
        (["train", "--minutes", "nan"], "--minutes must be a positive number, got nan"),
        (["train", "--minutes", "5", "--eval-data", "NOPE"], "--eval-data folder"),
        (["train", "--minutes", "5", "--eval-data", "SHARDS"], "needs SHARDS/hellaswag/hellaswag_val.jsonl or"),
        (["train", "--minutes", "5", "--eval-data", "EVAL", "--models", "gpt_45m", "foo_45m"], "--models: foo_45m"),
    ],
)
def test_blocks_refuse_bad_flags_before_anything_runs(capsys, tmp_path, shard_folder, argv, message):
    for name in ("hellaswag/hellaswag_val.jsonl", "piqa/valid.jsonl", "piqa/valid-labels.lst"):  # what klalm-eval reads
        (tmp_path / "eval" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "eval" / name).touch()
    folders = {"NOPE": tmp_path / "nope", "SHARDS": shard_folder, "EVAL": tmp_path / "eval"}
    argv = [str(folders.get(arg, arg)) for arg in argv]
    message = message.replace("SHARDS", str(shard_folder))
    (results := tmp_path / "results").mkdir()
    common = ["--spec", str(spec_file(tmp_path)), "--shards", str(shard_folder)]
    if argv[0] != "plan":
        common += ["--work", str(tmp_path / "work")]
    assert message in refused(capsys, [*argv, *common])
    assert not (tmp_path / "work").exists() and not any(results.iterdir())


@pytest.mark.parametrize("command", ["plan", "sweep", "train"])
def test_blocks_refuse_a_missing_results_folder(capsys, tmp_path, shard_folder, command):
    """A mistyped --results showed every finished cell as pending, and sweep and train would have trained them all
    again; report alone refused it."""
    block = [] if command == "plan" else ["--minutes", "5", "--work", str(tmp_path / "w")]
    argv = [command, "--spec", str(spec_file(tmp_path)), "--shards", str(shard_folder), "--results",
            str(tmp_path / "typo"), *block]  # fmt: skip
    assert f"results folder {tmp_path / 'typo'} does not exist (a new study: mkdir -p" in refused(capsys, argv)
    assert not (tmp_path / "typo").exists() and not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"experiment": "study_45M"}, "experiment=study_45M: In 'train': Could not find 'experiment/study_45M'"),
        ({"overrides": ["model.d_model=oops"]}, "model.d_model='oops' is invalid"),
    ],
)
def test_plan_refuses_an_experiment_or_overrides_that_do_not_compose(capsys, tmp_path, shard_folder, changes, message):
    (tmp_path / "results").mkdir()
    argv = ["plan", "--spec", str(spec_file(tmp_path, **changes)), "--shards", str(shard_folder)]
    assert message in refused(capsys, argv)


def test_train_blames_an_unknown_task_on_the_spec_not_on_the_eval_data(capsys, tmp_path, shard_folder):
    (tmp_path / "results").mkdir()
    (tmp_path / "eval").mkdir()
    raw = yaml.safe_load(spec_file(tmp_path).read_text())
    spec = spec_file(tmp_path, eval={**raw["eval"], "tasks": ["hellaswg"]})
    argv = ["train", "--spec", str(spec), "--shards", str(shard_folder), "--minutes", "5", "--work",
            str(tmp_path / "w"), "--eval-data", str(tmp_path / "eval")]  # fmt: skip
    assert "study spec eval.tasks: " in refused(capsys, argv)


def test_pack_and_stage_refuse_missing_folders(capsys, tmp_path):
    err = refused(capsys, ["pack", "--shards", str(tmp_path / "nope"), "--out", str(tmp_path / "out")])
    assert f"{tmp_path / 'nope/tokenizer'} does not exist" in err and not (tmp_path / "out").exists()
    err = refused(capsys, ["stage", "--from", str(tmp_path / "nope"), "--shards", str(tmp_path / "staged")])
    assert "no manifest.json" in err and not (tmp_path / "staged").exists()


def test_pack_and_stage_refuse_a_file_where_a_folder_goes_and_damaged_input(capsys, tmp_path, shard_folder):
    (tmp_path / "file").write_text("precious\n")
    err = refused(capsys, ["pack", "--shards", str(shard_folder), "--out", str(tmp_path / "file")])
    assert f"--out {tmp_path / 'file'} is a file, expected a folder" in err
    err = refused(capsys, ["pack", "--shards", str(shard_folder), "--out", str(tmp_path / "file/out")])
    assert "pack: [Errno 20] Not a directory" in err and str(tmp_path / "file/out") in err  # a folder it cannot make
    err = refused(capsys, ["stage", "--from", str(tmp_path), "--shards", str(tmp_path / "file")])
    assert f"--shards {tmp_path / 'file'} is a file, expected a folder" in err
    assert (tmp_path / "file").read_text() == "precious\n"
    (shard_folder / "train/tokens-00001.bin").unlink()
    err = refused(capsys, ["pack", "--shards", str(shard_folder), "--out", str(tmp_path / "out")])
    assert "train/tokens-00001.bin" in err and not (tmp_path / "out").exists()
    (tmp_path / "pieces").mkdir()
    (tmp_path / "pieces/manifest.json").write_text("")
    err = refused(capsys, ["stage", "--from", str(tmp_path / "pieces"), "--shards", str(tmp_path / "staged")])
    assert f"{tmp_path / 'pieces/manifest.json'}:1: not valid JSON" in err and not (tmp_path / "staged").exists()
