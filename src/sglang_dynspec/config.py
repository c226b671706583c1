"""Settings: environment (SGLANG_DYNSPEC_*) over an optional TOML file over defaults.

Loaded with pydantic-settings.  Every error names the field and the source the bad value
came from, and unknown keys are refused rather than ignored.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from . import gate
from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ENV_PREFIX = "SGLANG_DYNSPEC_"


def _flag(v: Any) -> Any:
    # The activation gate's parser, so that no spelling enables one and not the other.
    if isinstance(v, str):
        parsed = gate.parse_bool(v)
        if parsed is None:
            raise ValueError(f"not a boolean; use {gate.SPELLINGS}")
        return parsed
    return v


Flag = Annotated[bool, BeforeValidator(_flag)]


class DynspecSettings(BaseSettings):
    """Every knob of sglang-dynspec.  Field docs double as CLI help."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    enabled: Flag = Field(False, description="Turn the plugin on (it does nothing otherwise).")
    config: Path | None = Field(None, description="Path of a TOML file with these settings.")
    policy: str = Field(
        "goodput",
        description="Policy name (see `sglang-dynspec policies`) or `package.module:Class`.",
    )
    policy_args: dict[str, Any] = Field(
        default_factory=dict, description="Policy arguments, a JSON object (env) or table (TOML)."
    )
    safe_mode: Literal["on", "off"] = Field(
        "on",
        description="Mode used for the rest of the run after the policy raised, hung or returned junk.",
    )
    policy_deadline_ms: float = Field(
        2.0, gt=0, le=1000,
        description="A decide() slower than this is late; the policy fails after policy_deadline_strikes "
        "late calls in a row, or one call 25x over.",
    )
    policy_deadline_strikes: int = Field(
        3, ge=1, le=1000, description="Late decide() calls in a row that count as a policy failure."
    )
    sync_interval_steps: int = Field(
        200,
        ge=1,
        le=1_000_000,
        description="Decode steps between agreements of cost tables across tensor-parallel ranks.",
    )
    offstep_graphs: Flag = Field(
        True, description="Capture CUDA graphs for off-steps where the worker path supports it."
    )
    target_prefill_graph: Flag = Field(
        True,
        description="SGLang 0.5.11-0.5.13: replay the target's piecewise prefill CUDA graph for EAGLE "
        "prefills (those releases capture it, then prefill eagerly when speculation is configured).",
    )
    offstep_draft_sync: Literal["light", "full"] = Field(
        "light",
        description=(
            "How an off-step keeps the draft KV cache complete: `light` writes the token's draft K/V "
            "directly (single-layer EAGLE-3 drafts; others use `full`) and runs one full-sync resume "
            "step before speculating again; `full` runs the draft-extend forward on every off-step."
        ),
    )
    prefill_draft_sync: Literal["light", "full"] = Field(
        "light",
        description=(
            "How a prefill that runs while speculation is off fills the draft KV cache: `light` writes "
            "every prompt token's draft K/V directly from the target's hidden states (where off-steps use "
            "the light sync, on the spec_v2 worker of SGLang 0.5.9-0.5.12 and 0.5.15; a resume step "
            "precedes speculation); `full` runs the draft's extend forward, as SGLang does."
        ),
    )
    offstep_batch: Literal["plain", "speculative"] = Field(
        "plain",
        description=(
            "How the scheduler runs an off-step: `plain` as a non-speculative decode batch (its own "
            "plain bookkeeping; on SGLang 0.5.12's and 0.5.15's spec_v2 worker with the light draft sync, else "
            "`speculative`); `speculative` as a speculative batch whose drafts were all rejected."
        ),
    )
    metrics: Flag = Field(
        True, description="Export dynspec metrics on SGLang's Prometheus endpoint (--enable-metrics)."
    )
    stats_dir: Path | None = Field(
        None, description="Directory where each scheduler process rewrites a stats JSON about once a second."
    )
    trace_file: Path | None = Field(None, description="JSONL decision trace (per process suffix added).")
    trace_max_mb: float = Field(64.0, gt=0, le=100_000, description="Size cap of the decision trace.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log level of the sglang_dynspec logger."
    )

    @field_validator("policy")
    @classmethod
    def _policy_not_blank(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("must name a policy")
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load_settings() reads the environment and the TOML file itself and passes the merged
        # values as init kwargs, so that each error can name the source of the bad value.
        return (init_settings,)


FIELDS = tuple(DynspecSettings.model_fields)


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _env_values(environ: dict[str, str]) -> dict[str, str]:
    """SGLANG_DYNSPEC_* variables by field name; unknown names are an error, not ignored."""
    out: dict[str, str] = {}
    for key, value in environ.items():
        if not key.upper().startswith(ENV_PREFIX):
            continue
        field = key[len(ENV_PREFIX):].lower()
        if field not in DynspecSettings.model_fields:
            raise ConfigError(
                f"{key} (env): unknown setting; known: {', '.join(env_name(f) for f in FIELDS)}"
            )
        out[field] = value
    return out


def _file_values(path: Path, origin: str) -> dict[str, Any]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config ({origin}): TOML file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"config ({origin}): cannot read TOML file {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config ({origin}): {path} is not valid TOML: {e}") from None
    # Allow either top-level keys or a [dynspec] table.
    if set(data) == {"dynspec"} and isinstance(data["dynspec"], dict):
        data = data["dynspec"]
    unknown = sorted(k for k in data if k not in DynspecSettings.model_fields or k == "config")
    if unknown:
        raise ConfigError(
            f"{unknown[0]} (file {path}): unknown setting; known: {', '.join(f for f in FIELDS if f != 'config')}"
        )
    return data


