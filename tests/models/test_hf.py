"""Hugging Face integration: loss, decode state, generate(), save/load, AutoModelForCausalLM after `import klalm`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

import klalm  # noqa: F401  (registers the Auto classes)
from klalm.models import ARCH_LAYOUTS, KLALMCache, KLALMConfig, KLALMForCausalLM, build_model

ARCHS = sorted(ARCH_LAYOUTS)
V = 64


def _tiny(arch: str, **overrides) -> KLALMForCausalLM:
    torch.manual_seed(0)
    return build_model(arch, preset="tiny", vocab_size=V, **overrides).double().eval()


def _ids(batch: int = 2, length: int = 9) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(3))


def test_loss_is_the_shifted_next_token_cross_entropy():
    model = _tiny("gpt")
    ids = _ids()
    labels = ids.clone()
    labels[0, 4] = -100
    out = model(ids, labels=labels)
    logits = out.logits[:, :-1].reshape(-1, V)
    expected = F.cross_entropy(logits, labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    with pytest.raises(ValueError, match="labels shape"):
        model(ids, labels=labels[:, :-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_then_decode_equals_full_forward(arch):
    model, ids = _tiny(arch), _ids()
    full = model(ids).logits
    out = model(ids[:, :4], use_cache=True)
    cache, logits = out.cache if hasattr(out, "cache") else out.past_key_values, [out.logits]
    assert isinstance(cache, KLALMCache) and cache.get_seq_length() == 4
    for t in range(4, ids.shape[1]):
        out = model(ids[:, t : t + 1], cache=cache)
        logits.append(out.logits)
    assert cache.seen_tokens == ids.shape[1]
    torch.testing.assert_close(torch.cat(logits, dim=1), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generate_is_argmax_of_full_forward(arch):
    model, prompt = _tiny(arch), _ids(batch=1, length=5)
    generated = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert generated.shape == (1, 11) and torch.equal(generated[:, :5], prompt)
    logits = model(generated).logits
    torch.testing.assert_close(logits[:, 4:-1].argmax(-1), generated[:, 5:], rtol=0, atol=0)


def test_generate_feeds_one_token_per_step():
    """After the prompt, every model call sees exactly one new token (O(1) per token for recurrent mixers)."""
    model, prompt = _tiny("kla"), _ids(batch=2, length=5)
    lengths = []
    handle = model.model.register_forward_pre_hook(lambda mod, args: lengths.append(args[0].shape[1]))
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False, pad_token_id=0)
    handle.remove()
    assert lengths == [5, 1, 1, 1]


def test_cache_arguments():
    model, ids = _tiny("gpt"), _ids()
    cache = model(ids[:, :3], use_cache=True)
    cache = cache.cache if hasattr(cache, "cache") else cache.past_key_values
    with pytest.raises(ValueError, match="not both"):
        model(ids[:, 3:4], cache=cache, past_key_values=cache)
    with pytest.raises(ValueError, match="KLALMCache"):
        model(ids[:, 3:4], cache=(torch.zeros(1),))
    with pytest.raises(ValueError, match="padded batches"):
        model(ids, attention_mask=torch.tensor([[1] * 9, [0] + [1] * 8]))
    assert model(ids, attention_mask=torch.ones_like(ids)).logits.shape == (2, 9, V)


@pytest.mark.parametrize("arch", ARCHS)
def test_save_load_round_trip_is_exact(arch, tmp_path):
    model, ids = _tiny(arch).float(), _ids()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is KLALMForCausalLM and loaded.config.layer_mixers == model.config.layer_mixers
    assert loaded.model.lm_head.weight is loaded.model.embed.weight
    torch.testing.assert_close(loaded.eval()(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_auto_config_knows_klalm(tmp_path):
    config = KLALMConfig(
        arch="gpt_kla",
        vocab_size=100,
        d_model=64,
        n_layers=3,
        kla_layers=[0],
        n_heads=4,
        mixer_options={"kla": {"block": "plain"}},
    )
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is KLALMConfig and loaded.vocab_size == 128
    assert loaded.layer_mixers == ["kla", "attention", "attention"] and loaded.mixer_options == {
        "kla": {"block": "plain"}
    }


def test_untied_round_trip(tmp_path):
    model, ids = _tiny("gpt", tie_word_embeddings=False).float(), _ids()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.model.lm_head.weight is not loaded.model.embed.weight
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_return_tuple():
    model, ids = _tiny("gpt"), _ids()
    loss, logits = model(ids, labels=ids, use_cache=False, return_dict=False)
    torch.testing.assert_close(logits, model(ids).logits)
    assert loss.ndim == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_reorder_cache_selects_batch_rows(arch):
    """Beam search support: after reorder_cache(idx), decoding continues the selected rows exactly."""
    model, ids = _tiny(arch), _ids(batch=3)
    out = model(ids[:, :5], use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    order = torch.tensor([2, 0, 0])
    cache.reorder_cache(order)
    swapped = ids[order]
    step = model(swapped[:, 5:6], cache=cache).logits
    torch.testing.assert_close(step, model(swapped[:, :6]).logits[:, 5:], rtol=1e-9, atol=1e-9)


def test_beam_search_runs():
    model, prompt = _tiny("gpt_kla"), _ids(batch=2, length=4)
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, num_beams=3, do_sample=False)
    assert out.shape == (2, 7) and torch.equal(out[:, :4], prompt)


def test_logits_to_keep():
    model, ids = _tiny("kla"), _ids()
    full = model(ids).logits
    torch.testing.assert_close(model(ids, logits_to_keep=2).logits, full[:, -2:])
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids, labels=ids, logits_to_keep=1)


def test_generate_computes_only_the_last_logits():
    model, prompt = _tiny("gpt"), _ids(batch=1, length=6)
    shapes = []
    handle = model.model.lm_head.register_forward_hook(lambda mod, args, out: shapes.append(tuple(out.shape[:2])))
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, do_sample=False)
    handle.remove()
    assert shapes == [(1, 1)] * 3
