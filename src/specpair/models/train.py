"""`specpair models train-pair`: train the embedded target + draft pair, deterministically.

One corpus (``specpair.models.corpus``), one byte-level BPE (``specpair.models.bpe``), two
``LlamaForCausalLM`` models trained from scratch on the same token stream: a target and a much
smaller draft. Everything is fixed: the preset's numbers, the seeds, the number of torch
threads (``TrainConfig.threads``), deterministic algorithms, and the data order (the train
stream is cut into blocks of ``seq_len + 1`` tokens, visited in a permutation drawn per epoch
from a generator seeded with ``seed + epoch``). The same preset on the same corpus, torch,
thread count and CPU (``specpair.models.platform``, recorded in ``pair.json``) gives
bit-identical files; ``--check`` compares them with the pinned hashes in
``PINNED_DIR/pair.json`` and names both platforms when they differ.

The target is grown from the trained draft (``_grown``): the two share width, heads and MLP
width, so the target starts as the draft's embeddings, first layers and final norm, with its
other layers' residual writes (``o_proj``, ``down_proj``) zero: at step 0 it computes exactly
the draft's law, and its training adds depth to a model that already reads the corpus. (A
14-layer target trained from scratch on the same loaded box reached a held-out-scale train
loss of only 6.3 nats in the wall time the draft needed to reach 4.6.)

Held-out metrics (written into ``pair.json``): each model's mean cross-entropy (nats/token)
over non-overlapping ``seq_len`` windows of the held-out stream, and two acceptance estimates
of drafting the target with the draft: the mean over positions of sum_x min(p(x), q(x)) (the
acceptance probability of one sampled draft token at temperature 1) and the rate at which
the two argmaxes agree (greedy drafting at temperature 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from specpair.models import bpe, corpus, platform

__all__ = ["ModelShape", "TrainConfig", "PRESETS", "PINNED_DIR", "train_pair", "check_pinned",
           "file_hashes", "token_stream", "evaluate"]

PINNED_DIR = Path(__file__).resolve().parents[3] / "models" / "trained"  # the committed pair


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int  # head_dim = hidden / heads (vLLM's CPU attention takes 32, 64, 80 and up)
    intermediate: int
    steps: int  # optimizer steps
    lr: float  # peak learning rate (linear warm-up, cosine decay to a tenth)


@dataclass(frozen=True)
class TrainConfig:
    target: ModelShape
    draft: ModelShape
    vocab_size: int = 4096
    seq_len: int = 128
    batch: int = 16
    warmup: int = 10
    weight_decay: float = 0.1
    seed: int = 0
    threads: int = 1  # one thread: on a shared 2-core box, two spin-wait each other
    max_positions: int = 1024
    eval_tokens: int = 32768  # held-out tokens the metrics cover (at most)
    max_files: int = 0  # 0: the whole corpus; else its first files of each split (smoke runs)


PRESETS = {
    "full": TrainConfig(target=ModelShape(128, 24, 4, 384, steps=600, lr=3e-3),
                        draft=ModelShape(128, 1, 4, 384, steps=600, lr=5e-3)),
    # Seconds, for the determinism test: not a useful model.
    "smoke": TrainConfig(target=ModelShape(64, 3, 2, 128, steps=4, lr=3e-3),
                         draft=ModelShape(64, 1, 2, 128, steps=3, lr=3e-3),
                         vocab_size=512, seq_len=32, batch=4, warmup=2, eval_tokens=256,
                         max_files=4),
}


def llama_config(cfg: TrainConfig, shape: ModelShape) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
        head_dim=shape.hidden // shape.heads, intermediate_size=shape.intermediate,
        max_position_embeddings=cfg.max_positions, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, dtype="float32",
        architectures=["LlamaForCausalLM"])


def token_stream(tok, texts: list[str]) -> torch.Tensor:
    """Each text as <s> ... </s>, concatenated in order (the train and the held-out stream)."""
    eos = tok.token_to_id("</s>")
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def _batches(stream: torch.Tensor, cfg: TrainConfig, steps: int) -> Iterator[torch.Tensor]:
    n = (stream.numel() - 1) // cfg.seq_len
    if n < cfg.batch:
        raise ValueError(f"the train stream has {n} blocks, fewer than one batch ({cfg.batch})")
    starts = torch.arange(n) * cfg.seq_len
    offsets = torch.arange(cfg.seq_len + 1)
    epoch, order = 0, torch.empty(0, dtype=torch.long)
    for _ in range(steps):
        if order.numel() < cfg.batch:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed + epoch))
            epoch += 1
        pick, order = order[:cfg.batch], order[cfg.batch:]
        yield stream[starts[pick, None] + offsets]


def _lr(shape: ModelShape, warmup: int, step: int) -> float:
    if step < warmup:
        return shape.lr * (step + 1) / warmup
    t = (step - warmup) / max(1, shape.steps - warmup)
    return shape.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def _grown(cfg: TrainConfig, shape: ModelShape, draft: LlamaForCausalLM, seed: int):
    """A ``shape`` model computing ``draft``'s law: the draft's tensors where names match, the
    other layers seeded with their residual writes zeroed."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(cfg, shape))
    src = draft.state_dict()
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name in src:
                t.copy_(src[name])
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                t.zero_()
    return model


