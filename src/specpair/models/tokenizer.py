"""The tiny pair's tokenizer: a WordLevel vocabulary built locally, no download.

Tokens: four specials (<unk> 0, <s> 1, </s> 2, <pad> 3), a few punctuation
marks, then pronounceable pseudo-words (CV, CVC and CVCV syllable patterns) in
a fixed order, up to ``VOCAB_SIZE``. Text is split on whitespace and
punctuation (``Whitespace`` pre-tokenizer); encoding prepends <s>.

Saved as ``tokenizer.json`` + ``tokenizer_config.json`` (+
``special_tokens_map.json``) so that transformers' AutoTokenizer and vLLM load
it offline as a ``PreTrainedTokenizerFast``. ``tokenizer_config.json`` carries
a chat template (``CHAT_TEMPLATE``: vLLM's /v1/chat/completions refuses a
tokenizer without one); being in that file, it is part of the fingerprint.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

__all__ = [
    "VOCAB_SIZE", "SPECIALS", "TOKENIZER_FILES", "CHAT_TEMPLATE", "vocabulary", "build", "save",
    "write", "fingerprint",
]

VOCAB_SIZE = 512  # a multiple of 64, so vLLM's vocabulary padding is a no-op
SPECIALS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}  # ids 0..3 in this order
_PUNCT = [".", ",", "?", "!", ";", ":"]
_CONS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
# Files that make up the tokenizer; the HELLO fingerprint hashes exactly these.
TOKENIZER_FILES = ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")
# Chat template (Jinja, as transformers and vLLM render it): <s>, then per message
# "ROLE : CONTENT </s>", then "assistant :" when a reply is wanted. Role names are not in the
# vocabulary (they encode as <unk>); the tiny pair is a test model, not a chat model.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }} : {{ message['content'] }} {{ eos_token }} "
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


def _words() -> itertools.chain[str]:
    cv = [c + v for c in _CONS for v in _VOWELS]  # 70
    cvc = [s + c for s in cv for c in "lmnrst"]  # 420
    cvcv = [a + b for a in cv for b in cv]  # 4900
    return itertools.chain(cv, cvc, cvcv)


def vocabulary(size: int = VOCAB_SIZE) -> dict[str, int]:
    """token -> id for the first ``size`` tokens (specials, punctuation, words)."""
    head = list(SPECIALS.values()) + _PUNCT
    if size <= len(head):
        raise ValueError(f"vocabulary size must exceed {len(head)}, got {size}")
    toks = head + list(itertools.islice(_words(), size - len(head)))
    if len(toks) != size:
        raise ValueError(f"vocabulary size {size} exceeds the {len(toks)} words available")
    return {t: i for i, t in enumerate(toks)}


def build(size: int = VOCAB_SIZE) -> Tokenizer:
    """The WordLevel tokenizer over ``vocabulary(size)``."""
    tok = Tokenizer(models.WordLevel(vocabulary(size), unk_token=SPECIALS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    bos = SPECIALS["bos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, 1)])
    tok.add_special_tokens(list(SPECIALS.values()))
    return tok


def save(directory: Path, size: int = VOCAB_SIZE, max_length: int = 2048) -> None:
    """Write the tiny pair's tokenizer files into ``directory`` (which must exist)."""
    write(build(size), directory, max_length, CHAT_TEMPLATE)


def write(tok: Tokenizer, directory: Path, max_length: int, chat_template: str) -> None:
    """Write ``tok`` as a Hugging Face fast tokenizer (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json) with SPECIALS and ``chat_template``: the one writer of both pairs'
    tokenizer files."""
    tok.save(str(directory / "tokenizer.json"))
    special = {f"{k}_token": v for k, v in SPECIALS.items()}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": chat_template,
        **special,
    }
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        (directory / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def fingerprint(directory: Path) -> bytes:
    """32-byte sha256 over the tokenizer files of a model directory.

    Hashes, for each name of ``TOKENIZER_FILES`` present (in that order): the
    name, a NUL, the file's length as 8 little-endian bytes, then its bytes.
    Two directories with identical tokenizer files have the same fingerprint.
    """
    h = hashlib.sha256()
    found = 0
    for name in TOKENIZER_FILES:
        path = Path(directory) / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        found += 1
    if not found:
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {directory}")
    return h.digest()
