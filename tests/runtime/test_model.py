"""Model loading: a tiny HF checkpoint written to a temp dir and loaded back through the real
path; bad model paths fail with one clear ValueError."""

import pytest
import torch

from earl.runtime.hf_model import BUILTIN_MODELS, load_policy, save_hf
from earl.runtime.tokenizer import CharTokenizer


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_hf_checkpoint_round_trip(tmp_path, name):
    pol = load_policy(name, seed=3)
    save_hf(pol, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "config.json").is_file()
    assert list((tmp_path / "ckpt").glob("*.safetensors"))
    back = load_policy(str(tmp_path / "ckpt"))
    assert back.spec.num_layers == pol.spec.num_layers and back.spec.vocab_size == 64
    assert isinstance(back.tokenizer, CharTokenizer)
    ids = torch.tensor([back.tokenizer.encode("123|4x6|789\n")])
    with torch.no_grad():
        assert torch.allclose(pol.model(input_ids=ids).logits, back.model(input_ids=ids).logits)


def test_builtin_init_is_seeded():
    a, b, c = load_policy("tiny", seed=1), load_policy("tiny", seed=1), load_policy("tiny", seed=2)
    pa, pb, pc = (next(p.model.parameters()) for p in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert "tiny" in BUILTIN_MODELS


def test_bad_model_paths(tmp_path):
    with pytest.raises(ValueError, match="neither a built-in"):
        load_policy(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load_policy(str(tmp_path / "empty"))
    pol = load_policy("tiny")
    save_hf(pol, tmp_path / "noweights")
    for f in (tmp_path / "noweights").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_policy(str(tmp_path / "noweights"))
    save_hf(pol, tmp_path / "broken")
    for f in (tmp_path / "broken").glob("*.safetensors"):
        f.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot load"):
        load_policy(str(tmp_path / "broken"))


def test_char_tokenizer_round_trip():
    tok = CharTokenizer()
    text = "tic-tac-toe x\n1x3|4o6|789\nq: 12*(3+4)\nans 84\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 64 and max(tok.encode(text)) < 64
    assert tok.decode(tok.encode("A~")) == "a?"  # lower-cased; unknown -> '?'
