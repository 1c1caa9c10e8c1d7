"""Self-contained exports: model code and auto_map, special-token ids, model_max_length, the SHA256SUMS manifest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from klalm.data.tokenizer import train_bpe_tokenizer
from klalm.models import build_model
from klalm.models.checkpoint import load_model
from klalm.models.export import MANIFEST, ExportIntegrityError, save_export, verify_export

VOCAB = 300


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = [f"document {i}: the filter predicts, then updates its precision." for i in range(200)]
    return train_bpe_tokenizer(texts, VOCAB, tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def export(tmp_path_factory, tokenizer) -> Path:
    torch.manual_seed(0)
    model = build_model("gpt_kla", preset="tiny", vocab_size=len(tokenizer), mixer_options={"kla": {"d_state": 4}})
    return save_export(model.eval(), tmp_path_factory.mktemp("export") / "hf", tokenizer, max_length=48)


def test_export_carries_code_ids_max_length_and_manifest(export, tokenizer):
    config = json.loads((export / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "config.KLALMConfig", "AutoModelForCausalLM": "hf.KLALMForCausalLM"}
    assert (export / "config.py").is_file() and (export / "hf.py").is_file()
    eos = tokenizer.eos_token_id
    generation = json.loads((export / "generation_config.json").read_text())
    for saved in (config, generation):
        assert (saved["eos_token_id"], saved["bos_token_id"], saved["pad_token_id"]) == (eos, eos, eos)
    tokenizer_config = json.loads((export / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == 48 and tokenizer_config["pad_token"] == "<|endoftext|>"
    assert tokenizer.pad_token is None and tokenizer.model_max_length > 1e20  # the caller's tokenizer is untouched
    listed = [line.split("  ", 1)[1] for line in (export / MANIFEST).read_text().splitlines()]
    assert listed == sorted(p.name for p in export.iterdir() if p.name != MANIFEST)
    assert {"model.safetensors", "config.json", "hf.py", "tokenizer.json"} <= set(listed)
    assert verify_export(export)


def test_a_changed_file_is_refused_naming_it(export, tmp_path):
    copy = tmp_path / "hf"
    copy.mkdir()
    for path in export.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    weights.write_bytes(bytes(data))
    with pytest.raises(ExportIntegrityError, match=r"model\.safetensors: sha256 differs from SHA256SUMS"):
        verify_export(copy)
    with pytest.raises(ExportIntegrityError, match=r"model\.safetensors"):
        load_model(copy)
    (copy / "model.safetensors").unlink()
    with pytest.raises(ExportIntegrityError, match=r"model\.safetensors: listed in SHA256SUMS but missing"):
        verify_export(copy)


def test_a_folder_without_manifest_loads_with_a_warning(export, tmp_path, caplog):
    copy = tmp_path / "hf"
    copy.mkdir()
    for path in export.iterdir():
        if path.name != MANIFEST:
            (copy / path.name).write_bytes(path.read_bytes())
    assert verify_export(copy) is False
    assert "has no SHA256SUMS" in caplog.text
    model, _ = load_model(copy)
    assert model.config.arch == "gpt_kla"


def test_fresh_python_loads_the_export_without_importing_klalm(export, tmp_path):
    """from_pretrained(trust_remote_code=True) in a new interpreter whose own code never imports klalm."""
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    model, _ = load_model(export)
    with torch.no_grad():
        torch.save({"ids": ids, "logits": model(ids).logits}, tmp_path / "reference.pt")
    script = textwrap.dedent(f"""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        path = {str(export)!r}
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        reference = torch.load({str(tmp_path / "reference.pt")!r})
        with torch.no_grad():
            assert torch.equal(model(reference["ids"]).logits, reference["logits"])
            out = model.generate(reference["ids"], max_new_tokens=3, do_sample=False)
        assert out.shape == (1, 15), out.shape
        print(type(model).__module__, tokenizer.model_max_length, model.generation_config.pad_token_id)
    """)
    env = {"HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    module, max_length, pad = proc.stdout.split()[-3:]
    assert module.startswith("transformers_modules.") and module.endswith(".hf")  # the code in the export folder
    assert (int(max_length), int(pad)) == (48, 0)
