"""Run a synthetic plan in blocks of GPU time, resuming from the results folder and the paused units' states.

    klalm-synthetic run --plan full --families a5 --results results/synthetic --state .carry/synthetic_state \\
        --time-budget-s 500
    klalm-synthetic plan --plan full --families a5 --results results/synthetic     # what is done, what is left
    klalm-synthetic report --plan full --results results/synthetic --doc docs/synthetic.md
    klalm-synthetic merge --from <copy of a results folder> --results results/synthetic
    klalm-synthetic progress --state .carry/synthetic_state --results results/synthetic   # paused units' evaluations
    klalm-synthetic pack --state .carry/synthetic_state --out $OUT --every-s 20 &   # ship checkpoints as they come
    klalm-synthetic evaluate --state .carry/synthetic_state --plot positions.png        # their accuracy by position
    klalm-synthetic positions --results results/synthetic --archs kla --plot positions.png  # recorded runs' too
    klalm-synthetic positions --family mqar --results results/synthetic --lengths 2048     # MQAR's, by spans
    klalm-synthetic curves --family mqar --results results/synthetic --lengths 2048 --plot curves.png  # by step

`klalm-synthetic VERB --help` lists its options; docs/synthetic.md ("Running the grid in blocks") says more
"""

# The command line only (this docstring is its --help), with nothing heavier than omegaconf (klalm.config_checks):
# `--help` and usage errors answer before the modules that do the work are imported (klalm.tasks.runner, and with it
# torch; merge, pack, positions and curves: klalm.tasks.folders, without).

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from klalm.config_checks import A5_CRITERIA, MAD_TASKS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="klalm-synthetic", description=__doc__.splitlines()[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))  # fmt: skip
    verbs = p.add_subparsers(dest="verb", required=True)

    def add_verb(name: str, text: str) -> argparse.ArgumentParser:  # its line in the list: also its --help description
        return verbs.add_parser(name, help=text, description=text)

    for verb, text in (("run", "run one block of the plan"), ("plan", "list the plan's units: state, estimate")):
        cmd = add_verb(verb, text)
        _add_plan_args(cmd)
        cmd.add_argument("--results", type=Path, required=True, help="results folder (a5.jsonl, rates.jsonl, ...)")
        budget_help = {
            "run": "this block's wall-clock seconds; 0 or less: start nothing; inf: no deadline (default: "
            "the plan's time_budget_s)",
            "plan": "accepted and ignored (plan has no deadline)",
        }
        cmd.add_argument("--time-budget-s", type=float, help=budget_help[verb])
        cmd.add_argument("--gpus", type=int, help="GPUs to use (default: every visible one; none on the CPU)")
        cmd.add_argument("--state", type=Path, help="folder of paused units' states: resumed from, paused into "
                         "(needed by a run with a time budget)")  # fmt: skip
        if verb == "run":
            cmd.add_argument("--in-process", action="store_true", help="run units in this process (one slot)")
            cmd.add_argument("--finish-only", action="store_true", help="start only units estimated to end before "
                             "the deadline (the last block before the states would be lost; needs one)")  # fmt: skip
            cmd.add_argument("--checkpoint-every-s", type=float, help="also save running units' states this often "
                             "(at an evaluation), so a block killed early resumes from there")  # fmt: skip
        else:
            cmd.add_argument("--gpu-name", help="estimate from this GPU model's rows of rates.jsonl (e.g. 'NVIDIA "
                             "H200') instead of this machine's device")  # fmt: skip
    report = add_verb("report", "tables and plots from a results folder")
    _add_plan_args(report)
    report.add_argument("--results", type=Path, required=True, help="results folder")
    where = report.add_mutually_exclusive_group(required=True)
    where.add_argument("--doc", type=Path, help="Markdown file whose <!-- synthetic:NAME --> sections are rewritten")
    where.add_argument("--out", type=Path, help="folder for results.md and the plots")
    merged = add_verb("merge", "append another results folder's new rows to this one")
    merged.add_argument("--from", dest="source", type=Path, required=True, help="the folder that came back")
    merged.add_argument("--results", type=Path, required=True, help="the committed results folder")
    merged.add_argument("--commit", default=None, help="commit recorded where rows say 'unknown' (default: HEAD)")
    merged.add_argument("--state", type=Path, default=None, help="state folder to replace by the state.tar.* parts "
                        "beside --from (kept as it is when none came back); the progress of the units paused in "
                        "them is recorded too")  # fmt: skip
    packed = add_verb("pack", "pack a state folder into the state.tar.* pieces `merge --state` reads")
    packed.add_argument("--state", type=Path, required=True, help="the state folder")
    packed.add_argument("--out", type=Path, required=True, help="the folder the pieces are written to")
    packed.add_argument("--every-s", type=float, default=None, help="look again this often and pack whenever the "
                        "states changed, until killed (default: pack once)")  # fmt: skip
    progress = add_verb("progress", "record the evaluations of the units paused in a state folder")
    progress.add_argument("--state", type=Path, required=True, help="the state folder (e.g. one that came back)")
    progress.add_argument("--results", type=Path, required=True, help="the results folder (progress.jsonl)")
    progress.add_argument("--commit", default=None, help="the commit that ran the paused units (default: HEAD)")
    assess = add_verb("evaluate", "evaluate the units paused in a state folder, by position")
    assess.add_argument("--state", type=Path, required=True, help="the state folder")
    assess.add_argument("--device", default="cpu", help="torch device to evaluate on (default: cpu)")
    assess.add_argument("--plot", type=Path, default=None, help="also plot accuracy by position to this PNG")
    shown = add_verb("positions", "A5 or MQAR runs' held-out accuracy by position (paused runs: at "
                             "their last evaluation)")  # fmt: skip
    shown.add_argument("--results", type=Path, required=True, help="the results folder (a5.jsonl, mqar.jsonl)")
    _add_run_filters(shown, "by position")
    curves = add_verb("curves", "held-out accuracy by step of finished and paused runs")
    curves.add_argument("--results", type=Path, required=True, help="the results folder (and its progress.jsonl)")
    _add_run_filters(curves, "against step")
    curves.add_argument("--steps", type=int_list, default=[], help="the table's steps (default: 5 evenly spaced)")
    for verb in verbs.choices.values():  # a misspelt option fails, not taken as the option it begins
        verb.allow_abbrev = False
    return p.parse_args(_joined_negatives(sys.argv[1:] if argv is None else argv))