def _train_model(cfg: TrainConfig, model: LlamaForCausalLM, shape: ModelShape,
                 stream: torch.Tensor, name: str, log) -> tuple[LlamaForCausalLM, float]:
    model.config.use_cache = False
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=shape.lr, betas=(0.9, 0.95), eps=1e-8)
    t0, recent = time.monotonic(), []
    for step, batch in enumerate(_batches(stream, cfg, shape.steps)):
        for group in opt.param_groups:
            group["lr"] = _lr(shape, cfg.warmup, step)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        recent = (recent + [loss.item()])[-20:]
        if (step + 1) % 25 == 0 or step + 1 == shape.steps:
            log(f"{name}: step {step + 1}/{shape.steps} loss {sum(recent) / len(recent):.3f} "
                f"({time.monotonic() - t0:.0f} s)")
    model.eval()
    model.config.use_cache = True
    return model, sum(recent) / len(recent)


@torch.no_grad()
def evaluate(cfg: TrainConfig, target, draft, stream: torch.Tensor) -> dict:
    n = min((stream.numel() - 1) // cfg.seq_len, max(1, cfg.eval_tokens // cfg.seq_len))
    ce_t = ce_d = overlap = agree = 0.0
    count = 0
    for i in range(0, n, cfg.batch):
        idx = torch.arange(i, min(n, i + cfg.batch))[:, None] * cfg.seq_len
        block = stream[idx + torch.arange(cfg.seq_len + 1)]
        x, y = block[:, :-1], block[:, 1:].reshape(-1)
        lt = target(input_ids=x).logits.reshape(-1, cfg.vocab_size).double()
        ld = draft(input_ids=x).logits.reshape(-1, cfg.vocab_size).double()
        ce_t += F.cross_entropy(lt, y, reduction="sum").item()
        ce_d += F.cross_entropy(ld, y, reduction="sum").item()
        overlap += torch.minimum(lt.softmax(-1), ld.softmax(-1)).sum().item()
        agree += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
        count += y.numel()
    r = lambda v: round(v, 4)  # noqa: E731
    return {"heldout_tokens": count,
            "target_loss": r(ce_t / count), "target_ppl": r(math.exp(ce_t / count)),
            "draft_loss": r(ce_d / count), "draft_ppl": r(math.exp(ce_d / count)),
            "accept_t1_sum_min_pq": r(overlap / count), "argmax_agreement_t0": r(agree / count)}


def _write_model(directory: Path, model: LlamaForCausalLM, tok, cfg: TrainConfig) -> None:
    directory.mkdir(parents=True)
    config = model.config.to_dict()
    for key in ("transformers_version", "_name_or_path", "output_attentions"):
        config.pop(key, None)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    (directory / "generation_config.json").write_text(
        json.dumps(gen, indent=2, sort_keys=True) + "\n")
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight"}  # tied to model.embed_tokens.weight
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "model.safetensors").chmod(0o644)
    bpe.save(tok, directory, cfg.max_positions)


