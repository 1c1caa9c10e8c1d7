"""Fixtures for the evaluation tests: the GPT-2 tokenizer and tiny klalm checkpoints exported with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TRAIN_STEPS = 10  # a few AdamW steps on Shakespeare, so the model is "trained" (not uniform) but the fixture fast
TRAIN_BATCH, TRAIN_LEN = 4, 32


@pytest.fixture(scope="session")
def gpt2_tokenizer(shared_data: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(shared_data / "gpt2_tokenizer")


def _train_a_little(model: torch.nn.Module, text: str, tokenizer, steps: int) -> None:
    ids = torch.tensor(tokenizer(text[:20_000]).input_ids)
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - TRAIN_LEN - 1, (TRAIN_BATCH,), generator=gen)
        window = torch.stack([ids[s : s + TRAIN_LEN + 1] for s in starts.tolist()])  # [B, T+1]
        logits = model(input_ids=window[:, :-1]).logits  # [B, T, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, shared_data: Path, gpt2_tokenizer) -> tuple[Path, Path]:
    """Two HF exports of the tiny klalm GPT preset with the GPT-2 tokenizer: (trained a few steps, untrained)."""
    from klalm.models import build_model
    from klalm.models.export import save_export

    root = tmp_path_factory.mktemp("ckpts")
    text = (shared_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    paths = []
    for name, steps in (("trained", TRAIN_STEPS), ("untrained", 0)):
        torch.manual_seed(0)
        model = build_model("gpt", preset="tiny", vocab_size=len(gpt2_tokenizer))
        _train_a_little(model, text, gpt2_tokenizer, steps)
        paths.append(save_export(model, root / name / "export", gpt2_tokenizer))
    return paths[0], paths[1]
