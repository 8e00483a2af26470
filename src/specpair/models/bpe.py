"""The trained pair's tokenizer: a byte-level BPE trained locally on the corpus's train split.

Specials first (<unk> 0, <s> 1, </s> 2, <pad> 3; vLLM reads bos/eos from them), then the 256
byte symbols, then the merges, up to ``vocab_size``. Every byte string encodes (no <unk> in
practice); encoding prepends <s>. Saved as ``tokenizer.json`` + ``tokenizer_config.json`` +
``special_tokens_map.json`` (the files ``specpair.models.tokenizer.fingerprint`` hashes), with a
chat template (``CHAT_TEMPLATE``) so vLLM serves ``/v1/chat/completions``.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from specpair.models.tokenizer import SPECIALS, write

__all__ = ["CHAT_TEMPLATE", "train", "save"]

# A code model, not a chat model: each message becomes a Python comment line, and the reply
# is asked for after "# assistant:".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "# {{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}# assistant:{% endif %}"
)


def train(texts: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` tokens over ``texts`` (in order)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer, length=len(texts))
    bos = SPECIALS["bos"]
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                      special_tokens=[(bos, tok.token_to_id(bos))]),
    ])
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"the corpus yields {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def save(tok: Tokenizer, directory: Path, max_length: int) -> None:
    """Write the tokenizer files into ``directory`` (which must exist)."""
    write(tok, directory, max_length, CHAT_TEMPLATE)
