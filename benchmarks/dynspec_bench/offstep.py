"""Off-step cost: decode step time of a dynspec server forced off (policy `never`) vs a plain server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from .loadgen import closed_loop, sampling_params, summarize
from .modes import parse_mode, worker_path_guess
from .prompts import PromptSource
from .results import base_record, finish, phase, write_json
from .runconfig import RunConfig
from .wave import log, running_modes


@dataclass
class OffstepConfig(RunConfig):
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32, 128])
    policy: str = "never"
    output_len: int = 512
    requests_factor: int = 2
    warmup_tokens: int = 32
    name: str = "offstep"
    base_port: int = 30200

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes: need positive integers, got {self.batch_sizes}")


def _step_ms(base_url: str, prompts: PromptSource, bs: int, cfg: OffstepConfig, salt: int) -> dict:
    asyncio.run(closed_loop(base_url, prompts.take(bs, salt=50_000 + salt), bs, sampling_params(cfg.warmup_tokens)))
    res, wall = asyncio.run(closed_loop(base_url, prompts.take(bs * cfg.requests_factor, salt=salt), bs,
                                        sampling_params(cfg.output_len)))
    return summarize(res, wall)


def run_offstep(cfg: OffstepConfig, argv: list[str] | None = None) -> dict:
    suffix = f"@{cfg.variant}" if cfg.variant else ""
    plain_m = parse_mode("off" + ("@nooverlap" if "nooverlap" in cfg.variant else ""))
    dyn_m = parse_mode(f"dynspec:{cfg.policy}{suffix}")
    out_dir = Path(cfg.out_dir)
    json_path = out_dir / f"{cfg.name}.json"
    rec = base_record("offstep", cfg.server.model, argv)
    shape = dyn_m.shape
    rec.update({"policy": cfg.policy, "topk": shape["topk"], "num_steps": shape["num_steps"],
                "num_draft_tokens": shape["num_draft_tokens"], "per_bs": {}, "errors": {},
                "worker_path": worker_path_guess(dyn_m, rec["sglang_version"]), "draft_model": cfg.server.draft,
                "settings": {"output_len": cfg.output_len, "input_len": cfg.input_len,
                             "requests_factor": cfg.requests_factor, "variant": cfg.variant}})
    prompts = PromptSource(cfg.input_len, cfg.seed)
    with running_modes(rec, [plain_m, dyn_m], cfg.server, cfg.log_dir or out_dir / f"{cfg.name}-logs",
                       [cfg.base_port, cfg.base_port + 1], cfg.start_timeout_s, cfg.server_factory) as live:
        if len(live) == 2:
            for i, bs in enumerate(cfg.batch_sizes):
                if cfg.remaining_s() < cfg.level_margin_s:
                    rec.setdefault("skipped", []).append({"bs": bs, "why": "deadline"})
                    continue
                with phase(rec, f"offstep:bs={bs}"):
                    # Same prompts for both servers, measured back to back so drift cancels.
                    plain = _step_ms(live[plain_m.name].base_url, prompts, bs, cfg, salt=i + 1)
                    off = _step_ms(live[dyn_m.name].base_url, prompts, bs, cfg, salt=i + 1)
                p, o = plain["tpot_p50_ms"], off["tpot_p50_ms"]
                rec["per_bs"][str(bs)] = {"off_step_ms": o, "plain_step_ms": p,
                                          "ratio": round(o / p, 4) if o and p else None,
                                          "off_failed": off["failed"], "plain_failed": plain["failed"],
                                          "off_tok_per_s": off["output_tok_per_s"],
                                          "plain_tok_per_s": plain["output_tok_per_s"]}
                log(f"offstep bs={bs}: off {o} ms, plain {p} ms, ratio {rec['per_bs'][str(bs)]['ratio']}")
                write_json(json_path, rec)
        else:
            rec["errors"]["run"] = f"servers failed to start: {sorted({plain_m.name, dyn_m.name} - set(live))}"
    finish(json_path, rec)
    log(f"wrote {json_path}")
    return rec
