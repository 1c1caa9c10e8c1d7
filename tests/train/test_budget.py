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


def test_a_resumed_run_counts_its_steps_from_what_its_checkpoint_trained():
    """A resume that doubles the token budget and the global batch (resume_allow_changes=true) trains the tokens
    left in batches of the new size; it used to take max_tokens // global_batch_tokens steps in all, which the
    resumed step had already reached, and train nothing."""
    sizes = {"micro_batch_size": 2, "seq_len": 16, "world_size": 1}
    first = derive_budget(max_tokens=10_240, global_batch_tokens=512, **sizes)
    assert first.max_steps == 20
    same = derive_budget(max_tokens=10_240, global_batch_tokens=512, steps_done=11, tokens_seen=11 * 512, **sizes)
    assert same.max_steps == first.max_steps  # an unchanged resume: the same step count
    more = derive_budget(max_tokens=20_480, global_batch_tokens=1024, steps_done=20, tokens_seen=10_240, **sizes)
    assert (more.max_steps, more.accumulate) == (30, 32)  # 10 more steps of 1024 tokens
    less = derive_budget(max_tokens=4096, global_batch_tokens=512, steps_done=20, tokens_seen=10_240, **sizes)
    assert less.max_steps == 20  # past a smaller budget already: no step left


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