def file_hashes(out: Path) -> dict[str, str]:
    """sha256 of every file of OUT/target and OUT/draft, by relative path."""
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for sub in ("target", "draft") for p in sorted((Path(out) / sub).iterdir())}


@contextlib.contextmanager
def _pinned_torch(threads: int):
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


def train_pair(out: Path, preset: str = "full", *, force: bool = False,
               pinned_corpus: dict | None = None, log=None) -> dict:
    """Train the pair of ``preset`` into OUT/target and OUT/draft; returns pair.json's dict.

    With ``pinned_corpus`` the host's corpus must be exactly it (CorpusMismatch, exit 3);
    nothing is written before that check.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    cfg = PRESETS[preset]
    out = Path(out)
    for sub in ("target", "draft", "pair.json", "corpus.json"):
        if (out / sub).exists() and not force:
            raise FileExistsError(f"{out / sub} exists (pass --force to overwrite)")
    files = corpus.check(pinned_corpus) if pinned_corpus is not None else corpus.scan()
    if cfg.max_files:
        files = ([f for f in files if f.split == "train"][:cfg.max_files]
                 + [f for f in files if f.split == "heldout"][:cfg.max_files])
    t0 = time.monotonic()
    with _pinned_torch(cfg.threads):
        tok = bpe.train(corpus.texts(files, "train"), cfg.vocab_size)
        train_stream = token_stream(tok, corpus.texts(files, "train"))
        held_stream = token_stream(tok, corpus.texts(files, "heldout"))
        log(f"corpus: {len(files)} files, {train_stream.numel()} train tokens, "
            f"{held_stream.numel()} held-out tokens")
        torch.manual_seed(cfg.seed + 1)
        draft, draft_train = _train_model(
            cfg, LlamaForCausalLM(llama_config(cfg, cfg.draft)), cfg.draft, train_stream,
            "draft", log)
        target, target_train = _train_model(
            cfg, _grown(cfg, cfg.target, draft, cfg.seed), cfg.target, train_stream, "target",
            log)
        metrics = evaluate(cfg, target, draft, held_stream)
        metrics |= {"target_train_loss": round(target_train, 4),
                    "draft_train_loss": round(draft_train, 4),
                    "target_params": sum(p.numel() for p in target.parameters()),
                    "draft_params": sum(p.numel() for p in draft.parameters())}
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".train-pair-", dir=out))  # nothing half-written
        try:
            _write_model(staging / "target", target, tok, cfg)
            _write_model(staging / "draft", draft, tok, cfg)
            pair = {"preset": preset, "config": dataclasses.asdict(cfg),
                    "torch": torch.__version__, "platform": list(platform.host()),
                    "metrics": metrics,
                    "sha256": file_hashes(staging)}
            (staging / "corpus.json").write_text(
                json.dumps(corpus.manifest(files), indent=1) + "\n")
            (staging / "pair.json").write_text(json.dumps(pair, indent=2, sort_keys=True) + "\n")
            for sub in ("target", "draft", "pair.json", "corpus.json"):
                if (out / sub).is_dir():
                    shutil.rmtree(out / sub)
                (staging / sub).replace(out / sub)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log(f"trained in {time.monotonic() - t0:.0f} s: {json.dumps(metrics)}")
    return pair


def check_pinned(out: Path, pinned: dict) -> str | None:
    """None if OUT's files hash as ``pinned`` says, else a line naming the first mismatch."""
    have = file_hashes(out)
    for name, digest in sorted(pinned["sha256"].items()):
        if have.get(name) != digest:
            got = have.get(name, "missing")[:16]
            return f"{name}: sha256 {got}..., pinned {digest[:16]}...{_platform_note(pinned)}"
    extra = sorted(set(have) - set(pinned["sha256"]))
    return f"{extra[0]}: not in the pinned pair" if extra else None


def _platform_note(pinned: dict) -> str:
    """Why bits may differ: the pinned pair's platform, where it is not this host's."""
    here, there = list(platform.host()), pinned.get("platform")
    if there is None or there == here:
        return ""
    return (f" (pinned on {' / '.join(there)}, this is {' / '.join(here)}: float kernels "
            "round differently across CPUs, so the pins reproduce only on their platform)")
