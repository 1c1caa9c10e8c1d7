"""Token budget → accumulation and steps."""

import pytest

from klalm.train.budget import derive_budget


def test_accumulation_and_steps_are_derived_from_tokens():
    budget = derive_budget(
        max_tokens=1_000_000, global_batch_tokens=65_536, micro_batch_size=4, seq_len=2048, world_size=2
    )
    assert budget.accumulate == 4  # 65536 / (4 · 2048 · 2)
    assert budget.max_steps == 15  # 1e6 // 65536
    assert budget.tokens_per_step == 65_536
    assert budget.max_tokens == 15 * 65_536


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"global_batch_tokens": 1000}, "train.global_batch_tokens"),  # not a multiple of 4·16·1 = 64
        ({"max_tokens": 32}, "train.max_tokens"),  # less than one global batch
        ({"micro_batch_size": 0}, "data.batch_size"),
        ({"seq_len": -1}, "data.seq_len"),
    ],
)
def test_bad_budgets_name_the_key(kwargs, key):
    args = {"max_tokens": 1024, "global_batch_tokens": 128, "micro_batch_size": 4, "seq_len": 16, "world_size": 1}
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        derive_budget(**{**args, **kwargs})
