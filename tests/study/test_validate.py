"""klalm.study.validate: every window of a shard split scored once, equal to a direct per-window computation."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from klalm.data.shards import TokenShards
from klalm.models import build_model
from klalm.study.validate import main, window_batches
from tests.study.conftest import SEQ_LEN


def test_window_batches_cover_every_window_once(shard_folder):
    tokens = TokenShards(shard_folder / "train")
    windows = len(tokens) // (SEQ_LEN + 1)
    batches = list(window_batches(tokens, SEQ_LEN, batch_size=7))
    assert sum(len(b["input_ids"]) for b in batches) == windows
    assert len(batches[-1]["input_ids"]) == (windows % 7 or 7)
    ids = torch.cat([torch.cat([b["input_ids"], b["labels"][:, -1:]], 1) for b in batches])  # [N, T+1]
    expected = torch.from_numpy(tokens.read(0, windows * (SEQ_LEN + 1)).reshape(windows, SEQ_LEN + 1))
    assert torch.equal(ids, expected)


def test_validate_equals_the_loss_computed_window_by_window(shard_folder, tmp_path, shared_data):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(shared_data / "gpt2_tokenizer")
    torch.manual_seed(0)
    model = build_model("gpt", preset="tiny", vocab_size=len(tokenizer))
    model.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    out = tmp_path / "val.json"
    main(["--checkpoint", str(tmp_path / "hf"), "--shards", str(shard_folder / "val"), "--seq-len", str(SEQ_LEN),
          "--batch-size", "3", "--out", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    tokens = TokenShards(shard_folder / "val")
    windows = len(tokens) // (SEQ_LEN + 1)
    nll, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for k in range(windows):
            window = torch.from_numpy(tokens.read(k * (SEQ_LEN + 1), SEQ_LEN + 1))[None]  # [1, T+1]
            logits = model(input_ids=window[:, :-1]).logits
            nll += F.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
            count += SEQ_LEN
    assert result["windows"] == windows and result["tokens"] == count
    assert abs(result["loss"] - nll / count) < 1e-5
