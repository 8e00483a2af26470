"""python -m bench.replay [--pair DIR] [--prompts N] [--tokens T] [--bootstrap B] [--out DIR]

Sampled vs greedy drafting on the trained pair's own distributions over the HELD-OUT corpus
(text neither model trained on, so that the acceptance is not flattered). N prompts, each a
window of ``PROMPT_LEN`` tokens of the held-out stream (docs/models.md; windows drawn
without overlap, seeded), are continued by the target at T = 1 and at T = 1 with top-p 0.9
(``specpair.replay.record``); each setting's
recording is written to OUT/replay-<setting>.safetensors (``specpair replay FILE --depth K``
replays it) and replayed at depths 1..``DEPTH`` with seeded bootstrap 95 % intervals; then
the sampled drafts again at depth ``TOP_K_DEPTH`` with q cut to the drafter's own top k
(``specpair drafter serve --draft-top-k``, k in ``DRAFT_TOP_KS``): what that truncation
costs in acceptance. Prints the tables and writes OUT/replay.json. Exit 0 done; 3 cannot
run here (this interpreter's stdlib is not the pair's corpus); 4 bad input (docs/cli.md's
codes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from specpair.cli import Parser
from specpair.errors import CannotRun
from specpair.models import corpus
from specpair.models.train import PINNED_DIR, token_stream
from specpair.replay.compute import acceptance, expected_accepted, replay
from specpair.replay.format import save_recording
from specpair.replay.record import record_from_models

DEPTH = 5  # recorded depth; depths 1..DEPTH are replayed from the same recording
PROMPT_LEN = 64  # prompt + tokens stay within the 128-token windows the pair was trained on
SETTINGS = {"t1": (1.0, 1.0), "t1-topp0.9": (1.0, 0.9)}  # name: (temperature, top_p)
DRAFT_TOP_KS = (0, 64, 256)  # the drafter's --draft-top-k replayed (0: untruncated, the default)
TOP_K_DEPTH = 3  # the depth bench-live's speculative rows run
SEED_CARD = "+10.2 % accepted tokens per round, sampled over greedy, depth 5 (seed card)"
_RANGES = {"prompts": (1, 4096), "tokens": (DEPTH + 1, 128 - PROMPT_LEN),
           "bootstrap": (100, 100_000)}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="python -m bench.replay", description=__doc__.split("\n\n")[1])
    p.add_argument("--pair", type=Path, default=PINNED_DIR,
                   help="model pair directory with target/ and draft/ (default: the trained "
                        "pair); its corpus.json, else the trained pair's, names the held-out "
                        "files")
    p.add_argument("--prompts", type=int, default=128, help="held-out windows (default 128)")
    p.add_argument("--tokens", type=int, default=60,
                   help="tokens sampled from the target per prompt (default 60)")
    p.add_argument("--bootstrap", type=int, default=10_000, help="resamples (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="prompt, sampling and bootstrap seed")
    p.add_argument("--out", type=Path, default=Path("build/bench"))
    a = p.parse_args(argv)
    for name, (lo, hi) in _RANGES.items():
        if not lo <= getattr(a, name) <= hi:
            p.error(f"--{name} must lie in {lo}..{hi}, got {getattr(a, name)}")
    if not 0 <= a.seed < 2**32:
        p.error(f"--seed must lie in 0..{2**32 - 1}, got {a.seed}")
    for role in ("target", "draft"):
        if not (a.pair / role / "tokenizer.json").is_file():
            p.error(f"--pair {str(a.pair)[:200]!r} has no {role}/tokenizer.json")
    return a


def heldout_prompts(tokenizer_json: Path, texts: list[str], n: int, seed: int,
                    length: int = PROMPT_LEN) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompts [n, length], their offsets [n]) drawn from the held-out token stream.

    The stream is the held-out files as the pair was evaluated on them (each ``<s> ... </s>``,
    in corpus order); it is cut into windows of ``length`` and ``n`` distinct windows are
    drawn with a generator seeded ``seed``.
    """
    from tokenizers import Tokenizer

    stream = token_stream(Tokenizer.from_file(str(tokenizer_json)), texts)
    windows = stream.numel() // length
    if n > windows:
        raise ValueError(f"{n} prompts asked, the held-out stream has {windows} windows of "
                         f"{length} tokens")
    pick = torch.randperm(windows, generator=torch.Generator().manual_seed(seed))[:n]
    offsets = pick * length
    return stream[offsets[:, None] + torch.arange(length)], offsets


