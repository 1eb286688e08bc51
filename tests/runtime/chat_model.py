"""Builds a tiny HF chat model folder for tests, without downloads: a byte-level BPE tokenizer
over ASCII (no merges, so any id sequence re-encodes to itself) with Qwen's special tokens and
a Qwen2.5-style chat template (tools in the system prompt, <tool_call> / <tool_response>), and
a randomly initialised Qwen2 model whose vocabulary is larger than the tokenizer's (as in real
Qwen checkpoints)."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call functions. Tools:\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
    "Answer a call as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n"
    "{% elif messages[0].role != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_chat_model(directory: str | Path, *, model_vocab: int = 192, seed: int = 0, hidden_size: int = 64,
                     heads: int = 4, kv_heads: int = 2) -> Path:
    """The folder `directory` holding the tokenizer and the model (`heads` attention heads of
    hidden_size / heads; vLLM's CPU attention needs a head dim >= 32: e.g. `heads=2, kv_heads=1`)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    enc = dict(enumerate(_bytes_to_unicode()))
    assert set(enc.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    vocab = {enc[b]: b for b in range(128)}  # ASCII only: 128 ids, then the specials
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = TEMPLATE
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(d))
    cfg = AutoConfig.for_model("qwen2", vocab_size=model_vocab, hidden_size=hidden_size,
                               intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=heads,
                               num_key_value_heads=kv_heads,
                               max_position_embeddings=4096, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(str(d), safe_serialization=True)
    return d


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character map, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]
