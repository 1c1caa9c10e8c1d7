"""`klalm-generate`: sample text from a trained checkpoint (an HF export, a Lightning .ckpt or a run folder).

    klalm-generate outputs/kla_45m/2026-11-29_14-00-00_3fa2c1 --prompt "The history of the"
    klalm-generate outputs/kla_45m/2026-11-29_14-00-00_3fa2c1/hf --prompt "Paris is" --temperature 0
    klalm-generate run/checkpoints/step-00001000.ckpt --prompt-file prompt.txt --num-samples 3 --seed 7
    echo "Once upon a time" | klalm-generate outputs/smoke/2026-11-29_14-00-00_3fa2c1 --prompt-file -

Prints each sample (prompt and continuation) on stdout as it is generated (--no-stream: when it is complete);
several samples are separated by a line `--- sample <i> (seed <s>) ---`, and sample i (from 1) uses seed
--seed + i - 1. On stderr: the checkpoint's provenance once (for a run folder, whether its hf/ export or its newest
checkpoint loaded), then for each sample its prompt tokens, new tokens, seconds and tokens/s. Without --prompt or
--prompt-file a sample starts from the tokenizer's BOS token (its EOS where it has no BOS: the token that separates
the documents a model is trained on), an unconditional sample as nanoGPT's sample.py draws. --temperature 0 decodes
greedily. A sample ends after --max-new-tokens tokens or at the tokenizer's EOS; special tokens are not printed.
A sample longer than the context the checkpoint was trained on gets a note on stderr. --tokenizer names a folder:
the command is offline-first, and a hub id (a name that is not a folder) is refused.
Ctrl-C ends it with one line (exit code 130), the text printed so far kept.
"""

# The command line only (this docstring is its --help), with nothing heavier than omegaconf (klalm.config_checks):
# `--help`, usage errors and refused flag values answer before klalm.eval.generate, which does the work, and with it
# torch and transformers are imported.

from __future__ import annotations

import argparse

from klalm.config_checks import EVAL_DTYPES
from klalm.errors import refuse

PROG = "klalm-generate"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    parser.add_argument("checkpoint", help="an HF export folder, a Lightning .ckpt file or a run folder (its newest)")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="text the samples continue (default: the tokenizer's BOS/EOS token)")
    prompt.add_argument("--prompt-file", metavar="FILE", help="read the prompt from FILE ('-': stdin)")
    parser.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate per sample (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0: greedy (default 0.8)")
    parser.add_argument("--top-k", type=int, default=50, help="sample among the k most likely tokens; 0: all (50)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first sample; sample i gets seed + i - 1")
    parser.add_argument("--num-samples", type=int, default=1, help="samples to draw (default 1)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is one), cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", default="float32", choices=EVAL_DTYPES, help="weight dtype (default float32)")
    parser.add_argument(
        "--tokenizer", metavar="FOLDER", help="tokenizer folder instead of the checkpoint's own (not a hub id: offline)"
    )
    parser.add_argument("--no-stream", action="store_true", help="print each sample when it is complete")
    args = parser.parse_args(argv)
    for flag, value, least in (
        ("--max-new-tokens", args.max_new_tokens, 1),
        ("--temperature", args.temperature, 0),
        ("--top-k", args.top_k, 0),
        ("--num-samples", args.num_samples, 1),
    ):
        if not value >= least:  # (also refuses a NaN temperature)
            refuse(PROG, f"{flag} must be ≥ {least}, got {value}")
    first, last = -(2**63), 2**64 - args.num_samples  # torch's seeds; sample i uses seed + i - 1
    if not first <= args.seed <= last:
        refuse(PROG, f"--seed must be in [{first}, {last}] (torch's seed range; sample i uses seed + i - 1), "
                     f"got {args.seed}")  # fmt: skip
    return args