def _parse_env_field(field: str, raw: str) -> Any:
    """Env strings that need structure (policy_args) are parsed here so the error is ours."""
    if field == "policy_args":
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as e:
            raise ConfigError(f"policy_args (env {env_name(field)}): not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"policy_args (env {env_name(field)}): must be a JSON object, got {type(value).__name__}")
        return value
    return raw


class LoadedSettings:
    """The validated settings plus where each value came from ("env", "file <path>", "default").

    ``policy`` is the policy built from them, once :func:`validate` has run.
    """

    def __init__(self, settings: DynspecSettings, sources: dict[str, str]):
        self.settings = settings
        self.sources = sources
        self.policy: Any = None

    def rows(self) -> list[tuple[str, Any, str]]:
        return [(f, getattr(self.settings, f), self.sources[f]) for f in FIELDS]


def load_settings(environ: dict[str, str] | None = None) -> LoadedSettings:
    """Validate env + file; raise ConfigError naming every bad field and its source."""
    environ = dict(os.environ if environ is None else environ)
    env_vals = _env_values(environ)
    file_vals: dict[str, Any] = {}
    file_path = env_vals.get("config")
    if file_path:
        file_vals = _file_values(Path(file_path), f"env {env_name('config')}")

    sources: dict[str, str] = {}
    merged: dict[str, Any] = {}
    for field in FIELDS:
        if field in env_vals:
            merged[field] = _parse_env_field(field, env_vals[field])
            sources[field] = f"env {env_name(field)}"
        elif field in file_vals:
            merged[field] = file_vals[field]
            sources[field] = f"file {file_path}"
        else:
            sources[field] = "default"
    try:
        settings = DynspecSettings(**merged)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            where = sources.get(field, "?")
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{loc} ({where}): {msg} (got {err.get('input')!r})")
        raise ConfigError("invalid sglang-dynspec settings:\n  " + "\n  ".join(lines)) from None
    return LoadedSettings(settings, sources)


def validate(environ: dict[str, str] | None = None) -> LoadedSettings:
    """Everything server start checks before serving: the settings, the installed plugins and
    the policy built from its name and arguments.

    The one validation behind activation, ``sglang-dynspec config`` and ``doctor``; raises
    ConfigError naming each bad value's field and source.
    """
    loaded = load_settings(environ)
    from .plugins import load_plugins
    from .policies import build_policy

    # Entry-point plugins load whatever the policy: their observers are called for any policy.
    load_plugins()
    s, src = loaded.settings, loaded.sources
    try:
        loaded.policy = build_policy(s.policy, s.policy_args)
    except ConfigError as e:
        fields = f"policy {s.policy!r} ({src['policy']})"
        if s.policy_args:
            fields += f", policy_args ({src['policy_args']})"
        # build_policy's own "policy ('x'): " prefix would repeat the field named here
        detail = str(e).removeprefix(f"policy ({s.policy!r}): ").replace("\n", "\n  ")
        raise ConfigError(f"invalid sglang-dynspec settings:\n  {fields}: {detail}") from None
    return loaded
