"""Tokenizers for the runtime: a built-in character tokenizer for the tiny models, or the HF
tokenizer shipped in a checkpoint directory.

The built-in `CharTokenizer` has 64 ids (3 specials + 61 symbols), matching the `tiny*` models of
`earl.specs.MODEL_CATALOG`. It lower-cases its input and maps unknown characters to `?`: good
enough for board games and arithmetic, not for natural language.

    python -c "from earl.runtime.tokenizer import CharTokenizer; t = CharTokenizer(); print(t.encode('1x3'))"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

CHAR_TOKENIZER_FILE = "earl_tokenizer.json"
SPECIALS = ("<pad>", "<bos>", "<eos>")
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz \n.,:;=+-*/()[]<>|?!'\"_#%"


class Tokenizer(Protocol):
    """What the engine, environments' rollouts and trainer need from a tokenizer."""

    vocab_size: int
    pad_id: int
    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class CharTokenizer:
    """One id per character of a fixed alphabet; ids 0, 1, 2 are pad, bos, eos."""

    def __init__(self, alphabet: str = ALPHABET):
        if len(set(alphabet)) != len(alphabet) or "?" not in alphabet:
            raise ValueError("CharTokenizer alphabet must have unique characters including '?'")
        self.alphabet = alphabet
        self.vocab_size = len(SPECIALS) + len(alphabet)
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self._to_id = {c: i + len(SPECIALS) for i, c in enumerate(alphabet)}
        self._unknown = self._to_id["?"]

    def encode(self, text: str) -> list[int]:
        return [self._to_id.get(c, self._unknown) for c in text.lower()]

    def decode(self, ids: list[int]) -> str:
        n = len(SPECIALS)
        return "".join(self.alphabet[i - n] for i in ids if n <= i < self.vocab_size)

    def save(self, directory: str | Path) -> None:
        Path(directory, CHAR_TOKENIZER_FILE).write_text(
            json.dumps({"kind": "earl-char", "alphabet": self.alphabet}))


class HFTokenizer:
    """Adapter over a `transformers` tokenizer loaded from a local directory (no network)."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = len(tok)
        self.eos_id = tok.eos_token_id
        self.bos_id = tok.bos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(directory: str | Path, vocab_size: int) -> Tokenizer:
    """The tokenizer of a checkpoint directory: the built-in one if saved there (or if the
    model's vocabulary is exactly the built-in one's), else the directory's HF tokenizer."""
    d = Path(directory)
    char_file = d / CHAR_TOKENIZER_FILE
    if char_file.is_file():
        try:
            meta = json.loads(char_file.read_text())
            tok = CharTokenizer(meta["alphabet"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{char_file}: not a valid earl tokenizer file ({e})") from None
    elif any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        from transformers import AutoTokenizer

        try:
            tok = HFTokenizer(AutoTokenizer.from_pretrained(str(d), local_files_only=True))
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot load the tokenizer in {d}: {str(e).splitlines()[0]}") from None
    elif vocab_size == CharTokenizer().vocab_size:
        tok = CharTokenizer()
    else:
        raise ValueError(f"no tokenizer in {d} (expected tokenizer.json or {CHAR_TOKENIZER_FILE})")
    if tok.vocab_size > vocab_size:
        raise ValueError(f"tokenizer in {d} has {tok.vocab_size} ids but the model only "
                         f"{vocab_size} embedding rows")
    return tok


class Conversation:
    """One episode's messages and the exact token ids fed to and produced by the model.

    With a tokenizer that has a chat template (an HF folder's `chat_template`), the first
    observation is rendered with `apply_chat_template` (the env's `context` messages and `tools`
    JSON schemas included) and each later observation is appended as a message: its ids are
    the template's rendering of the conversation minus the text already fed, so generated ids
    are kept as sampled and nothing is re-tokenized. `drift` counts turns where the template
    did not extend the fed text (e.g. templates that rewrite earlier turns); those turns
    append the new messages' own rendering. Without a template (the built-in character
    tokenizer) observations are plain text, the first one after BOS."""

    def __init__(self, tok: Tokenizer, *, tools: list[dict] | None = None, context: list[dict] | None = None):
        self.tok = tok
        self.tools = tools or None
        self.messages: list[dict] = [dict(m) for m in context or ()]
        self.ids: list[int] = []
        self.drift = 0
        self.chat = bool(getattr(getattr(tok, "tok", None), "chat_template", None))

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tok.tok.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                add_generation_prompt=generation_prompt)

    def observe(self, text: str, role: str = "user") -> list[int]:
        """The ids of a new observation (the first one is the prompt), appended to the episode."""
        first = not self.ids
        if not self.chat:
            ids = ([self.tok.bos_id] if first and self.tok.bos_id is not None else []) + self.tok.encode(text)
        else:
            full = self._render([*self.messages, {"role": role, "content": text}], True)
            fed = self.tok.tok.decode(self.ids, skip_special_tokens=False)
            if full.startswith(fed):
                delta = full[len(fed):]
            else:
                self.drift += 1
                prev = self._render(self.messages, False)
                delta = full[len(prev):] if full.startswith(prev) else full
            ids = self.tok.encode(delta)
        self.messages.append({"role": role, "content": text})
        self.ids.extend(ids)
        return ids

    def reply(self, ids: list[int], text: str) -> None:
        """Record what the model generated (`text`: its decoding without special tokens). With a
        template the message keeps any special tokens sampled mid-reply (all but a final EOS,
        which the template writes itself), so re-rendering gives back the same ids."""
        if self.chat:
            body = ids[:-1] if ids and ids[-1] == self.tok.eos_id else ids
            text = self.tok.tok.decode(body, skip_special_tokens=False)
        self.messages.append({"role": "assistant", "content": text})
        self.ids.extend(ids)
