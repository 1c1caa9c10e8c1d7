"""Progress-sample generation: greedy decoding is the argmax chain; sampling is seeded and leaves global RNGs alone."""

import torch

from klalm.models import build_model
from klalm.models.sampling import sample_ids


def test_greedy_sampling_follows_the_argmax():
    torch.manual_seed(0)
    model = build_model("gpt", preset="tiny", vocab_size=64).eval()
    prompt = torch.tensor([[1, 2, 3]])
    out = sample_ids(model, prompt, max_new_tokens=5, temperature=0)
    ids = prompt
    for _ in range(5):
        ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_sampling_is_seeded_restricted_to_top_k_and_keeps_global_rng():
    torch.manual_seed(0)
    model = build_model("gpt", preset="tiny", vocab_size=64).eval()
    prompt = torch.tensor([[5]])
    state = torch.get_rng_state()
    a = sample_ids(model, prompt, max_new_tokens=8, temperature=1.0, top_k=1, seed=3)
    b = sample_ids(model, prompt, max_new_tokens=8, temperature=1.0, top_k=0, seed=3)
    c = sample_ids(model, prompt, max_new_tokens=8, temperature=1.0, top_k=0, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, sample_ids(model, prompt, max_new_tokens=8, temperature=0))  # top-1 = greedy
    assert torch.equal(b, c)


def test_a_tiny_temperature_samples_greedily_instead_of_failing():
    """Scores over a temperature that small overflowed (1e-38) or divided by a float32 0 (1e-50, 1e-320): NaN
    probabilities, and torch.multinomial's RuntimeError. Now a tiny temperature decodes greedily, its limit."""
    torch.manual_seed(0)
    model = build_model("gpt", preset="tiny", vocab_size=64).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(100)  # logits large enough to overflow over 1e-38
    prompt = torch.tensor([[1, 2, 3]])
    greedy = sample_ids(model, prompt, max_new_tokens=5, temperature=0)
    for temperature in (1e-38, 1e-50, 1e-320):
        assert torch.equal(sample_ids(model, prompt, max_new_tokens=5, temperature=temperature, seed=1), greedy)


def test_sampling_decodes_through_generate_with_the_cache():
    """After the prompt, every new token is a one-token forward: generate() with the model's cache, not a re-run."""
    torch.manual_seed(0)
    model = build_model("kla", preset="tiny", vocab_size=64).eval()
    lengths = []
    model.model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    out = sample_ids(model, torch.tensor([[1, 2, 3]]), max_new_tokens=5, temperature=0.8, seed=1)
    assert out.shape == (1, 8) and lengths == [3, 1, 1, 1, 1]


def test_sampling_stops_at_eos():
    torch.manual_seed(0)
    model = build_model("gpt", preset="tiny", vocab_size=64).eval()
    greedy = sample_ids(model, torch.tensor([[1, 2]]), max_new_tokens=6, temperature=0)
    first = int(greedy[0, 2])
    stopped = sample_ids(model, torch.tensor([[1, 2]]), max_new_tokens=6, temperature=0, eos_token_id=first)
    assert stopped.tolist() == [[1, 2, first]]


def test_a_diverged_model_ends_the_sample_instead_of_the_run():
    """Non-finite weights (a diverging KLA model's scan input check would raise on the CPU) stop the sample early."""
    torch.manual_seed(0)
    model = build_model("kla", preset="tiny", vocab_size=64).eval()
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    prompt = torch.tensor([[5, 6]])
    assert torch.equal(sample_ids(model, prompt, max_new_tokens=4, temperature=1.0), prompt)
