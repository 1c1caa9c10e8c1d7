"""scripts/plot_loss.py: a run it cannot plot ends it with one line, not a traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from klalm.fileio import image_name_problem

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("plot_loss", REPO / "scripts" / "plot_loss.py")
plot_loss = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_loss)


def test_a_run_without_metrics_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, REPO / "scripts" / "plot_loss.py", tmp_path, "--out", tmp_path / "x.png"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr == f"plot_loss: metrics file {tmp_path / 'csv' / 'metrics.csv'} does not exist\n"
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        ("step,val/loss\n1,3.5\n", "no train/loss values in "),  # only validation rows
        ("step,train/loss\nx,3.5\n", "could not convert string to float: 'x'"),  # damaged
    ],
)
def test_a_run_without_a_readable_train_loss_is_refused_in_one_line(tmp_path, rows, why):
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text(rows)
    with pytest.raises(SystemExit) as exit_info:
        plot_loss.main([str(tmp_path), "--out", str(tmp_path / "x.png")])
    assert exit_info.value.code.startswith(f"plot_loss: {why}") and "\n" not in exit_info.value.code


def test_an_output_it_cannot_write_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("step,train/loss\n1,3.5\n2,3.25\n")
    plot_loss.main([str(tmp_path), "--out", str(tmp_path / "loss.png")])  # a good run is plotted
    assert capsys.readouterr().out == f"{tmp_path / 'loss.png'}\n"
    assert (tmp_path / "loss.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(SystemExit, match=r"^plot_loss: .*no/such/folder/loss\.png"):
        plot_loss.main([str(tmp_path), "--out", str(tmp_path / "no" / "such" / "folder" / "loss.png")])


@pytest.mark.parametrize(("name", "why"), [("loss", "no suffix names the image's format"),
                                           ("loss.xyz", "matplotlib cannot write .xyz files")])  # fmt: skip
def test_an_output_name_without_an_image_suffix_is_refused_in_one_line_before_any_run_is_read(tmp_path, name, why):
    """`--out loss` wrote PNG bytes to a file named `loss` (and `--out loss.xyz` was refused only once every run was
    read and plotted)."""
    with pytest.raises(SystemExit) as exit_info:
        plot_loss.main([str(tmp_path / "no-such-run"), "--out", str(tmp_path / name)])  # a run that is not read
    assert exit_info.value.code.startswith(f"plot_loss: --out {tmp_path / name}: {why}; name it e.g. "
                                           f"{tmp_path / 'loss.png'} (formats: ")  # fmt: skip
    assert "\n" not in exit_info.value.code and list(tmp_path.iterdir()) == []
    assert image_name_problem(tmp_path / "loss.PDF") is None  # any suffix matplotlib writes, in either case


def test_a_plot_cut_off_mid_write_leaves_the_old_image_whole(tmp_path, savefig_cut_off):
    """loss.png was written in place: a kill mid-write left a truncated image where the old one had been. The figure
    is closed all the same (pyplot kept it)."""
    import matplotlib.pyplot as plt

    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("step,train/loss\n1,3.5\n2,3.25\n")
    (tmp_path / "loss.png").write_bytes(b"old image")
    open_before = plt.get_fignums()
    with pytest.raises(SystemExit, match="^plot_loss: cut off mid-write$"):
        plot_loss.main([str(tmp_path), "--out", str(tmp_path / "loss.png")])
    assert (tmp_path / "loss.png").read_bytes() == b"old image" and plt.get_fignums() == open_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csv", "loss.png"]
