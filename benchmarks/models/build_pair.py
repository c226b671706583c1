"""Build a trained target + EAGLE-3 draft pair on the machine it runs on, with no downloads.

    python -m benchmarks.models.build_pair --out /tmp/pair            # H200 sizes (PAIR.md)

Output (under --out): tokenizer.json, target/ (LlamaForCausalLM), target-padded/ (same function,
larger step cost; with --pad-layers), draft/ (LlamaForCausalLMEagle3 for SGLang), prompts.json
(held-out token-id windows for the harness's --prompts-file) and pair.json (sizes, seeds, losses,
per-phase seconds, repeated-4-gram shares, offline accept length). pair.json is rewritten after
every phase, so a run cut short still says how far it got.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `benchmarks.models` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.dynspec_bench.results import portable  # noqa: E402
from benchmarks.models import pair_corpus as corpus  # noqa: E402
from benchmarks.models.pair_export import padded_state, param_count, save_draft, save_target  # noqa: E402
from benchmarks.models.pair_model import Eagle3Draft, LlamaShape, TargetLM  # noqa: E402
from benchmarks.models.pair_train import (  # noqa: E402
    TrainBudget, eval_loss, greedy_continue, offline_accept_length, train_draft, train_target,
)


@dataclass
class PairConfig:
    out: str = "/tmp/pair"
    seed: int = 0
    roots: list[str] | None = None  # default: this interpreter's stdlib + site-packages
    corpus_mb: float = 150.0
    heldout_frac: float = 0.02
    heldout_mb: float = 8.0  # enough for prompts + eval; encoding it costs time
    tokenizer_sample_mb: float = 24.0
    vocab: int = 32000
    hidden: int = 1024
    layers: int = 12
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 2816
    seq: int = 512
    batch: int = 64
    lr: float = 1.5e-3
    target_seconds: float | None = 130.0
    target_steps: int | None = None
    draft_intermediate: int | None = None  # default: the target's
    aux_layers: list[int] = field(default_factory=lambda: [1, 5, 8])
    draft_batch: int = 32
    draft_lr: float = 1e-3
    draft_seconds: float | None = 75.0
    draft_steps: int | None = None
    pad_layers: int = 0  # 0: no padded export
    pad_intermediate: int = 0
    prompt_len: int = 256
    cont_len: int = 128
    n_prompts: int = 2048
    eval_windows: int = 64
    greedy_prompts: int = 64
    export_dtype: str = "bfloat16"
    device: str = "auto"

    def target_shape(self) -> LlamaShape:
        return LlamaShape(self.vocab, self.hidden, self.layers, self.heads, self.kv_heads, self.head_dim,
                          self.intermediate)

    def draft_shape(self) -> LlamaShape:
        return LlamaShape(self.vocab, self.hidden, 1, self.heads, self.kv_heads, self.head_dim,
                          self.draft_intermediate or self.intermediate)


class Manifest:
    """pair.json, with per-phase seconds; written after every phase."""

    def __init__(self, path: Path, cfg: PairConfig):
        self.path = path
        self.t0 = time.perf_counter()
        self.data: dict = {"config": asdict(cfg), "phase_seconds": {}, "done": False,
                           "torch": torch.__version__, "python": sys.version.split()[0]}

    def phase(self, name: str, started: float, **facts) -> None:
        secs = round(time.perf_counter() - started, 2)
        self.data["phase_seconds"][name] = secs
        self.data.update(facts)
        self.data["elapsed_s"] = round(time.perf_counter() - self.t0, 2)
        # committed beside the results: the paths as the harness writes them (results.portable)
        self.path.write_text(json.dumps(portable(self.data), indent=2) + "\n")
        print(f"[build_pair +{self.data['elapsed_s']:.1f}s] {name}: {secs:.2f}s", flush=True)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def prepare_data(cfg: PairConfig, out: Path, man: Manifest) -> dict:
    t = time.perf_counter()
    roots = [Path(r) for r in cfg.roots] if cfg.roots else corpus.source_roots()
    files = corpus.list_source_files(roots)
    train_files, held_files = corpus.split_heldout(files, cfg.heldout_frac, cfg.seed)
    train_texts = corpus.read_texts(train_files, int(cfg.corpus_mb * 1e6))
    held_texts = corpus.read_texts(held_files, int(cfg.heldout_mb * 1e6))
    man.phase("corpus", t, corpus={
        "roots": [str(r) for r in roots], "files": len(files), "train_files": len(train_files),
        "heldout_files": len(held_files), "train_docs_used": len(train_texts),
        "train_mb": round(sum(len(x.encode()) for x in train_texts) / 1e6, 2)})

    t = time.perf_counter()
    tok = corpus.train_tokenizer(train_texts, cfg.vocab, int(cfg.tokenizer_sample_mb * 1e6))
    tok.save(str(out / "tokenizer.json"))
    eos_id = tok.token_to_id(corpus.EOS)
    man.phase("tokenizer", t, tokenizer={"path": str(out / "tokenizer.json"),
                                         "vocab": tok.get_vocab_size(), "eos_id": eos_id})

    t = time.perf_counter()
    train_stream = corpus.encode_stream(tok, train_texts)
    held_stream = corpus.encode_stream(tok, held_texts)
    wins = corpus.windows(held_stream, cfg.n_prompts, cfg.prompt_len + cfg.cont_len)
    prompts = [w[:cfg.prompt_len] for w in wins]
    (out / "prompts.json").write_text(json.dumps(prompts))
    eval_wins = corpus.windows(held_stream, cfg.eval_windows, cfg.seq + 1)
    man.phase("encode", t, tokens={"train": len(train_stream), "heldout": len(held_stream)},
              prompts={"path": str(out / "prompts.json"), "count": len(prompts), "len": cfg.prompt_len})
    if len(prompts) < cfg.n_prompts:
        print(f"[build_pair] only {len(prompts)} held-out prompt windows (asked {cfg.n_prompts})", flush=True)
    return {"eos_id": eos_id, "train": train_stream, "wins": wins, "eval": eval_wins, "tok": tok}


def build_pair(cfg: PairConfig) -> dict:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    dev = _device(cfg.device)
    amp = torch.bfloat16 if dev.type == "cuda" else None
    xdtype = getattr(torch, cfg.export_dtype)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    man = Manifest(out / "pair.json", cfg)
    data = prepare_data(cfg, out, man)
    eos_id = data["eos_id"]
    stream = data["train"].to(dev)

    t = time.perf_counter()
    target = TargetLM(cfg.target_shape()).to(dev)
    tstats = train_target(target, stream, TrainBudget(cfg.target_seconds, cfg.target_steps, cfg.lr, cfg.batch,
                                                      cfg.seq, seed=cfg.seed), dev, amp)
    tstats["heldout_loss"] = eval_loss(target, data["eval"], dev, amp)
    man.phase("train_target", t, target_training=tstats)

    t = time.perf_counter()
    tdir = save_target(target, out / "target", xdtype, eos_id)
    man.phase("save_target", t, target={"path": str(tdir), "params": param_count(target.state_dict()),
                                        "shape": target.shape.as_dict(), "padded": False})

    # Before the draft trains: a server of the target alone (harness --wait-for-weights) can
    # start while the draft is still training.
    if cfg.pad_layers or cfg.pad_intermediate:
        t = time.perf_counter()
        state, pshape = padded_state(target, max(cfg.pad_layers, cfg.layers),
                                     max(cfg.pad_intermediate, cfg.intermediate), seed=cfg.seed + 2,
                                     dtype=xdtype, device=dev)
        pdir = save_target(target, out / "target-padded", xdtype, eos_id, state=state, shape=pshape)
        man.phase("save_padded", t, target_padded={
            "path": str(pdir), "padded": True, "params": param_count(state), "shape": pshape.as_dict(),
            "note": "same logits as target/ (extra parts add exact zeros); only the step cost is larger"})
        del state

    t = time.perf_counter()
    torch.manual_seed(cfg.seed + 1)
    draft = Eagle3Draft(cfg.draft_shape(), n_aux=len(cfg.aux_layers), target_hidden=cfg.hidden).to(dev)
    with torch.no_grad():  # start from the target's head: the draft predicts the same distribution
        draft.lm_head.weight.copy_(target.lm_head.weight)
    dstats = train_draft(draft, target, stream, cfg.aux_layers,
                         TrainBudget(cfg.draft_seconds, cfg.draft_steps, cfg.draft_lr, cfg.draft_batch, cfg.seq,
                                     seed=cfg.seed + 1), dev, amp)
    man.phase("train_draft", t, draft_training=dstats)

    t = time.perf_counter()
    ddir = save_draft(draft, out / "draft", cfg.aux_layers, xdtype, eos_id)
    man.phase("save_draft", t, draft={"path": str(ddir), "params": param_count(draft.state_dict()),
                                      "shape": draft.shape.as_dict(), "aux_layers": list(cfg.aux_layers),
                                      "embeddings": "shared from the target at load"})

    t = time.perf_counter()
    wins = data["wins"][:cfg.greedy_prompts]
    prompts = [w[:cfg.prompt_len] for w in wins]
    real = [w[cfg.prompt_len:] for w in wins]
    greedy = greedy_continue(target, prompts, cfg.cont_len, dev, amp)
    acc = offline_accept_length(draft, target, prompts, greedy, cfg.aux_layers, dev, amp)
    man.phase("measure", t, repeated_4gram_share={
        "greedy_target": corpus.repeated_ngram_share(greedy, 4),
        "heldout_text": corpus.repeated_ngram_share(real, 4), "sequences": len(greedy), "tokens_each": cfg.cont_len},
        offline_greedy_accept_topk1_2steps=acc,
        greedy_sample=data["tok"].decode(greedy[0][:64]) if greedy else None)
    man.data["done"] = True
    man.phase("total", man.t0)
    return man.data


def parse_args(argv: list[str] | None = None) -> PairConfig:
    d = PairConfig()
    ap = argparse.ArgumentParser(prog="python -m benchmarks.models.build_pair", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, val in asdict(d).items():
        flag = "--" + name.replace("_", "-")
        if name == "roots":
            ap.add_argument(flag, nargs="+", default=None, help="source folders (default: stdlib + site-packages)")
        elif name == "aux_layers":
            ap.add_argument(flag, default=",".join(map(str, val)),
                            type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                            help="target layers whose outputs feed the draft (comma-separated)")
        elif name in ("target_seconds", "draft_seconds"):
            ap.add_argument(flag, type=float, default=val, help="time budget; 0 = steps only")
        elif name in ("target_steps", "draft_steps", "draft_intermediate"):
            ap.add_argument(flag, type=int, default=val)
        else:
            ap.add_argument(flag, type=type(val), default=val)
    ns = ap.parse_args(argv)
    cfg = PairConfig(**vars(ns))
    cfg.target_seconds = cfg.target_seconds or None
    cfg.draft_seconds = cfg.draft_seconds or None
    if any(a < 0 or a >= cfg.layers for a in cfg.aux_layers):
        ap.error(f"--aux-layers {cfg.aux_layers} must lie in [0, {cfg.layers})")
    return cfg


def main(argv: list[str] | None = None) -> int:
    man = build_pair(parse_args(argv))
    print(json.dumps({k: man.get(k) for k in ("phase_seconds", "repeated_4gram_share",
                                              "offline_greedy_accept_topk1_2steps")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