def measure(pair: Path, prompt_ids: torch.Tensor, tokens: int, bootstrap: int, seed: int,
            out: Path, log=lambda msg: None) -> tuple[list[dict], list[dict]]:
    """(one row per setting x depth, one per setting x DRAFT_TOP_KS: ``truncated``); each
    setting's recording is written under ``out``."""
    rows, truncated = [], []
    out.mkdir(parents=True, exist_ok=True)
    for name, (temperature, top_p) in SETTINGS.items():
        t0 = time.monotonic()
        rec = record_from_models(pair / "target", pair / "draft", prompt_ids=prompt_ids,
                                 tokens=tokens, depth=DEPTH, temperature=temperature,
                                 top_p=top_p, seed=seed)
        path = out / f"replay-{name}.safetensors"
        save_recording(path, rec)
        log(f"bench-replay: {name}: {rec.rounds} rounds recorded to {path} in "
            f"{time.monotonic() - t0:.0f} s")
        for depth in range(1, DEPTH + 1):
            r = replay(rec, depth, bootstrap, seed)
            rows.append({"setting": name, "temperature": temperature, "top_p": top_p,
                         "depth": depth, "rounds": r.rounds, "recording": str(path),
                         "accepted": dataclasses.asdict(r.accepted),
                         "committed": dataclasses.asdict(r.committed),
                         "alpha_greedy": r.alpha_greedy, "alpha_sampled": r.alpha_sampled})
        for k in DRAFT_TOP_KS:
            _, a = acceptance(rec, TOP_K_DEPTH, k)
            truncated.append({"setting": name, "draft_top_k": k, "depth": TOP_K_DEPTH,
                              "a1": float(a[:, 0].mean()),
                              "accepted": float(expected_accepted(a).mean())})
    return rows, truncated


def format_table(rows: list[dict]) -> str:
    lines = ["| setting | K | rounds | accepted/round greedy | sampled | difference [95% CI] "
             "| relative [95% CI] | committed/round greedy -> sampled | relative [95% CI] |",
             "|---|---:|---:|---:|---:|---|---|---|---|"]
    for r in rows:
        a, c = r["accepted"], r["committed"]
        lines.append(
            f"| {r['setting']} | {r['depth']} | {r['rounds']} | {a['greedy']:.3f} | "
            f"{a['sampled']:.3f} | {a['diff']:+.3f} [{a['diff_ci'][0]:+.3f}, "
            f"{a['diff_ci'][1]:+.3f}] | {a['rel_pct']:+.1f} % [{a['rel_ci_pct'][0]:+.1f}, "
            f"{a['rel_ci_pct'][1]:+.1f}] | {c['greedy']:.3f} -> {c['sampled']:.3f} | "
            f"{c['rel_pct']:+.1f} % [{c['rel_ci_pct'][0]:+.1f}, {c['rel_ci_pct'][1]:+.1f}] |")
    return "\n".join(lines)


def format_truncated(rows: list[dict]) -> str:
    """The draft-top-k table: each row beside its setting's untruncated one."""
    whole = {r["setting"]: r for r in rows if r["draft_top_k"] == 0}
    lines = ["| setting | --draft-top-k | a_1 | accepted/round | over untruncated |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        base = whole[r["setting"]]["accepted"]
        lines.append(f"| {r['setting']} | {r['draft_top_k'] or 'off'} | {r['a1']:.3f} | "
                     f"{r['accepted']:.3f} | {r['accepted'] / base:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    pinned = a.pair / "corpus.json" if (a.pair / "corpus.json").is_file() \
        else PINNED_DIR / "corpus.json"
    try:
        files = corpus.check(json.loads(pinned.read_text()))
    except CannotRun as e:
        print(f"bench-replay: {e}", file=sys.stderr)
        return 3
    t0 = time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the pair is 128 wide: more threads only contend on a shared box
    try:
        prompts, _ = heldout_prompts(a.pair / "target" / "tokenizer.json",
                                     corpus.texts(files, "heldout"), a.prompts, a.seed)
        rows, truncated = measure(a.pair, prompts, a.tokens, a.bootstrap, a.seed, a.out,
                                  lambda msg: print(msg, file=sys.stderr, flush=True))
    except ValueError as e:
        print(f"bench-replay: {e}", file=sys.stderr)
        return 4
    finally:
        torch.set_num_threads(threads)
    meta = {"pair": str(a.pair), "prompts": a.prompts, "prompt_len": PROMPT_LEN,
            "tokens": a.tokens, "bootstrap": a.bootstrap, "seed": a.seed,
            "wall_s": round(time.monotonic() - t0, 1), "rows": rows, "draft_top_k": truncated}
    (a.out / "replay.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"\n## Sampled vs greedy drafts, replay of the pair {a.pair} on held-out text "
          f"({a.prompts} prompts x {PROMPT_LEN} tokens, {a.tokens} sampled tokens each; "
          f"{a.bootstrap} bootstrap resamples, seed {a.seed})")
    print(format_table(rows))
    print(f"\nbeside: {SEED_CARD}.")
    print(f"\n## Sampled drafts with q cut to the drafter's own top k (--draft-top-k), depth "
          f"{TOP_K_DEPTH}, the same recordings: a_1 and accepted drafts per round\n")
    print(format_truncated(truncated))
    print(f"\nJSON: {a.out / 'replay.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
