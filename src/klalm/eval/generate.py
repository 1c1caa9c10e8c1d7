"""The work of `klalm-generate`: sample text from a trained checkpoint (an HF export, a Lightning .ckpt or a run
folder). `klalm.cli.generate_args` parses its command line, and its docstring is the command's help, before this
module (and with it torch and transformers) is imported; `run` carries out the parsed arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import torch

from klalm.config_checks import ConfigError
from klalm.data.tokenizer import encode_texts
from klalm.errors import one_line, refuse
from klalm.eval.checkpoint import check_checkpoint, checkpoint_kind, load_checkpoint
from klalm.models.checkpoint import HF_DIR, CheckpointError, load_checkpoint_file, newest_valid
from klalm.models.export import ExportIntegrityError
from klalm.models.sampling import sample_ids

PROG = "klalm-generate"
# How the samples are decoded, streamed or not: special tokens (the BOS / EOS a sample starts or ends with) left out,
# the text otherwise exactly as the tokens spell it (no whitespace clean-up).
DECODE = {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}
# A tokenizer's model_max_length at or above this is transformers' placeholder for "unknown", not a context length.
UNKNOWN_LENGTH = 10**9


def _fail(message: str) -> NoReturn:
    refuse(PROG, message)


def read_prompt(args: argparse.Namespace) -> str | None:
    """The prompt text of --prompt or --prompt-file (its one trailing newline dropped); None: neither given.

    Refuses (one line) an unreadable or empty prompt file, an empty --prompt and a prompt that is not UTF-8 (Python
    hands on such bytes of the command line and of stdin as lone surrogates, which no tokenizer takes).
    """
    if args.prompt is not None:
        if not args.prompt:
            _fail("--prompt is empty (leave it out for an unconditional sample)")
        return _utf8(args.prompt, "--prompt")
    if args.prompt_file is None:
        return None
    source = "stdin" if args.prompt_file == "-" else args.prompt_file
    try:
        if args.prompt_file == "-":
            text = sys.stdin.read()
        else:
            text = Path(args.prompt_file).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        _fail(f"--prompt-file {source}: cannot be read: {one_line(err)}")
    text = text.removesuffix("\n")  # the newline an editor or `echo` ends the file with
    if not text:
        _fail(f"--prompt-file {source} is empty")
    return _utf8(text, f"--prompt-file {source}")


def _utf8(text: str, flag: str) -> str:
    """`text`, refused (one line naming `flag`) where it holds bytes that are not UTF-8 (as surrogate escapes)."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeError as err:
        _fail(f"{flag} is not UTF-8 text: {one_line(err)}")


def prompt_ids(tokenizer: Any, prompt: str | None, flag: str) -> list[int]:
    """The prompt's token ids, encoded as the training data was (`encode_texts`: no special tokens added); without a
    prompt the tokenizer's BOS token, else its EOS."""
    if prompt is None:
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if start is None:
            _fail("the tokenizer has neither a BOS nor an EOS token to start an unconditional sample: pass --prompt")
        return [start]
    ids = encode_texts(tokenizer, [prompt])[0]
    if not ids:
        _fail(f"{flag}: {prompt[:40]!r} encodes to no token (encoded as the training data was, no special tokens)")
    return ids


