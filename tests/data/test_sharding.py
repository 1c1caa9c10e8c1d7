"""2 ranks x 2 workers on the real enwiki shards: every token exactly once, in the oracle's order."""

from __future__ import annotations

import itertools

import pytest
import torch

from klalm.data import PackedTextDataset, ResumableLoader, build_source

from .conftest import oracle_windows, read_texts

SEQ_LEN, DOCS = 31, 12  # windows of 32 tokens; the first 12 records of shard 9 (record 4 is an empty article)


def _rank_windows(source, tokenizer, rank: int, world_size: int, workers: int) -> list[tuple]:
    dataset = PackedTextDataset(
        source,
        tokenizer,
        seq_len=SEQ_LEN,
        batch_size=1,
        rank=rank,
        world_size=world_size,
        loop=False,
        block_docs=4,
        on_bad_record="skip",
    )
    loader = ResumableLoader(dataset, batch_size=None, num_workers=workers)
    windows = []
    for batch in loader:
        window = torch.cat([batch["input_ids"][0], batch["labels"][0, -1:]])  # [T+1]
        assert torch.equal(batch["labels"][0, :-1], batch["input_ids"][0, 1:])
        windows.append(tuple(window.tolist()))
    return windows


def _round_robin(lists: list[list]) -> list:
    out = []
    for group in itertools.zip_longest(*lists):
        out.extend(w for w in group if w is not None)
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_two_ranks_cover_the_stream_without_overlap_or_loss(enwiki, gpt2, workers):
    files = sorted(enwiki.glob("enwiki-00009-*.jsonl.gz"))
    source = build_source({"kind": "files", "paths": [str(f) for f in files], "max_documents": DOCS})
    texts = read_texts(files, DOCS)
    world, per_rank = 2, max(workers, 1)
    consumers = world * per_rank
    width = SEQ_LEN + 1
    expected = [oracle_windows(gpt2, texts, c, consumers, width) for c in range(consumers)]
    got_all = []
    for rank in range(world):
        got = _rank_windows(source, gpt2, rank, world, workers)
        # a rank's workers are consumers rank*W .. rank*W+W-1, interleaved batch by batch by the DataLoader
        assert got == _round_robin(expected[rank * per_rank : (rank + 1) * per_rank])
        got_all += got
    oracle_tokens = sum(len(gpt2.encode(t, add_special_tokens=False)) + 1 for t in texts if t is not None)
    covered = len(got_all) * width
    assert oracle_tokens - consumers * width < covered <= oracle_tokens  # only each consumer's < T+1 tail is left
