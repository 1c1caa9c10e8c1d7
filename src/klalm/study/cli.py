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
from typing import NoReturn

from klalm.errors import one_line, refuse
from klalm.study.results import RUN_FILE
from klalm.study.spec import DEFAULT_SPEC, Spec, load_spec
from klalm.study.staging import INDEX_FILE, SPLITS, TOKENIZER_DIR, pack, stage

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


def _refuse(message: str) -> NoReturn:
    """One line on stderr and exit status 1, before anything is written."""
    refuse("klalm-study", message)


def _check_folder(flag: str, path: Path) -> None:
    """A flag that names a folder: a file there is refused (whether the folder must exist is the caller's check)."""
    if path.exists() and not path.is_dir():
        _refuse(f"{flag} {path} is a file, expected a folder")


def _check_pack(shards: Path, out: Path) -> None:
    for needed in (shards / TOKENIZER_DIR, *(shards / split / INDEX_FILE for split in SPLITS)):
        if not needed.exists():
            _refuse(f"--shards {shards}: {needed} does not exist (klalm-prepare-data makes the shard folder)")
    _check_folder("--out", out)


def _check_block(args: argparse.Namespace, spec: Spec) -> None:
    """plan, sweep and train: positive GPUs and minutes, staged shards, and (train) evaluation data and models."""
    if args.gpus < 1:
        _refuse(f"--gpus must be at least 1, got {args.gpus}")
    if args.command != "plan" and not args.minutes > 0:  # also NaN
        _refuse(f"--minutes must be a positive number, got {args.minutes}")
    _check_folder("--results", spec.results)
    if not spec.results.is_dir():  # a mistyped folder would show every finished cell as pending, and retrain it
        _refuse(f"results folder {spec.results} does not exist (a new study: mkdir -p {spec.results})")
    index = args.shards / "train" / INDEX_FILE
    if not index.is_file():
        _refuse(f"--shards: {index} does not exist: stage the shards first (klalm-study stage --from <pieces> "
                f"--shards {args.shards}; klalm-prepare-data then klalm-study pack make the pieces)")  # fmt: skip
    if args.command != "train":
        return
    from klalm.eval.tasks import get_local_task, resolve_files  # klalm.eval imports torch: only train pays for it

    if not args.eval_data.is_dir():
        tasks = ", ".join(spec.eval["tasks"])
        _refuse(f"--eval-data folder {args.eval_data} does not exist (the data of the zero-shot tasks {tasks})")
    for task in spec.eval["tasks"]:  # the files klalm-eval will read: a wrong folder fails before training
        try:
            local = get_local_task(task)
        except KeyError as err:
            _refuse(f"study {spec.name} eval.tasks: {one_line(err)}")
        try:
            resolve_files(local, args.eval_data)
        except (KeyError, FileNotFoundError) as err:
            _refuse(f"--eval-data {args.eval_data}: {one_line(err)}")
    unknown = [m for m in args.models or [] if m not in spec.models]
    if unknown:
        _refuse(f"--models: {', '.join(unknown)} not in study {spec.name} (its models: {', '.join(spec.models)})")


def _check_report(spec: Spec, doc: Path) -> None:
    """The document with its markers, a results folder with finished cells and the cost section's bench rows."""
    from klalm.markdown import fill_sections
    from klalm.study.report import PLOT, SECTIONS
    from klalm.study.results import finished

    if doc.is_dir():
        _refuse(f"--doc {doc} is a folder, expected the Markdown document")
    if not doc.is_file():
        _refuse(f"--doc {doc} does not exist")
    _check_folder(f"--doc {doc}: the plot's folder", (doc.parent / PLOT).parent)
    try:
        fill_sections(doc.read_text(encoding="utf-8"), dict.fromkeys(SECTIONS, ""), "study")
    except ValueError as err:  # a marker is missing
        _refuse(f"--doc {doc}: {err}")
    if not spec.results.is_dir():
        _refuse(f"results folder {spec.results} does not exist")
    try:
        done = finished(spec, sweep=False) or finished(spec, sweep=True)
    except ValueError as err:  # a run.json that does not parse
        _refuse(str(err))
    if not done:
        _refuse(f"results folder {spec.results} holds no finished cell (no runs/*/{RUN_FILE} or sweep/*/{RUN_FILE})")
    for path in map(Path, spec.cost["bench_rows"]):
        if not path.is_file():
            _refuse(f"study cost.bench_rows: {path} does not exist (run from the repository root)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    if args.command == "pack":
        _check_pack(args.shards, args.out)
        try:
            manifest = pack(args.shards, args.out)
        except (OSError, ValueError) as err:  # an index that does not parse or lists a missing file; --out not made
            _refuse(f"pack: {err}")
        sizes = {t: f"{p['xz_bytes'] / 2**20:.1f} MiB" for t, p in manifest["pieces"].items()}
        print(json.dumps(sizes, indent=1))
        return 0
    if args.command == "stage":
        _check_folder("--shards", args.shards)
        try:
            staged = stage(args.sources, args.shards)
        except (OSError, ValueError) as err:  # no manifest, a split or tokenizer missing, a bad checksum, unwritable
            _refuse(f"stage: {err}")
        print(json.dumps(staged, indent=1))
        return 0
    try:
        spec = load_spec(args.spec)
    except (FileNotFoundError, ValueError) as err:  # no such spec, or one that fails its checks
        _refuse(f"--spec: {err}")
    if args.results is not None:
        spec = replace(spec, results=args.results)
    if args.command == "report":
        from klalm.study.report import write_report

        _check_report(spec, args.doc)
        try:
            print(write_report(spec, args.doc))
        except ValueError as err:  # an eval.json that does not parse (found before the doc is written)
            _refuse(str(err))
        return 0
    if args.command == "collect":
        from klalm.study.results import collect_all

        _check_folder("--work", args.work)
        if not args.work.is_dir():
            _refuse(f"--work folder {args.work} does not exist")
        if not (args.work / "sweep").is_dir() and not (args.work / "runs").is_dir():
            _refuse(f"--work folder {args.work} holds neither sweep/ nor runs/ (the runner's run folders)")
        try:
            records = collect_all(spec, args.work)
        except (FileNotFoundError, ValueError) as err:  # a run folder lacking a file or holding one that does not parse
            _refuse(f"collect: {err}")
        for record in records:
            print(f"{record['cell']}: val loss {record['val']['loss']:.4f}")
        return 0
    from klalm.study.runner import StudyRunner, plan, read_recipe

    _check_block(args, spec)
    try:  # an index.json or run.json that does not parse, or staged shards that make no whole global batch
        recipe = read_recipe(spec, args.shards)
        table = plan(spec, recipe, args.gpus)
    except ValueError as err:
        _refuse(str(err))
    if args.command == "plan":
        print(table)
        return 0
    runner = StudyRunner(spec, recipe, args.shards, args.work, args.eval_data, args.gpus, args.minutes, args.commit)
    done = runner.sweep() if args.command == "sweep" else runner.train(args.models)
    print(plan(spec, runner.recipe, args.gpus))
    return 0 if done or not runner.pending(sweep=args.command == "sweep") else 1
