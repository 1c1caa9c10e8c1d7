"""Console scripts: one function per command, each importing the code that does the work only when it runs.

`klalm-train` and `klalm-eval` are Hydra apps over `pkg://klalm.configs`. They compose the config, answer `--help`
and `--cfg job`, and check every value (`klalm.config_checks`) with nothing heavier than omegaconf loaded; torch,
Lightning and lm-eval are imported when the run starts. A bad value ends the command with one line naming the key.

The argparse commands answer `--help` and usage errors before torch is imported too: `klalm-params` and
`klalm-lm-eval` (lm-eval's own parser) parse here, `klalm-generate`, `klalm-prepare-data` and `klalm-synthetic` in
`klalm.cli.generate_args`, `klalm.cli.prepare_data_args` and `klalm.cli.synthetic_args` (whose docstrings are their
help), `klalm-study` in `klalm.study.cli`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import re
import select
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import klalm.cli.helptext  # noqa: F401  (registers the ${klalm_help:...} resolver of the help templates)
from klalm.config_checks import (
    ConfigError,
    check_eval_config,
    check_overrides,
    check_run_dir,
    check_train_config,
    override_syntax_message,
    sweep_value_message,
    unknown_key_message,
)
from klalm.errors import in_command_terms, one_line, refuse

CONFIG_PATH = "pkg://klalm.configs"
PRINT_TASKS_PATH = "--print-tasks-path"  # klalm-eval's one flag outside Hydra


@hydra.main(config_path=CONFIG_PATH, config_name="train", version_base="1.3")
def _train_app(cfg: DictConfig) -> float | None:
    started = time.time()
    try:
        check_train_config(cfg)  # before torch and Lightning are imported
        check_run_dir(cfg, HydraConfig.get().runtime.output_dir)
    except ConfigError as err:
        _refuse_run(err, started)
    from klalm.train.app import USER_ERRORS, run

    try:
        with _stopped_by_a_closed_stdout():
            return run(cfg).get("val_loss")  # what a sweeper that optimises would read
    except (ConfigError, *USER_ERRORS) as err:
        _refuse_run(err, started)


def _refuse_run(err: BaseException, started: float) -> NoReturn:
    """Ends a `klalm-train` refused for its input with one line on stderr (HYDRA_FULL_ERROR=1: the traceback).

    What this start wrote and nothing else used is removed (`klalm.train.rundir.discard_unused_run_dir`); where the
    run's folder stays, its train.log gets the line and the traceback. In a sweep the job fails instead, as any
    failing job does (the line in its log, the traceback from Hydra), and the sweep goes on to the next one; a value
    `check_train_config` refuses never gets that far in a sweep (`klalm.train.sweep.check_sweep_jobs` checks every
    job before the first starts), so this is for what is found once a job runs (missing data, the token budget).
    """
    from klalm.train.rundir import discard_unused_run_dir, in_sweep

    message = in_command_terms(one_line(err), "data.on_bad_record=skip")
    log = logging.getLogger("klalm.train.app")
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    if in_sweep():
        log.error("refused: %s", message)
        raise err
    if not discard_unused_run_dir(since=started):
        exc_info = (type(err), err, err.__traceback__)
        record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "stopped: %s", (message,), exc_info)
        for handler in logging.getLogger().handlers:  # the traceback for the run's log only, not the console
            if isinstance(handler, logging.FileHandler):
                handler.handle(record)
    sys.exit(f"klalm-train: {message}")


@hydra.main(config_path=CONFIG_PATH, config_name="eval", version_base="1.3")
def _eval_app(cfg: DictConfig) -> None:
    try:
        check_eval_config(cfg)
    except ConfigError as err:
        _refuse_eval(err)
    from klalm.eval.app import run
    from klalm.eval.report import markdown_table
    from klalm.models.checkpoint import CheckpointError
    from klalm.models.export import ExportIntegrityError

    with _stopped_by_a_closed_stdout():
        try:
            report = run(cfg)
        except (ConfigError, FileNotFoundError, CheckpointError, ExportIntegrityError) as err:  # unusable input
            _refuse_eval(err)
        print(markdown_table(report))


EVAL_STARTUP_FILES = frozenset({".hydra", "eval.log"})  # what Hydra writes into an evaluation's folder at its start


def _refuse_eval(err: BaseException) -> NoReturn:
    """Ends a `klalm-eval` refused for its input with one line on stderr, removing its run folder when this process
    created it (`outputs/eval/<fresh name>`, or an output_dir that did not exist; not a `hydra.run.dir` given) and it
    holds only what Hydra wrote at the start: a refusal leaves no empty evaluation behind."""
    from klalm.train.rundir import is_new_folder, remove_run_folder

    hydra = HydraConfig.get()
    run_dir = Path(hydra.runtime.output_dir)
    if is_new_folder(run_dir) and run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= EVAL_STARTUP_FILES:
        remove_run_folder(run_dir)
    elif hydra.output_subdir:  # an output_dir that was there: this start's config record goes (its log lines stay)
        shutil.rmtree(run_dir / hydra.output_subdir, ignore_errors=True)
    sys.exit(f"klalm-eval: {one_line(err)}")


def quiet_when_the_reader_stops(command: Callable[[], None]) -> Callable[[], None]:
    """A console script that prints to stdout, made to stop quietly with exit code 1, as Unix tools do, when its reader
    closes the pipe early (`klalm-params | head -1`), instead of a BrokenPipeError traceback, or an "Exception ignored"
    when Python flushes stdout at exit. A BrokenPipeError from any other pipe (a subprocess's, a socket) is raised as
    it is, and a message the command was exiting with still reaches stderr."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        exiting = None
        try:
            command(*args, **kwargs)
        except SystemExit as exit_:
            exiting = exit_
        except BrokenPipeError:
            if not _reader_gone():
                raise
            _exit_quietly(None)
        try:
            if sys.stdout is not None:  # (None where the command was started with stdout closed)
                sys.stdout.flush()  # also before sys.exit: a closed pipe raises here, not at interpreter exit
        except BrokenPipeError:  # the flush writes only to stdout
            _exit_quietly(exiting)
        except OSError:
            if exiting is None:
                raise
        if exiting is not None:
            raise exiting

    return run


class ConsoleHandler(logging.StreamHandler):
    """The console handler of `klalm-train`'s and `klalm-eval`'s logs (Hydra's `job_logging`, set in
    configs/hydra/default.yaml and configs/eval.yaml): once stdout's reader has closed the pipe
    (`klalm-train ... | head`), the command ends quietly with exit code 1, as `quiet_when_the_reader_stops` ends the
    others, instead of printing a "--- Logging error ---" traceback on stderr for every later line."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError) and self.stream is sys.stdout and _reader_gone():
            _stop_for_a_closed_stdout()
        super().handleError(record)


@contextlib.contextmanager
def _stopped_by_a_closed_stdout() -> Iterator[None]:
    """Inside a Hydra app, whose errors Hydra reports with a traceback: a write into stdout after its reader has gone
    (the progress bar, the results table) ends the command as `ConsoleHandler` does."""
    try:
        yield
    except BrokenPipeError:
        if not _reader_gone():
            raise
        _stop_for_a_closed_stdout()


def _stop_for_a_closed_stdout() -> NoReturn:
    """Exit code 1, quietly, with a line in the run's log file saying why it stopped."""
    record = logging.LogRecord(__name__, logging.WARNING, __file__, 0, "stopped: stdout's reader closed it", None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
    _exit_quietly(None)


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error or a hang-up on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (stdout replaced or closed), or no poll here
        return False


def _exit_quietly(exiting: SystemExit | None) -> NoReturn:
    """Exit status 1, stdout pointed at /dev/null so that nothing more is written into the closed pipe at exit, and
    the message a refusal was exiting with on stderr."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if exiting is not None and isinstance(exiting.code, str):
        print(exiting.code, file=sys.stderr)
    sys.exit(1)


def check_hydra_flags(arguments: list[str]) -> None:
    """Refuses a command line with two of Hydra's commands (`-m ... --cfg job`): Hydra raises a ValueError for it, a
    traceback ending in "Only one of --run, --multirun, --cfg, --info and --shell_completion can be specified"."""
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(arguments)
    given = [
        flag
        for flag, on in (("--run", args.run), ("--multirun", args.multirun), ("--cfg", args.cfg is not None))
        + (("--info", args.info is not None), ("--shell-completion", args.shell_completion))
        if on
    ]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} cannot be given together: Hydra takes one of them per command")


@quiet_when_the_reader_stops
def train() -> None:
    """`klalm-train`: pretrain a model (`klalm-train --help` lists the groups and keys)."""
    from klalm.train.sweep import unknown_sweep_key_message

    try:
        check_hydra_flags(sys.argv[1:])
        check_overrides(sys.argv[1:])
    except ConfigError as err:
        sys.exit(f"klalm-train: {err}")
    message = unknown_sweep_key_message(sys.argv[1:])
    if message is not None:
        sys.exit(f"klalm-train: {message}")
    _train_app()


@quiet_when_the_reader_stops
def evaluate() -> None:
    """`klalm-eval`: zero-shot lm-eval of checkpoints; `klalm-eval --print-tasks-path` prints the local task folder."""
    if sys.argv[1:] == [PRINT_TASKS_PATH]:
        from klalm.eval.tasks import TASKS_DIR

        print(TASKS_DIR)
        return
    try:
        check_hydra_flags(sys.argv[1:])
    except ConfigError as err:
        sys.exit(f"klalm-eval: {err}")
    arguments = sys.argv[1:]
    message = (
        override_syntax_message(arguments) or sweep_value_message(arguments) or unknown_key_message("eval", arguments)
    )
    if message is not None:
        sys.exit(f"klalm-eval: {message}")
    _eval_app()


@quiet_when_the_reader_stops
def params(argv: list[str] | None = None) -> None:
    """`klalm-params`: exact parameter count of model presets for a vocabulary size."""
    parser = argparse.ArgumentParser(
        prog="klalm-params",
        description="Print `<preset> <exact parameter count>` for every model preset (or the named ones), with the "
        "embedding sized for a vocabulary (padded to a multiple of 64; tied embeddings counted once).",
    )
    parser.add_argument("--preset", nargs="+", metavar="NAME", help="only these presets, e.g. kla_45m gpt_45m")
    parser.add_argument(
        "--vocab-size", type=int, help="tokenizer vocabulary (default: GPT-2 BPE's, which the presets are sized for)"
    )
    args = parser.parse_args(argv)
    if args.vocab_size is not None and args.vocab_size < 1:
        parser.error(f"--vocab-size must be ≥ 1, got {args.vocab_size}")
    from klalm.models.params import print_table

    try:
        print_table(args.preset, args.vocab_size)
    except KeyError as err:
        parser.error(err.args[0])


@quiet_when_the_reader_stops
def lm_eval() -> None:
    """`klalm-lm-eval`: the lm-eval CLI with klalm's model classes registered.

    lm-eval's own parser answers `--help` and usage errors before klalm.eval (torch, transformers) is imported, naming
    the command klalm-lm-eval where it says lm-eval.
    """
    try:
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging
    except ImportError:  # an lm-eval without the `run` subcommand CLI: run it unchecked
        from lm_eval.__main__ import cli_evaluate

        cli_evaluate()
        return
    setup_logging()
    parser = HarnessCLI()
    _name_klalm_lm_eval(parser)
    args = _parse_lm_eval_args(parser)
    from klalm.eval.harness import cli_main

    cli_main(parser, args)


def _name_klalm_lm_eval(cli: Any) -> None:
    """lm-eval's parser and its subcommands' name their command `lm-eval` (the usage line, the examples of `--help`,
    usage errors such as `lm-eval run: error: ...`): `klalm-lm-eval` instead, which takes the same arguments."""
    main = getattr(cli, "_parser", None)
    if not isinstance(main, argparse.ArgumentParser):  # (a CLI laid out otherwise: left as lm-eval names it)
        return
    for parser in (main, *getattr(cli, "_subparsers", argparse.Namespace(choices={})).choices.values()):
        parser.prog = _klalm_named(parser.prog)
        for name in ("usage", "description", "epilog"):
            setattr(parser, name, _klalm_named(getattr(parser, name)))
        for action in parser._actions:
            action.help = _klalm_named(action.help)


def _klalm_named(text: str | None) -> str | None:
    return text if text is None else re.sub(r"(?<![\w-])lm-eval(?![\w-])", "klalm-lm-eval", text)


def _parse_lm_eval_args(parser: Any) -> argparse.Namespace:
    """lm-eval's JSON-valued options (`--metadata`, `--model_args`, ...) raise a ValueError from inside argparse,
    which argparse does not turn into a usage error: one line naming the option (the `argparse.Action` that raised)."""
    try:
        return parser.parse_args()
    except ValueError as err:
        actions = [frame.f_locals.get("self") for frame, _ in traceback.walk_tb(err.__traceback__)]
        flags = [act.option_strings[0] for act in actions if isinstance(act, argparse.Action) and act.option_strings]
        prefix = f"{flags[-1]}: " if flags else ""  # the innermost: the subcommand's action calls the option's
        sys.exit(f"klalm-lm-eval: {prefix}{one_line(err)}")


@quiet_when_the_reader_stops
def synthetic(argv: list[str] | None = None) -> None:
    """`klalm-synthetic`: run the synthetic benchmarks (A5, MQAR, MAD) block by block; report tables and plots.

    `merge` and `pack` only move files and `positions` and `curves` only read them, in `klalm.tasks.folders`, which
    imports no torch; the other verbs are `klalm.tasks.runner`'s."""
    from klalm.cli.synthetic_args import parse_args

    args = parse_args(argv)
    from klalm.tasks import folders

    logging.basicConfig(level=logging.INFO, format="[synthetic %(asctime)s] %(message)s", datefmt="%H:%M:%S")
    if args.verb in folders.VERBS:
        folders.run(args)
        return
    from klalm.tasks.runner import run

    run(args)


@quiet_when_the_reader_stops
def prepare_data(argv: list[str] | None = None) -> None:
    """`klalm-prepare-data`: pre-tokenise a data config's splits into memory-mapped token shards."""
    from klalm.cli.prepare_data_args import parse_args

    args = parse_args(argv)
    from klalm.data.prepare import run

    run(args)


@quiet_when_the_reader_stops
def generate(argv: list[str] | None = None) -> None:
    """`klalm-generate`: sample text from a checkpoint (HF export, Lightning .ckpt or run folder) to stdout; Ctrl-C
    ends it with one line and exit status 130, the samples printed so far kept."""
    from klalm.cli.generate_args import PROG, parse_args

    args = parse_args(argv)
    try:
        from klalm.eval.generate import run

        run(args)
    except KeyboardInterrupt:
        refuse(PROG, "interrupted", status=130)


@quiet_when_the_reader_stops
def study() -> None:
    """`klalm-study`: the pretraining study (pack, stage, plan, sweep, train, collect, report) in blocks of GPU time."""
    from klalm.study.cli import main

    sys.exit(main())
