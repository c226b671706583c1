"""Mode names -> SGLang server flags and environment.

Grammar: ``<kind>[@<variant>[+<variant>...]]`` where kind is ``off`` (no speculation), ``on``
(static EAGLE-3) or ``dynspec:<policy>`` (EAGLE-3 with the plugin deciding per batch).
Variants: ``topk1`` (default: topk 1, 3 draft tokens), ``topk4`` (topk 4, 16 draft tokens),
``nooverlap`` (--disable-overlap-schedule), ``v1`` (SGLANG_ENABLE_SPEC_V2=0, 0.5.12 only),
``bare`` (dynspec modes only: no decision trace, stats file or Prometheus metrics, to tell the
plugin's hooks from what it writes; a run that traces all servers still leaves this one out),
``nographs`` / ``eagerprefill`` / ``fullprefill`` / ``specbatch`` (dynspec modes only: settings
``offstep_graphs`` / ``target_prefill_graph`` off, ``prefill_draft_sync=full``,
``offstep_batch=speculative``, to tell what each costs or brings beside the same policy).
Examples: ``off``, ``off@nooverlap``, ``on@topk4``, ``dynspec:random@topk4``, ``dynspec:always@bare``.
Per-mode policy arguments go in parentheses, ``;``-separated, values parsed as JSON when they
parse (else kept as strings): ``dynspec:threshold(n=5;band=1)@topk4``.  They replace the
run-wide ``--policy-args`` for that mode.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .server import ServerSpec, safe_name

SPEC_SHAPES = {
    "topk1": {"topk": 1, "num_steps": 2, "num_draft_tokens": 3},
    "topk4": {"topk": 4, "num_steps": 2, "num_draft_tokens": 16},
}
# dynspec-only variants -> the plugin settings (environment) they set
SETTING_VARIANTS = {
    "bare": {"SGLANG_DYNSPEC_METRICS": "0", "SGLANG_DYNSPEC_TRACE_FILE": None},
    "nographs": {"SGLANG_DYNSPEC_OFFSTEP_GRAPHS": "0"},
    "eagerprefill": {"SGLANG_DYNSPEC_TARGET_PREFILL_GRAPH": "0"},
    "fullprefill": {"SGLANG_DYNSPEC_PREFILL_DRAFT_SYNC": "full"},
    "specbatch": {"SGLANG_DYNSPEC_OFFSTEP_BATCH": "speculative"},
}
VARIANTS = set(SPEC_SHAPES) | {"nooverlap", "v1"} | set(SETTING_VARIANTS)
_POLICY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")

# Flags measured to work on the H200 bundle (see shared/gpu/README.md); piecewise CUDA graphs
# are dropped because they cost ~16 s of start-up and only help prefill.  --sleep-on-idle: a run
# keeps 3-4 servers up on one machine and measures one at a time; without it each idle scheduler
# pins a CPU thread at 100 % (SGLang's IdleSleeper docstring), beside the measured server whose
# eager prefills on the pair are CPU-bound (~25-50 ms for one request).
DEFAULT_COMMON_FLAGS = [
    "--load-format", "dummy",
    "--skip-tokenizer-init",
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--cuda-graph-bs", "1", "2", "4", "8", "16", "32", "64", "128",
    "--max-running-requests", "128",
]
OPTIONAL_FLAGS = ["--disable-piecewise-cuda-graph", "--sleep-on-idle"]


@dataclass
class Mode:
    name: str
    kind: str  # "off" | "on" | "dynspec"
    policy: str | None = None
    variants: list[str] = field(default_factory=list)
    policy_args: dict | None = None

    @property
    def speculative(self) -> bool:
        return self.kind != "off"

    @property
    def shape(self) -> dict | None:
        if not self.speculative:
            return None
        return SPEC_SHAPES["topk4" if "topk4" in self.variants else "topk1"]

    @property
    def overlap(self) -> bool:
        return "nooverlap" not in self.variants

    @property
    def bare(self) -> bool:
        return "bare" in self.variants


def parse_mode(name: str) -> Mode:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"mode name must be a non-empty string, got {name!r}")
    name = name.strip()
    base, _, var_text = name.partition("@")
    variants = [v for v in var_text.split("+") if v] if var_text else []
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise ValueError(f"mode {name!r}: unknown variant(s) {bad}; known: {sorted(VARIANTS)}")
    if "topk1" in variants and "topk4" in variants:
        raise ValueError(f"mode {name!r}: variants topk1 and topk4 exclude each other")
    if base in ("off", "on"):
        if base == "off" and any(v in SPEC_SHAPES or v == "v1" for v in variants):
            raise ValueError(f"mode {name!r}: 'off' takes only the 'nooverlap' variant")
        plugin_only = [v for v in variants if v in SETTING_VARIANTS]
        if plugin_only:
            raise ValueError(f"mode {name!r}: {plugin_only[0]!r} is for dynspec modes (stock servers have no plugin)")
        return Mode(name, base, None, variants)
    if base.startswith("dynspec:"):
        policy = base[len("dynspec:"):]
        pargs = None
        if policy.endswith(")") and "(" in policy:
            policy, _, arg_text = policy[:-1].partition("(")
            pargs = {}
            for item in filter(None, (x.strip() for x in arg_text.split(";"))):
                key, eq, raw = item.partition("=")
                if not eq or not key.strip():
                    raise ValueError(f"mode {name!r}: policy argument {item!r} is not key=value")
                try:
                    pargs[key.strip()] = json.loads(raw)
                except ValueError:
                    pargs[key.strip()] = raw
        if not _POLICY_RE.match(policy):
            raise ValueError(f"mode {name!r}: policy name {policy!r} is not a valid identifier")
        return Mode(name, "dynspec", policy, variants, pargs)
    raise ValueError(f"mode {name!r}: kind must be 'off', 'on' or 'dynspec:<policy>'")


def worker_path_guess(mode: Mode, sglang_version: str | None) -> str | None:
    """Which speculative worker SGLang picks for this mode (None when no speculation)."""
    if not mode.speculative:
        return None
    ver = _version_tuple(sglang_version)
    if ver is not None and ver >= (0, 5, 13):
        return "spec_v2"  # no v1 worker any more
    if mode.shape["topk"] > 1 or not mode.overlap or "v1" in mode.variants:
        return "v1"
    return "spec_v2"


def _version_tuple(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    nums = re.findall(r"\d+", version)[:3]
    return tuple(int(n) for n in nums) if nums else None


@dataclass
class ServerConfig:
    """What every server in a run shares."""

    model: str
    draft: str | None = None
    common_flags: list[str] = field(default_factory=lambda: list(DEFAULT_COMMON_FLAGS))
    optional_flags: list[str] = field(default_factory=lambda: list(OPTIONAL_FLAGS))
    mem_fraction_static: float | None = 0.85
    max_total_tokens: int | None = None
    extra_flags: list[str] = field(default_factory=list)
    policy_args: dict | None = None
    stats_root: str | None = None
    deterministic: bool = False
    enable_metrics: bool = True
    # > 0: each server waits up to this long for <model>/model.safetensors (and the draft's, for
    # speculative modes) before launching: weights a builder is still writing (build_pair writes
    # that file last, atomically).  wait_abort_file: its appearance ends the wait (build failed).
    wait_for_weights_s: float = 0.0
    wait_abort_file: str | None = None


def build_server_spec(mode: Mode, cfg: ServerConfig, port: int) -> ServerSpec:
    if not cfg.model:
        raise ValueError("ServerConfig.model must be set (path to the target model)")
    args = ["--model-path", cfg.model] + list(cfg.common_flags)
    if cfg.mem_fraction_static is not None:
        args += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
    if cfg.max_total_tokens:
        args += ["--max-total-tokens", str(int(cfg.max_total_tokens))]
    if cfg.enable_metrics:
        args += ["--enable-metrics"]
    if cfg.deterministic:
        args += ["--enable-deterministic-inference"]
    if not mode.overlap:
        args += ["--disable-overlap-schedule"]
    env: dict[str, str | None] = {}
    if mode.speculative:
        if not cfg.draft:
            raise ValueError(f"mode {mode.name!r} needs ServerConfig.draft (EAGLE-3 draft model path)")
        shape = mode.shape
        args += [
            "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", cfg.draft,
            "--speculative-num-steps", str(shape["num_steps"]),
            "--speculative-eagle-topk", str(shape["topk"]),
            "--speculative-num-draft-tokens", str(shape["num_draft_tokens"]),
        ]
        if "v1" in mode.variants:
            env["SGLANG_ENABLE_SPEC_V2"] = "0"
    if mode.kind == "dynspec":
        env["SGLANG_DYNSPEC_ENABLED"] = "1"
        env["SGLANG_DYNSPEC_POLICY"] = mode.policy or ""
        pargs = mode.policy_args if mode.policy_args is not None else cfg.policy_args
        if pargs:
            env["SGLANG_DYNSPEC_POLICY_ARGS"] = json.dumps(pargs, sort_keys=True)
        for v in mode.variants:
            # (a None value unsets the variable, also where the run exports it for all servers)
            env.update(SETTING_VARIANTS.get(v, {}))
        if not mode.bare and cfg.stats_root:
            env["SGLANG_DYNSPEC_STATS_DIR"] = stats_dir_for(cfg.stats_root, mode.name)
    args += list(cfg.extra_flags)
    # Optional flags go in first; ServerProcess.start drops them on a failed first attempt.
    args += [f for f in cfg.optional_flags if f not in args]
    wait_for: list[str] = []
    if cfg.wait_for_weights_s > 0:
        wait_for.append(str(Path(cfg.model) / "model.safetensors"))
        if mode.speculative:
            wait_for.append(str(Path(cfg.draft) / "model.safetensors"))
    return ServerSpec(name=mode.name, args=args, env=env, port=port,
                      optional_flags=list(cfg.optional_flags), wait_for=wait_for,
                      wait_timeout_s=cfg.wait_for_weights_s, wait_abort_file=cfg.wait_abort_file)


def stats_dir_for(root: str, mode_name: str) -> str:
    return f"{root.rstrip('/')}/{safe_name(mode_name)}"
