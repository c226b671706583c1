"""Off-step cost: decode step time of a dynspec server forced off (policy `never`) vs a plain server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from .loadgen import closed_loop, output_lengths, sampling_params, summarize
from .modes import parse_mode, worker_path_guess
from .profile import profile_server, summary_line
from .prompts import PromptSource
from .results import base_record, finish, phase, write_json
from .runconfig import RunConfig
from .server import safe_name
from .wave import log, running_modes


PROFILE_KEEP_BYTES = 4 << 20  # larger prefill-profile traces are analysed on the device, then removed


@dataclass
class OffstepConfig(RunConfig):
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32, 128])
    policy: str = "never"
    output_len: int = 512
    requests_factor: int = 2
    warmup_tokens: int = 32
    name: str = "offstep"
    base_port: int = 30200
    # Batch sizes at which both servers are also profiled (SGLang's /start_profile), and for how many steps.
    profile_bs: list[int] = field(default_factory=list)
    profile_steps: int = 30
    profile_stack: bool = False  # Python stacks in the traces (heavier; says which code runs per step)
    # A prefill-heavy level: a closed loop at prefill_c (0: none) of short, varied outputs, so that
    # requests are admitted one by one between decode steps; every server in order, then in reverse.
    prefill_c: int = 0
    prefill_out: tuple[int, int] = (16, 64)
    prefill_requests: int = 200
    prefill_temp: float = 0.7
    prefill_profile_steps: int = 0  # also profile that load (prefill and decode windows); 0: no

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes: need positive integers, got {self.batch_sizes}")
        if len(self.prefill_out) != 2 or not 1 <= self.prefill_out[0] <= self.prefill_out[1]:
            raise ValueError(f"prefill_out: need lo,hi with 1 <= lo <= hi, got {self.prefill_out}")
        if self.prefill_c < 0 or (self.prefill_c and self.prefill_requests < self.prefill_c):
            raise ValueError(f"prefill_c / prefill_requests: need 0 <= C <= requests, got "
                             f"{self.prefill_c} / {self.prefill_requests}")


def _step_ms(base_url: str, prompts: PromptSource, bs: int, cfg: OffstepConfig, salt: int) -> dict:
    asyncio.run(closed_loop(base_url, prompts.take(bs, salt=50_000 + salt), bs, sampling_params(cfg.warmup_tokens)))
    res, wall = asyncio.run(closed_loop(base_url, prompts.take(bs * cfg.requests_factor, salt=salt), bs,
                                        sampling_params(cfg.output_len)))
    return summarize(res, wall)


def _variants(text: str) -> list[str]:
    """``--variant`` holds one variant spec or several, comma-separated (one dynspec server each)."""
    return [v.strip() for v in (text or "").split(",")]


def _profile_level(rec: dict, cfg: OffstepConfig, live: dict, modes, prompts: PromptSource, bs: int,
                   log_dir: Path, salt: int) -> None:
    """Profile every live server at batch size ``bs`` (same prompts), into rec['profile'][mode][bs]."""
    batch = prompts.take(bs, salt=salt)
    for m in modes:
        if m.name not in live:
            continue
        tag = f"prof-{safe_name(m.name)}-bs{bs}"
        with phase(rec, f"profile:{m.name}:bs={bs}"):
            res = profile_server(live[m.name].base_url, batch, log_dir / "profiles", tag,
                                 num_steps=cfg.profile_steps, with_stack=cfg.profile_stack)
        rec.setdefault("profile", {}).setdefault(m.name, {})[str(bs)] = res
        log("profile " + summary_line(res))


def _prefill_params(cfg: OffstepConfig, n: int, seed: int) -> list[dict]:
    lo, hi = cfg.prefill_out
    return [sampling_params(k, cfg.prefill_temp) for k in output_lengths(n, lo, hi, seed)]


def _prefill_level(rec: dict, cfg: OffstepConfig, live: dict, modes, prompts: PromptSource, log_dir: Path) -> None:
    """tok/s and TTFT of every live server under the prefill-heavy load, measured in order and
    then in reverse (drift cancels in the mean); then, if asked, a profile of each under it."""
    c, n = cfg.prefill_c, cfg.prefill_requests
    names = [m.name for m in modes if m.name in live]
    out = rec.setdefault("prefill_level", {"c": c, "requests": n, "out": list(cfg.prefill_out),
                                           "temperature": cfg.prefill_temp, "runs": {}})
    batch, params = prompts.take(n, salt=7000), _prefill_params(cfg, n, seed=7000)
    warm = prompts.take(2 * c, salt=7100)
    for name in names:
        asyncio.run(closed_loop(live[name].base_url, warm, c, _prefill_params(cfg, 2 * c, seed=7100)))
    for rnd, order in enumerate((names, names[::-1])):
        for name in order:
            with phase(rec, f"prefill:{name}:round{rnd}"):
                res, wall = asyncio.run(closed_loop(live[name].base_url, batch, c, params))
            row = summarize(res, wall)
            out["runs"].setdefault(name, []).append(row)
            log(f"prefill C={c} {name} round {rnd}: {row['output_tok_per_s']} tok/s, "
                f"TTFT p50 {row['ttft_p50_ms']} ms, TPOT p50 {row['tpot_p50_ms']} ms, failed {row['failed']}")
    if cfg.prefill_profile_steps > 0:
        pb, pp = prompts.take(n, salt=7200), _prefill_params(cfg, n, seed=7200)
        for name in names:
            if cfg.remaining_s() < cfg.level_margin_s:
                rec.setdefault("skipped", []).append({"prefill_profile": name, "why": "deadline"})
                continue
            tag = f"prefprof-{safe_name(name)}"
            with phase(rec, f"prefill-profile:{name}"):
                res = profile_server(live[name].base_url, pb, log_dir / "profiles", tag,
                                     num_steps=cfg.prefill_profile_steps, with_stack=cfg.profile_stack,
                                     concurrency=c, params=pp)
            trace = log_dir / "profiles" / str(res.get("trace", ""))
            if res.get("trace") and trace.is_file() and trace.stat().st_size > PROFILE_KEEP_BYTES:
                # Python stacks make traces of tens of MB: the logs tarball must stay under the
                # 16 MiB a file that comes back from the device may have; the analysis is kept.
                res["trace_removed_bytes"] = trace.stat().st_size
                trace.unlink()
            rec.setdefault("prefill_profile", {})[name] = res
            pre, dec = res.get("prefill", {}), res.get("decode", {})
            log(f"prefill profile {name}: prefill windows {pre.get('windows')} mean {pre.get('wall_ms_mean')} ms "
                f"(GPU {pre.get('gpu_busy_ms_mean')}), decode windows {dec.get('windows')} mean "
                f"{dec.get('wall_ms_mean')} ms (GPU {dec.get('gpu_busy_ms_mean')}) {res.get('error', '')}")


def run_offstep(cfg: OffstepConfig, argv: list[str] | None = None) -> dict:
    variants = _variants(cfg.variant)
    plain_m = parse_mode("off" + ("@nooverlap" if any("nooverlap" in v for v in variants) else ""))
    dyn_ms = [parse_mode(f"dynspec:{cfg.policy}" + (f"@{v}" if v else "")) for v in variants]
    modes = [plain_m, *dyn_ms]
    out_dir = Path(cfg.out_dir)
    json_path = out_dir / f"{cfg.name}.json"
    rec = base_record("offstep", cfg.server.model, argv)
    shape = dyn_ms[0].shape
    rec.update({"policy": cfg.policy, "topk": shape["topk"], "num_steps": shape["num_steps"],
                "num_draft_tokens": shape["num_draft_tokens"], "per_bs": {}, "errors": {},
                "worker_path": worker_path_guess(dyn_ms[0], rec["sglang_version"]), "draft_model": cfg.server.draft,
                "settings": {"output_len": cfg.output_len, "input_len": cfg.input_len,
                             "requests_factor": cfg.requests_factor, "variant": cfg.variant,
                             "profile_bs": cfg.profile_bs, "profile_steps": cfg.profile_steps,
                             "profile_stack": cfg.profile_stack, "prefill_c": cfg.prefill_c,
                             "prefill_out": list(cfg.prefill_out), "prefill_requests": cfg.prefill_requests,
                             "prefill_temp": cfg.prefill_temp,
                             "prefill_profile_steps": cfg.prefill_profile_steps}})
    if len(dyn_ms) > 1:
        # per_bs is the first dynspec server's; per_mode has every one's (same fields).
        rec["per_mode"] = {m.name: {"worker_path": worker_path_guess(m, rec["sglang_version"]), **m.shape,
                                    "per_bs": {}} for m in dyn_ms}
    prompts = PromptSource(cfg.input_len, cfg.seed)
    log_dir = Path(cfg.log_dir or out_dir / f"{cfg.name}-logs")
    ports = [cfg.base_port + i for i in range(len(modes))]
    with running_modes(rec, modes, cfg.server, log_dir, ports, cfg.start_timeout_s, cfg.server_factory) as live:
        if plain_m.name in live and any(m.name in live for m in dyn_ms):
            for i, bs in enumerate(cfg.batch_sizes):
                if cfg.remaining_s() < cfg.level_margin_s:
                    rec.setdefault("skipped", []).append({"bs": bs, "why": "deadline"})
                    continue
                with phase(rec, f"offstep:bs={bs}"):
                    # Same prompts for every server, measured back to back so drift cancels.
                    plain = _step_ms(live[plain_m.name].base_url, prompts, bs, cfg, salt=i + 1)
                    for dm in dyn_ms:
                        if dm.name not in live:
                            continue
                        off = _step_ms(live[dm.name].base_url, prompts, bs, cfg, salt=i + 1)
                        p, o = plain["tpot_p50_ms"], off["tpot_p50_ms"]
                        row = {"off_step_ms": o, "plain_step_ms": p, "ratio": round(o / p, 4) if o and p else None,
                               "off_failed": off["failed"], "plain_failed": plain["failed"],
                               "off_tok_per_s": off["output_tok_per_s"], "plain_tok_per_s": plain["output_tok_per_s"]}
                        if dm is dyn_ms[0]:
                            rec["per_bs"][str(bs)] = row
                        if "per_mode" in rec:
                            rec["per_mode"][dm.name]["per_bs"][str(bs)] = row
                        log(f"offstep bs={bs} {dm.name}: off {o} ms, plain {p} ms, ratio {row['ratio']}")
                if bs in cfg.profile_bs and cfg.remaining_s() >= cfg.level_margin_s:
                    _profile_level(rec, cfg, live, modes, prompts, bs, log_dir, salt=900 + i)
                write_json(json_path, rec)
            if cfg.prefill_c > 0 and cfg.remaining_s() >= cfg.level_margin_s:
                _prefill_level(rec, cfg, live, modes, prompts, log_dir)
                write_json(json_path, rec)
        else:
            rec["errors"]["run"] = f"servers failed to start: {sorted({m.name for m in modes} - set(live))}"
    finish(json_path, rec)
    log(f"wrote {json_path}")
    return rec