def check_device(device: str) -> None:
    """Refuses (one line) a --device that torch cannot use here, before any weights load: one torch cannot parse, a
    type other than cpu, cuda and mps, `cuda` / `cuda:N` beyond the GPUs torch sees, `mps` without the MPS backend.
    "auto" (CUDA when there is one, else the CPU) always passes."""
    if device == "auto":
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as err:
        _fail(f"--device {device}: not a device torch knows ({one_line(err)}); use auto, cpu, cuda, cuda:N or mps")
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            _fail(f"--device {device}: torch sees no CUDA GPU here; use --device auto or cpu")
        if parsed.index is not None and parsed.index >= count:
            _fail(f"--device {device}: torch sees {count} CUDA GPU(s) here, cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps":
        if not torch.backends.mps.is_available():
            _fail(f"--device {device}: torch's MPS backend (Apple GPU) is not available here; use --device auto or cpu")
    elif parsed.type != "cpu":
        _fail(f"--device {device}: {PROG} runs on cpu, cuda or mps, not {parsed.type}; use --device auto or cpu")


def check_tokenizer_folder(tokenizer: str | None) -> None:
    """Refuses (one line) a --tokenizer that is not an existing folder, before any weights load: klalm-generate is
    offline-first, so a bare name is a mistyped folder, never a hub id to download."""
    if tokenizer is None:
        return
    path = Path(tokenizer).expanduser()
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such folder"
        _fail(
            f"--tokenizer {tokenizer!r}: {what} (name a tokenizer folder, e.g. a run's hf/ or tokenizer/; "
            "hub ids are not accepted)"
        )


def resolve_source(path: Path) -> tuple[Path, str]:
    """What `load_checkpoint` is given for the checkpoint argument, checked as `check_checkpoint` checks it, and how
    the provenance line labels it: an HF export, a Lightning checkpoint, or for a run folder what of it loads (its
    hf/ export when that has config.json, else its newest valid checkpoint, as `klalm.models.checkpoint.load_model`
    picks them; that checkpoint is verified once here and then loaded by its own path).

    Raises:
        FileNotFoundError, CheckpointError, ExportIntegrityError: as `check_checkpoint`.
    """
    if checkpoint_kind(path) == "hf_export":
        check_checkpoint(path)
        return path, "HF export"
    if path.is_file():
        check_checkpoint(path)
        return path, "Lightning checkpoint"
    if (path / HF_DIR / "config.json").is_file():
        check_checkpoint(path)
        return path, f"run folder, its {HF_DIR}/ export"
    latest, skipped = newest_valid([path])
    for reason in skipped:
        print(f"{PROG}: note: skipped {reason}", file=sys.stderr, flush=True)
    if latest is None:
        check_checkpoint(path)  # raises, naming the skipped checkpoints
    return latest, f"run folder, its newest valid checkpoint {latest.relative_to(path)}"


def trained_context(source: Path) -> int | None:
    """The context length the model was trained on, from the checkpoint itself (not from a --tokenizer's or the run's
    `tokenizer/`, which carries the hub tokenizer's value): an export's saved `model_max_length` (save_export writes
    the run's data.seq_len there), a Lightning checkpoint's saved hyper-parameters `data.seq_len` (its tensors mapped,
    not read). None where it cannot be known: an export without a tokenizer or with transformers' placeholder, a
    checkpoint without the hyper-parameters (or unreadable)."""
    export = source / HF_DIR if (source / HF_DIR / "config.json").is_file() else source
    if export.is_dir():
        try:
            value = json.loads((export / "tokenizer_config.json").read_text(encoding="utf-8")).get("model_max_length")
        except (OSError, ValueError, AttributeError):
            return None
    else:
        try:
            checkpoint = load_checkpoint_file(source, mmap=True)
        except CheckpointError:
            return None
        value = _entry(checkpoint, "hyper_parameters", "data", "seq_len")  # klalm-train's save_hyperparameters(cfg)
        if value is None:  # (it also records it among the settings a resume must keep)
            value = _entry(checkpoint, "klalm", "resume_settings", "data.seq_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < UNKNOWN_LENGTH else None


def _entry(tree: Any, *keys: str) -> Any:
    """tree[keys[0]][keys[1]]...; None where a level is missing or not a dict."""
    for key in keys:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def _describe(path: Path, label: str, provenance: dict[str, Any]) -> str:
    return (
        f"{PROG}: {path.resolve()} ({label}): {provenance['arch']}, "
        f"{provenance['n_params']:,} parameters, on {provenance['device']} in {provenance['dtype']}"
    )


def run(args: argparse.Namespace) -> None:
    """`klalm-generate` with its arguments parsed (`klalm.cli.generate_args.parse_args`, which refuses bad flag values).

    Bad input ends it with one line on stderr (exit code 1): --device, --tokenizer, the prompt and the checkpoint's
    files are checked before any weights load; a tokenizer that does not fit the model and a prompt that encodes to no
    token once they have loaded. Ctrl-C raises KeyboardInterrupt once the line a streamed sample stopped in is ended.
    """
    prompt = read_prompt(args)
    check_device(args.device)
    check_tokenizer_folder(args.tokenizer)
    path = Path(args.checkpoint).expanduser()
    try:
        source, label = resolve_source(path)
        loaded = load_checkpoint(source, tokenizer=args.tokenizer, device=args.device, dtype=args.dtype)
    except (FileNotFoundError, CheckpointError, ExportIntegrityError, ConfigError) as err:
        # (load_checkpoint is klalm-eval's: its messages spell the flag tokenizer=)
        message = one_line(err).replace("tokenizer=FOLDER", "--tokenizer FOLDER")
        if args.tokenizer is not None:
            message = message.replace(f"tokenizer={args.tokenizer} ", f"--tokenizer {args.tokenizer} ", 1)
        _fail(message)
    model, tokenizer = loaded.model, loaded.tokenizer
    ids = prompt_ids(tokenizer, prompt, "--prompt" if args.prompt is not None else f"--prompt-file {args.prompt_file}")
    # No length is refused: the klalm configs have no max_position_embeddings, attention's RoPE table is computed for
    # any position (klalm.models.mixers.attention.rope_table) and its KV cache grows, and the recurrent mixers keep a
    # fixed-size state. Past the context the model was trained on its text degrades, which is said, not refused.
    total, context = len(ids) + args.max_new_tokens, trained_context(source)
    print(_describe(path, label, loaded.provenance), file=sys.stderr, flush=True)
    if context is not None and total > context:
        print(
            f"{PROG}: note: {len(ids)} prompt tokens + --max-new-tokens {args.max_new_tokens} = {total} tokens, beyond "
            f"the {context}-token context the checkpoint was trained on: positions past it were not trained",
            file=sys.stderr,
            flush=True,
        )
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # [1, T0]
    for index in range(args.num_samples):
        seed = args.seed + index
        if args.num_samples > 1:
            print(f"--- sample {index + 1} (seed {seed}) ---", flush=True)
        streamer = None if args.no_stream else _text_streamer(tokenizer)
        started = time.perf_counter()
        try:
            out = sample_ids(
                model,
                input_ids,
                max_new_tokens=args.max_new_tokens,
                temperature=args.temperature,
                top_k=args.top_k,
                seed=seed,
                eos_token_id=tokenizer.eos_token_id,
                streamer=streamer,
            )
        except KeyboardInterrupt:
            if streamer is not None:  # end the line the streamed text stopped in
                print(flush=True)
            raise
        seconds = time.perf_counter() - started
        text = tokenizer.decode(out[0].tolist(), **DECODE)
        if streamer is None:
            print(text, flush=True)
        new = out.shape[1] - len(ids)
        ended = ", ended at EOS" if new and out[0, -1].item() == tokenizer.eos_token_id else ""
        print(
            f"{PROG}: sample {index + 1} (seed {seed}): {len(ids)} prompt tokens, {new} new tokens{ended}, "
            f"{seconds:.2f} s, {new / seconds:,.1f} tokens/s",
            file=sys.stderr,
            flush=True,
        )


def _text_streamer(tokenizer: Any) -> Any:
    """transformers' `TextStreamer`: prints the prompt, then the text as the tokens come (a word at a time: it holds
    back text that may still change, such as half a multi-byte character), flushed as it goes, and a newline at the
    end; what it prints is what `tokenizer.decode(ids, **DECODE)` gives."""
    from transformers import TextStreamer

    return TextStreamer(tokenizer, skip_prompt=False, **DECODE)