def _joined_negatives(argv: list[str]) -> list[str]:
    """`--lrs -1e-3` as `--lrs=-1e-3`: argparse (Python 3.11) reads a value that starts with '-' as an option unless
    it is -N or -N.N, and then says only "argument --lrs: expected one argument"."""
    joined: list[str] = []
    for arg in argv:
        negative = re.match(r"-(\.?\d|inf|nan)", arg, re.IGNORECASE)
        if joined and joined[-1].startswith("--") and "=" not in joined[-1] and negative:
            joined[-1] += "=" + arg
        else:
            joined.append(arg)
    return joined


def _add_run_filters(verb: argparse.ArgumentParser, plotted: str) -> None:
    """The options of the verbs that show A5 or MQAR runs: which runs, and a plot of their accuracy `plotted`."""
    verb.add_argument("--family", choices=["a5", "mqar"], default="a5", help="which runs (default: a5)")
    verb.add_argument("--archs", type=name_list, default=[], help="comma-separated archs (default: all)")
    verb.add_argument("--lengths", type=int_list, default=[], help="comma-separated lengths (default: all)")
    verb.add_argument("--depths", type=int_list, default=[], help="comma-separated depths (default: all)")
    verb.add_argument("--plot", type=Path, default=None, help=f"also plot accuracy {plotted} to this PNG")


def name_list(text: str) -> list[str]:
    """ "kla,gpt" -> ["kla", "gpt"] (a command-line list)."""
    return [x for x in text.split(",") if x]


def int_list(text: str) -> list[int]:
    """ "0,1,2" -> [0, 1, 2] (a command-line list)."""
    return [int(x) for x in name_list(text)]


def float_list(text: str) -> list[float]:
    """ "1e-3,3e-3" -> [0.001, 0.003] (a command-line list)."""
    return [float(x) for x in name_list(text)]


def _cells(text: str) -> list[list[int]]:
    """ "64x4,128x8" -> [[64, 4], [128, 8]]."""
    try:
        return [[int(v) for v in cell.split("x")] for cell in text.split(",") if cell]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"wants LENGTHxPAIRS items like 64x4,128x8; got {text!r}") from err


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    """The knobs that change a plan (each replaces the value in every stage of the plan; klalm.tasks.plans.apply_args
    applies them)."""
    p.add_argument("--plan", default="full", help="configs/synthetic/<name>.yaml (full, quick, cpu) or a YAML path "
                   "(default: full, the GPU grid)")  # fmt: skip
    p.add_argument("--archs", type=name_list, help="comma-separated archs, e.g. kla,gpt,mamba,gdn,gpt_kla")
    p.add_argument("--families", type=name_list, help="comma-separated subset of a5,mqar,mad")
    p.add_argument("--steps", type=int, help="optimiser steps of every run (MAD: replaces epochs)")
    p.add_argument("--seeds", type=int_list, help="seeds of every stage, e.g. 0,1,2")
    p.add_argument("--lrs", type=float_list, help="learning rates of mqar and mad, e.g. 1e-3,3e-3")
    p.add_argument("--device", help="auto, cpu, cuda")
    p.add_argument("--members", type=int, help="seeds trained side by side in one process (one CUDA graph)")
    p.add_argument("--procs-per-gpu", type=int, help="units running at once on each GPU, one process each")
    p.add_argument("--units-per-process", type=int, help="units differing only in task, lr or weight decay "
                   "trained side by side in one process (a pack)")  # fmt: skip
    p.add_argument("--max-state-mib", type=float, help="a pack's paused states stay under this many MiB")
    p.add_argument("--compile", dest="compile_backend", help="torch.compile backend of the training step on CUDA, "
                   "e.g. inductor; none: eager")  # fmt: skip
    p.add_argument("--deterministic", action="store_true", default=None, help="deterministic kernels only "
                   "(torch.use_deterministic_algorithms): a unit run twice gives the same rows, slower")  # fmt: skip
    p.add_argument("--a5-lengths", type=int_list, help="A5 sequence lengths, e.g. 4,8,16")
    p.add_argument("--a5-depths", type=int_list, help="A5 depths, e.g. 1,2")
    p.add_argument("--a5-criterion", choices=sorted(A5_CRITERIA), help="A5 'solved' metric")
    p.add_argument("--mqar-cells", type=_cells, help="MQAR LENGTHxPAIRS cells, e.g. 64x4,128x8,256x16")
    p.add_argument("--mqar-depths", type=int_list, help="MQAR depths (blocks), e.g. 1")
    p.add_argument("--mqar-d-models", type=int_list, help="MQAR widths, e.g. 128")
    p.add_argument("--mqar-d-states", type=int_list, help="MQAR: the KLA archs' d_state, e.g. 64")
    p.add_argument("--mad-tasks", type=name_list, help=f"comma-separated subset of {','.join(MAD_TASKS)}")
    p.add_argument("--mad-weight-decays", type=float_list, help="MAD weight decays, e.g. 0 (with --lrs: one setting)")
