"""`klalm-study`: the pretraining study (docs/RESULTS.md), run over several blocks of GPU time.

    klalm-study pack --shards data/shards/enwiki_full --out .carry/study     # here: xz pieces + manifest to carry
    klalm-study stage --from .carry/s1 .carry/s2 --shards data/shards/enwiki_full   # there: verify and unpack
    klalm-study plan --gpus 2                       # done and pending cells, estimated GPU minutes
    klalm-study sweep --gpus 2 --minutes 8          # learning-rate sweep cells, one GPU each, side by side
    klalm-study train --gpus 2 --minutes 9          # pending runs, DDP over the GPUs, then validation and zero-shot
    klalm-study collect --work outputs/study        # rebuild results of finished cells from their run folders
    klalm-study report                              # docs/RESULTS.md tables and plot from the results folder

Every subcommand but pack and stage takes --spec (default enwiki_45m: configs/study/enwiki_45m.yaml) and
--results (default: the spec's results folder).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

from klalm.study.spec import DEFAULT_SPEC, load_spec

DEFAULT_SHARDS = "data/shards/enwiki_full"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="klalm-study", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    pack = sub.add_parser("pack", help="compress a shard folder into pieces to carry (with a manifest)")
    pack.add_argument("--shards", type=Path, default=Path(DEFAULT_SHARDS))
    pack.add_argument("--out", type=Path, required=True)
    stage = sub.add_parser("stage", help="verify and unpack the pieces that arrived (idempotent)")
    stage.add_argument("--from", dest="sources", type=Path, nargs="+", required=True)
    stage.add_argument("--shards", type=Path, default=Path(DEFAULT_SHARDS))
    commands = {"plan": "list cells and estimates", "sweep": "run sweep cells", "train": "run the runs",
                "collect": "write results from finished run folders", "report": "write docs/RESULTS.md"}  # fmt: skip
    for name, text in commands.items():
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--spec", default=DEFAULT_SPEC, help="configs/study name or a YAML path")
        cmd.add_argument("--results", type=Path, default=None, help="results folder (default: the spec's)")
        if name == "report":
            cmd.add_argument("--doc", type=Path, default=Path("docs/RESULTS.md"))
            continue
        if name == "collect":
            cmd.add_argument("--work", type=Path, default=Path("outputs/study"), help="the runner's run folders")
            continue
        cmd.add_argument("--shards", type=Path, default=Path(DEFAULT_SHARDS))
        cmd.add_argument("--gpus", type=int, default=1)
        if name != "plan":
            cmd.add_argument("--minutes", type=float, required=True, help="wall-clock budget of this block")
            cmd.add_argument("--work", type=Path, default=Path("outputs/study"), help="run folders (not results)")
            cmd.add_argument("--eval-data", type=Path,
                             default=Path(os.environ.get("KLALM_SHARED_DATA", "../shared/data")))  # fmt: skip
            cmd.add_argument("--commit", default=os.environ.get("KLALM_COMMIT", "unknown"))
        if name == "train":
            cmd.add_argument("--models", nargs="*", default=None, help="only these models (default: all)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    if args.command == "pack":
        from klalm.study.staging import pack

        manifest = pack(args.shards, args.out)
        sizes = {t: f"{p['xz_bytes'] / 2**20:.1f} MiB" for t, p in manifest["pieces"].items()}
        print(json.dumps(sizes, indent=1))
        return 0
    if args.command == "stage":
        from klalm.study.staging import stage

        print(json.dumps(stage(args.sources, args.shards), indent=1))
        return 0
    spec = load_spec(args.spec)
    if args.results is not None:
        spec = replace(spec, results=args.results)
    if args.command == "report":
        from klalm.study.report import write_report

        print(write_report(spec, args.doc))
        return 0
    if args.command == "collect":
        from klalm.study.results import collect_all

        for record in collect_all(spec, args.work):
            print(f"{record['cell']}: val loss {record['val']['loss']:.4f}")
        return 0
    from klalm.study.runner import StudyRunner, plan, read_recipe

    if args.command == "plan":
        print(plan(spec, read_recipe(spec, args.shards), args.gpus))
        return 0
    runner = StudyRunner(spec, args.shards, args.work, args.eval_data, args.gpus, args.minutes, args.commit)
    done = runner.sweep() if args.command == "sweep" else runner.train(args.models)
    print(plan(spec, runner.recipe, args.gpus))
    return 0 if done or not runner.pending(sweep=args.command == "sweep") else 1
