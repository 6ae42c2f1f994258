"""Serving engines as values: what software achieves on a chip, apart from the chip's datasheet.

``dcost.Hardware`` holds the datasheet (peak FLOP/s by precision, HBM, links, price). An
``Engine`` holds what one serving engine, at one version, achieves on one chip: the fractions of
peak its GEMMs, attention and grouped-expert kernels reach, its matmul-size curve, its collectives'
latency and bandwidth, its fixed costs per step, layer and sequence (the ``profile``), where those
numbers come from (``provenance``), and its scheduler settings (``scheduler``). Profiles are data
files in ``profiles/`` beside this module, written by ``dcost calibrate --from-aiconfigurator``
(``dcost.calibrate.kernels``) from the engine's measured kernel tables; scheduler defaults are in
``schedulers.toml`` with a source beside every number.

An engine is applied to a chip by setting the ``Hardware`` fields its profile names
(``Engine.apply``): one code path for pure physics and calibrated engines. Pure physics
(``engine=None``) stays a bound.

>>> import dcost
>>> eng = dcost.engine("vllm", hardware="h100-sxm")
>>> eng.name, eng.hardware_name
('vllm', 'h100-sxm')
>>> h = eng.apply(dcost.hardware("h100-sxm"))
>>> 0.0 < float(h.flops_efficiency) <= 1.0
True
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
import sys
import tomllib
import types
from collections.abc import Mapping
from importlib import resources
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.specs import Hardware, SpecError

__all__ = [
    "Engine",
    "Scheduler",
    "EngineError",
    "engine",
    "engines",
    "ENGINE_NAMES",
    "PROFILE_FIELDS",
    "PRECISION_FIELDS",
    "CLASS_FIELDS",
    "resolve",
    "on_engine",
    "heldout",
    "engine_error",
    "interval_factors",
    "confidence_factor",
    "own_measurements",
    "ttft_band",
    "band_runs",
    "slower",
    "default_scheduler",
    "from_file",
    "write_profile",
]

ENGINE_NAMES = ("vllm", "sglang", "trtllm")
"""Serving engines with shipped profiles (TensorRT-LLM as "trtllm")."""

_ALIASES = {"tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm", "trt-llm": "trtllm"}

PRECISION_FIELDS = (
    "flops_efficiency",
    "matmul_half_tokens",
    "expert_flops_efficiency",
    "expert_half_tokens",
    "expert_half_width",
    "expert_ep_slowdown",
    "gemm_intercept",
)
"""Profile fields fitted per matmul precision (a GEMM's achieved rate and its size curve depend on
the number format: ``[profile.precision.<p>]`` tables). All are ``Hardware`` fields except
``gemm_intercept``: the time a GEMM of the engine's table takes beyond its roofline, alone
(launch, prologue and tail; ``dcost.calibrate.kernels.fit_gemm``), which with
``gemm_intercept_share`` sets ``Hardware.gemm_overhead``."""

WEIGHT_ONLY_EXPERTS = {"w4a16": ("bf16", 0.75)}
"""Expert classes of weight-only quantization: ``{class: (precision it computes at, most bytes
per parameter of a model that runs it)}``. A mixture of experts whose weights average at most
0.75 bytes (4-bit experts, e.g. gpt-oss's MXFP4 at 0.56) served at bf16 runs the engine's
dequantizing expert kernels, whose rate its MoE tables measure apart (AIConfigurator's
``w4a16_mxfp4`` rows): ``[profile.precision.w4a16]`` holds their ``expert_flops_efficiency``
and ``expert_half_tokens``, and may hold their own ``moe_layer_overhead`` and
``moe_ep_overhead`` (``CLASS_FIELDS``:
a fused 4-bit expert kernel's fixed cost is not the bf16 and fp8 kernels')."""

CLASS_FIELDS = ("moe_layer_overhead", "moe_ep_overhead")
"""Shared profile fields a weight-only expert class may set for itself (``WEIGHT_ONLY_EXPERTS``);
a model that runs the class takes them in place of the shared value."""

PROFILE_FIELDS = (
    "bandwidth_efficiency",
    "kv_bandwidth_efficiency",
    "expert_bandwidth_efficiency",
    "kernel_roofline_smoothness",
    "attention_efficiency",
    "scaleup_efficiency",
    "scaleup_latency",
    "scaleout_efficiency",
    "scaleout_latency",
    "tree_collectives",
    "kernel_serialization",
    "step_overhead",
    "layer_overhead",
    "sequence_overhead",
    "prefill_step_overhead",
    "expert_overhead",
    "moe_layer_overhead",
    "moe_ep_overhead",
    "hierarchical_collectives",
    "index_layer_overhead",
    "eager_moe_layer_overhead",
    "fp8_kv_bandwidth_ratio",
    "mla_attention_efficiency",
    "mla_kv_bandwidth_efficiency",
    "mla_fp8_kv_bandwidth_ratio",
    "gemm_intercept_share",
)
"""Profile fields shared by every precision. All are ``Hardware`` fields except
``gemm_intercept_share`` (the share of a GEMM's measured intercept a step pays per GEMM kernel
in a layer, fitted end to end: ``Hardware.gemm_overhead = gemm_intercept_share *
gemm_intercept``, 0 when either is absent: kernels run back to back in a CUDA graph hide part
of one another's fixed time) and
``attention_efficiency``: the achieved fraction of the chip's peak rate at the attention's
precision that attention over the context reaches, set on the chip as ``Hardware.attention_flops
= attention_efficiency * F_attn / flops_efficiency`` (so that ``attention_flops_achieved`` is
that rate); and ``fp8_kv_bandwidth_ratio`` (optional, in (0, 1], 1 when absent): the bandwidth
attention reaches reading an 8-bit KV cache over what it reaches reading a 16-bit one, its
kernels dequantizing the cache as they read it (vLLM's tables on H100 and H200: 0.77 and 0.60);
a model whose ``kv_bytes_per_element`` is <= 1 gets ``kv_bandwidth_efficiency *
fp8_kv_bandwidth_ratio``. The ``mla_`` fields (optional) are the same three of the engine's
multi-head latent attention kernels (``dcost.calibrate.kernels.fit_mla``), which a model with
``Model.latent_attention`` gets in their place."""

_LATENT = {
    "attention_efficiency": "mla_attention_efficiency",
    "kv_bandwidth_efficiency": "mla_kv_bandwidth_efficiency",
    "fp8_kv_bandwidth_ratio": "mla_fp8_kv_bandwidth_ratio",
}
"""A GQA attention field -> its latent-attention field."""


class EngineError(SpecError):
    """An engine name, version, hardware, setting or profile file dcost cannot use."""


@dataclasses.dataclass(frozen=True)
class Scheduler:
    """The scheduler settings of a serving engine, under the names its users know.

    Attributes:
      max_num_seqs: most sequences running at once (vLLM ``max_num_seqs``; SGLang
        ``max_running_requests``; TensorRT-LLM ``max_batch_size``).
      max_num_batched_tokens: most tokens one step computes, prompt chunks and decode tokens
        together (vLLM ``max_num_batched_tokens``; SGLang ``chunked_prefill_size``; TensorRT-LLM
        ``max_num_tokens``).
      gpu_memory_utilization: share of HBM the engine may use for weights, activations and its KV
        cache (vLLM ``gpu_memory_utilization``; SGLang ``mem_fraction_static``; TensorRT-LLM
        ``kv_cache_free_gpu_memory_fraction`` is of the memory left after the weights).
      block_size: tokens per KV-cache block (page).
      prefix_caching: whether the engine reuses cached KV blocks of shared prefixes.
      prefill_first: whether a step that has prompt tokens to compute runs them alone, the
        running decodes waiting (SGLang without ``enable_mixed_chunk``), rather than decode
        tokens first and prompt chunks in what is left of the token budget (vLLM V1,
        TensorRT-LLM's in-flight batching).
      frontend_time: seconds a client's time to first token carries beyond the engine's own
        (HTTP, API server, tokenizer, detokenizing and streaming the token back): its mean
        over requests.
      frontend_cv: coefficient of variation of that time from request to request (gamma; 0:
        the same for every request).
      recv_interval: how often a busy engine takes in new requests (SGLang
        ``--scheduler-recv-interval``, default 1): after that many decode-only steps, or after
        any step with prompt tokens; an idle engine takes them at once. 1: every step (vLLM,
        TensorRT-LLM).
      batch_wait_iters, batch_wait_tokens: TensorRT-LLM's ``batch_wait_timeout_iters`` and
        ``batch_wait_max_tokens_ratio`` (default 0 and 0: off): while sequences decode, new
        prompts wait up to that many steps, unless the step's tokens (decodes and the waiting
        prompts) reach that share of ``max_num_batched_tokens``.
      prompt_graphs: whether the engine replays its steps with prompt tokens as CUDA graphs
        too, up to its token budget (TensorRT-LLM's ``torch_compile_config`` with
        ``enable_piecewise_cuda_graph`` and ``capture_num_tokens``; SGLang's
        ``--enable-piecewise-cuda-graph``; vLLM's ``cudagraph_capture_sizes`` up to its
        ``max_num_batched_tokens``). The profile's ``prefill_step_overhead`` (what a step with
        prompt tokens cost beyond its kernels in the launches the fixed costs were fitted on,
        run kernel by kernel outside the graphs) is then not charged (``Engine.fields``).
        Default False: as those launches ran.
      async_scheduling: whether the engine forms a step's batch while the step before it runs,
        before that step's outputs are back (vLLM's async scheduling, on by default from 0.14;
        SGLang's overlap scheduler, on unless ``--disable-overlap-schedule``; TensorRT-LLM's
        overlap scheduler, on unless ``disable_overlap_scheduler``). A request that reaches a
        busy engine after a step's batch was formed joins the step after the next: it waits
        one step more than under a synchronous scheduler, whose batch is formed at the step's
        boundary. An idle engine takes it at once. The decodes' pace is unchanged (the CPU work
        the overlap hides is in the profile's fixed costs as measured).
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    block_size: int
    prefix_caching: bool
    prefill_first: bool = False
    frontend_time: float = 0.0
    frontend_cv: float = 0.0
    recv_interval: int = 1
    batch_wait_iters: int = 0
    batch_wait_tokens: float = 0.0
    prompt_graphs: bool = False
    async_scheduling: bool = False

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "recv_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EngineError(
                    f"Scheduler.{name} = {value!r} is not allowed: it must be a whole number >= 1"
                )
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0:
            raise EngineError(
                f"Scheduler.gpu_memory_utilization = {u!r} is not allowed: it must be a number "
                "in (0, 1]"
            )
        for name in ("prefix_caching", "prefill_first", "prompt_graphs", "async_scheduling"):
            if not isinstance(getattr(self, name), bool):
                raise EngineError(
                    f"Scheduler.{name} = {getattr(self, name)!r} is not allowed: it must be "
                    "True or False"
                )
        if isinstance(self.batch_wait_iters, bool) or not isinstance(self.batch_wait_iters, int) \
                or self.batch_wait_iters < 0:  # fmt: skip
            raise EngineError(
                f"Scheduler.batch_wait_iters = {self.batch_wait_iters!r} is not allowed: it must "
                "be a whole number >= 0"
            )
        w = self.batch_wait_tokens
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w <= 1.0:
            raise EngineError(
                f"Scheduler.batch_wait_tokens = {w!r} is not allowed: it must be a share in [0, 1]"
            )
        for name in ("frontend_time", "frontend_cv"):
            f = getattr(self, name)
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f < math.inf:
                raise EngineError(
                    f"Scheduler.{name} = {f!r} is not allowed: it must be a finite number >= 0"
                )


@dataclasses.dataclass(frozen=True, eq=False)
class Engine:
    """One serving engine at one version on one chip: its achieved rates and fixed costs
    (``profile``), their provenance and its scheduler.

    Attributes:
      name: "vllm", "sglang" or "trtllm".
      version: the engine version the profile was measured on (e.g. "0.24.0").
      hardware_name: the hardware preset the profile was measured on.
      profile: ``{field: value}`` of the fields in ``PROFILE_FIELDS`` (SI units).
      precision_profile: ``{precision: {field: value}}`` of ``PRECISION_FIELDS`` per matmul
        precision ("bf16", "fp8", "fp4"); "w4a16" holds the grouped-expert fields of 4-bit
        weights computed at bf16 (``WEIGHT_ONLY_EXPERTS``).
      provenance: where the numbers come from (source package and version, tables, row counts,
        the fit's residual per kernel type), as read from the profile file.
      scheduler: the scheduler settings (``Scheduler``).
    """

    name: str
    version: str
    hardware_name: str
    profile: dict
    precision_profile: dict
    provenance: dict
    scheduler: Scheduler

    def __eq__(self, other):
        return isinstance(other, Engine) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def _key(self):
        return (
            self.name,
            self.version,
            self.hardware_name,
            _freeze(self.profile),
            _freeze(self.precision_profile),
            self.scheduler,
        )

    def __repr__(self) -> str:
        return f"Engine({self.name} {self.version} on {self.hardware_name})"

    @property
    def label(self) -> str:
        """``name-version`` (e.g. "vllm-0.24.0")."""
        return f"{self.name}-{self.version}"

    def precision_of(self, hardware: Hardware) -> str:
        """The matmul precision a chip of this engine's hardware runs at: the card's rate whose
        FLOP/s is nearest to ``hardware.flops`` (in log ratio), among the precisions the profile
        was fitted for."""
        from dcost import presets

        card = presets.hardware_card(self.hardware_name)
        flops = float(np.ravel(np.asarray(hardware.flops))[0])  # concrete inside jit too
        best, gap = "bf16", math.inf
        for p in self.precision_profile:
            key = "flops" if p == "bf16" else f"flops_{p}"
            if key not in card:
                continue
            rate = float(presets._value(card[key]))
            if abs(math.log(flops / rate)) < gap:
                best, gap = p, abs(math.log(flops / rate))
        return best

    def fields(
        self, hardware: Hardware, precision: str | None = None, model=None
    ) -> dict[str, Any]:
        """The ``Hardware`` fields this engine sets on ``hardware`` (SI units; floats, or arrays
        where a traced or batched model chooses the expert class): the shared profile,
        the matmul precision's own fields, and ``attention_flops`` from ``attention_efficiency``
        (see ``PROFILE_FIELDS``). With ``model`` (a ``dcost.Model``), a mixture of experts
        whose weights are 4-bit while it computes at bf16 takes the grouped-expert fields of
        the engine's weight-only kernels where the profile has them (``WEIGHT_ONLY_EXPERTS``).
        With ``Scheduler.prompt_graphs``, ``prefill_step_overhead`` and
        ``eager_moe_layer_overhead`` are 0."""
        p = self.precision_of(hardware) if precision is None else precision
        if p not in self.precision_profile or p in WEIGHT_ONLY_EXPERTS:
            have = [q for q in self.precision_profile if q not in WEIGHT_ONLY_EXPERTS]
            raise EngineError(
                f"engine {self.label} on {self.hardware_name} has no profile for precision {p!r}; "
                f"it has: {', '.join(have)}"
            )
        own = (
            "attention_efficiency",
            "fp8_kv_bandwidth_ratio",
            "gemm_intercept_share",
            *_LATENT.values(),
        )
        values = {k: v for k, v in self.profile.items() if k not in own}
        values.update(self.precision_profile[p])
        intercept = values.pop("gemm_intercept", 0.0)
        share = self.profile.get("gemm_intercept_share", 0.0)
        if intercept and share:
            values["gemm_overhead"] = share * intercept
        values.update(self._weight_only(p, model))
        attention = self._attention(model)
        if "kv_bandwidth_efficiency" in attention:
            values["kv_bandwidth_efficiency"] = attention["kv_bandwidth_efficiency"]
        ratio = attention.get("fp8_kv_bandwidth_ratio")
        if ratio is not None and model is not None and "kv_bandwidth_efficiency" in values:
            # an 8-bit cache (0: not stated, the 16-bit rate), element by element of a batch
            b = jnp.asarray(model.kv_bytes_per_element)
            eight = (b > 0.0) & (b <= 1.0)
            values["kv_bandwidth_efficiency"] = values["kv_bandwidth_efficiency"] * jnp.where(
                eight, ratio, 1.0
            )
        if self.scheduler.prompt_graphs:  # replayed as a graph (Scheduler)
            for name in ("prefill_step_overhead", "eager_moe_layer_overhead"):
                if name in values:
                    values[name] = 0.0
        if "attention_efficiency" in attention:
            # the chip's attention peak as set (the KV cache's rate), else its matmul peak
            peak = hardware.get("attention_flops")
            values["attention_flops"] = (
                attention["attention_efficiency"] * peak / values["flops_efficiency"]
            )
        return values

    def _attention(self, model) -> dict:
        """The attention fields ``model`` gets: the GQA kernels' (``attention_efficiency``,
        ``kv_bandwidth_efficiency``, ``fp8_kv_bandwidth_ratio``), and where the profile has the
        latent-attention kernels' (``mla_*``) and the model attends through a latent
        (``Model.latent_attention``), theirs, by ``jnp.where`` element by element of a batch of
        models (a traced model computes what the eager call does)."""
        base = {k: self.profile[k] for k in _LATENT if k in self.profile}
        if model is None or not any(v in self.profile for v in _LATENT.values()):
            return base
        latent = model.latent_attention
        out = dict(base)
        for k, v in _LATENT.items():
            # a latent rate stands in for a rate the profile sets (a profile without
            # attention's own rate keeps the chip's, ``attention_flops``, for every model)
            if v not in self.profile or (k not in base and k != "fp8_kv_bandwidth_ratio"):
                continue
            out[k] = jnp.where(latent, self.profile[v], base.get(k, 1.0))
        return out

    def _weight_only(self, precision: str, model) -> dict:
        """The expert fields of the weight-only class ``model`` runs at ``precision`` ({} when
        none applies). A traced model (inside ``jit``) gets them by ``jnp.where``, element by
        element of a batch of models, so that it computes what the eager call does."""
        if model is None:
            return {}
        for cls, (computes, most_bytes) in WEIGHT_ONLY_EXPERTS.items():
            if computes != precision or cls not in self.precision_profile:
                continue
            runs = (jnp.asarray(model.n_experts) > 1.0) & (
                jnp.asarray(model.bytes_per_param) <= most_bytes
            )
            own = self.precision_profile[cls]
            base = {**self.profile, **self.precision_profile[precision]}
            try:
                if not bool(jnp.any(runs)):
                    return {}
                if bool(jnp.all(runs)):
                    return dict(own)
            except jax.errors.ConcretizationTypeError:
                pass  # traced: choose inside the program
            return {k: jnp.where(runs, own[k], base[k]) for k in own if k in base}
        return {}

    def apply(self, hardware: Hardware, precision: str | None = None, model=None) -> Hardware:
        """``hardware`` with this engine's profile set (its datasheet fields kept).

        Args:
          hardware: the chip (``dcost.hardware(name, precision=...)``).
          precision: the matmul precision whose fields to use; None: the one whose peak FLOP/s
            ``hardware.flops`` is (``precision_of``).
          model: the model it serves (optional): a 4-bit mixture of experts at bf16 runs the
            engine's weight-only expert kernels (``fields``).

        Returns:
          A ``Hardware`` whose efficiency, overhead and link fields are the engine's.

        Apply it to a datasheet chip (``dcost.hardware(name, precision=...)``), once: its
        ``attention_flops`` is derived from the chip's own, so a chip that already carries an
        engine's profile would be derated twice (``engine=`` on the cost functions applies it
        for you).
        """
        if not isinstance(hardware, Hardware):
            raise EngineError(
                f"Engine.apply: hardware must be a dcost.Hardware, got {type(hardware).__name__}"
            )
        values = self.fields(hardware, precision, model)
        names = tuple(values)
        dtype = jnp.result_type(float)
        return eqx.tree_at(
            lambda h: tuple(getattr(h, n) for n in names),
            hardware,
            tuple(jnp.asarray(values[n], dtype=dtype) for n in names),
            is_leaf=lambda x: x is None,
        )

    def with_profile(self, profile=None, precision_profile=None, provenance=None) -> Engine:
        """A copy with some profile fields (or provenance) replaced; the rest kept."""
        return Engine(
            name=self.name,
            version=self.version,
            hardware_name=self.hardware_name,
            profile={**self.profile, **(profile or {})},
            precision_profile={
                p: {**v, **((precision_profile or {}).get(p, {}))}
                for p, v in self.precision_profile.items()
            },
            provenance=dict(provenance) if provenance is not None else self.provenance,
            scheduler=self.scheduler,
        )

    def save(self, path) -> pathlib.Path:
        """Write the profile file (TOML) that ``engine(..., profile=path)`` reads back."""
        return write_profile(self, path)


def write_profile(engine: Engine, path) -> pathlib.Path:
    """Write an ``Engine``'s profile file (TOML): ``[engine]``, ``[profile]`` with
    ``[profile.precision.<p>]``, and ``[provenance]``; ``from_file`` reads it back."""
    from dcost._toml import toml_table

    path = pathlib.Path(path)
    lines = [
        f"# Engine profile: {engine.name} {engine.version} on {engine.hardware_name}.",
        "# Written by dcost (dcost.calibrate.kernels): [provenance] names every number's source.",
        "",
    ]
    toml_table(
        "engine",
        {"name": engine.name, "version": engine.version, "hardware": engine.hardware_name},
        lines,
    )
    toml_table("profile", {**engine.profile, "precision": engine.precision_profile}, lines)
    toml_table("provenance", engine.provenance, lines)
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path


def _freeze(d):
    if isinstance(d, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in d.items()))
    if isinstance(d, list):
        return tuple(_freeze(v) for v in d)
    return d


_DIR = "profiles"


def _profile_files() -> list[Any]:
    root = resources.files(__name__).joinpath(_DIR)
    if not root.is_dir():
        return []
    return sorted((f for f in root.iterdir() if f.name.endswith(".toml")), key=lambda f: f.name)


@functools.cache
def _shipped() -> tuple[tuple[str, str, str, str], ...]:
    """``(engine, version, hardware, file name)`` of every shipped profile."""
    rows = []
    for f in _profile_files():
        head = tomllib.loads(f.read_text(encoding="utf-8"))["engine"]
        rows.append((head["name"], head["version"], head["hardware"], f.name))
    return tuple(rows)


def engines() -> list[tuple[str, str, str]]:
    """What ships: ``(engine, version, hardware preset)`` rows, sorted.

    >>> import dcost
    >>> ("vllm", "h100-sxm") in {(e, h) for e, _, h in dcost.engines()}
    True
    """
    return sorted((e, v, h) for e, v, h, _ in _shipped())


def _version_key(version: str) -> tuple:
    parts = []
    for piece in version.replace("-", ".").split("."):
        digits = "".join(c for c in piece if c.isdigit())
        parts.append((int(digits) if digits else -1, piece))
    return tuple(parts)


@functools.cache
def _scheduler_defaults() -> dict:
    text = resources.files(__name__).joinpath("schedulers.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _value(entry):
    return entry["value"] if isinstance(entry, dict) else entry


def default_scheduler(name: str, hardware_name: str) -> Scheduler:
    """The engine's scheduler defaults on a chip (``schedulers.toml``, each with its source):
    a per-chip table where the engine's defaults depend on the chip's memory, else the engine's
    own."""
    table = _scheduler_defaults()[name]
    values = {k: _value(v) for k, v in table.items() if k not in ("by_hardware", "source")}
    for k, v in table.get("by_hardware", {}).get(hardware_name, {}).items():
        values[k] = _value(v)
    return Scheduler(**values)


def at_version(engine: Engine, version: str | None, measured: str | None = None) -> Engine:
    """``engine`` with the scheduler defaults of the engine's ``version`` where a default
    changed between versions: a setting with ``since`` in ``schedulers.toml`` is off before that
    version (vLLM's async scheduling before 0.14). A ``version`` without digits (unstated) and
    a ``measured`` date (ISO, ``YYYY-MM-DD``) before the setting's ``since_date`` (when that
    version was out): off too, the run having used an earlier version. Otherwise the shipped
    defaults, as they are.

    >>> e = engine("vllm", hardware="h100-sxm")
    >>> [at_version(e, v).scheduler.async_scheduling for v in ("0.12.0", "0.19.0", "")]
    [False, True, True]
    >>> [at_version(e, "", d).scheduler.async_scheduling for d in ("2025-10-29", "2026-04-06")]
    [False, True]
    """
    numbered = bool(version) and any(c.isdigit() for c in str(version))
    if not numbered and not measured:
        return engine
    key = _version_key(str(version)) if numbered else None
    off = {}
    for field, entry in _scheduler_defaults().get(engine.name, {}).items():
        if not (isinstance(entry, dict) and "since" in entry and getattr(engine.scheduler, field)):
            continue
        if key is not None:
            if _older(key, _version_key(entry["since"])):
                off[field] = False
        elif "since_date" in entry and str(measured)[:10] < str(entry["since_date"]):
            off[field] = False
    if not off:
        return engine
    return dataclasses.replace(engine, scheduler=dataclasses.replace(engine.scheduler, **off))


def _older(a: tuple, b: tuple) -> bool:
    """Whether version key ``a`` is before ``b``, by their numbers."""
    n = max(len(a), len(b))
    pa = [a[i][0] if i < len(a) else 0 for i in range(n)]
    pb = [b[i][0] if i < len(b) else 0 for i in range(n)]
    return pa < pb


def _parse_profile(data: Mapping, origin: str) -> tuple[dict, dict, dict]:
    """The shared profile, the per-precision profiles and the provenance of a profile file's
    data, checked: every value a finite number in its field's range (``EngineError`` naming the
    file and the field)."""
    prof = dict(data.get("profile", {}))
    per_precision = prof.pop("precision", {})
    shared = {}
    for k, v in prof.items():
        if k not in PROFILE_FIELDS:
            raise EngineError(
                f"{origin}: profile field {k!r} is not known; allowed: {', '.join(PROFILE_FIELDS)}"
            )
        shared[k] = _number(origin, f"profile.{k}", v)
    precision: dict[str, dict[str, float]] = {}
    for p, fields in per_precision.items():
        precision[p] = {}
        allowed = PRECISION_FIELDS + (CLASS_FIELDS if p in WEIGHT_ONLY_EXPERTS else ())
        for k, v in fields.items():
            if k not in allowed:
                raise EngineError(
                    f"{origin}: profile.precision.{p} field {k!r} is not known; allowed: "
                    f"{', '.join(allowed)}"
                )
            precision[p][k] = _number(origin, f"profile.precision.{p}.{k}", v)
    if not precision:
        raise EngineError(f"{origin}: no [profile.precision.<p>] table; at least one is required")
    _ranges(origin, shared, precision)
    return shared, precision, dict(data.get("provenance", {}))


_FRACTIONS = (
    "bandwidth_efficiency",
    "kv_bandwidth_efficiency",
    "expert_bandwidth_efficiency",
    "attention_efficiency",
    "scaleup_efficiency",
    "scaleout_efficiency",
    "flops_efficiency",
    "fp8_kv_bandwidth_ratio",  # an 8-bit cache reads no faster a byte than a 16-bit one
    "mla_attention_efficiency",
    "mla_kv_bandwidth_efficiency",
    "mla_fp8_kv_bandwidth_ratio",
)
_POSITIVE = ("expert_ep_slowdown",)  # a slowdown factor: 0 would make a path free
_UNIT = (
    "kernel_roofline_smoothness",
    "tree_collectives",
    "kernel_serialization",
    "hierarchical_collectives",
)


def _number(origin, field, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise EngineError(f"{origin}: {field} = {v!r} is not allowed: it must be a finite number")
    return float(v)


def _ranges(origin, shared, precision):
    items = list(shared.items()) + [
        (f"precision.{p}.{k}", v) for p, f in precision.items() for k, v in f.items()
    ]
    for field, v in items:
        name = field.rsplit(".", 1)[-1]
        if name in _FRACTIONS and not 0.0 < v <= 1.0:
            raise EngineError(f"{origin}: profile.{field} = {v!r} must be in (0, 1]")
        if name in _UNIT and not 0.0 <= v <= 1.0:
            raise EngineError(f"{origin}: profile.{field} = {v!r} must be in [0, 1]")
        if name in _POSITIVE and not v > 0.0:
            raise EngineError(f"{origin}: profile.{field} = {v!r} must be > 0")
        if v < 0.0:
            raise EngineError(f"{origin}: profile.{field} = {v!r} must be >= 0")


def _read(text: str, origin: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise EngineError(f"{origin}: not a valid TOML file: {err}") from None


def from_file(path, **scheduler) -> Engine:
    """An engine read from a profile file (as ``Engine.save`` or ``dcost calibrate`` write)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise EngineError(f"engine profile {str(path)!r}: no such file")
    data = _read(path.read_text(encoding="utf-8"), str(path))
    return _engine_from(data, str(path), scheduler)


def _engine_from(data: Mapping, origin: str, scheduler: Mapping) -> Engine:
    head = data.get("engine")
    if not isinstance(head, Mapping) or not {"name", "version", "hardware"} <= set(head):
        raise EngineError(
            f"{origin}: an [engine] table with name, version and hardware is required"
        )
    name = _name(str(head["name"]))
    shared, precision, provenance = _parse_profile(data, origin)
    base = default_scheduler(name, str(head["hardware"]))
    return Engine(
        name=name,
        version=str(head["version"]),
        hardware_name=str(head["hardware"]),
        profile=shared,
        precision_profile=precision,
        provenance=provenance,
        scheduler=_settings(base, scheduler),
    )


def _settings(base: Scheduler, overrides: Mapping) -> Scheduler:
    allowed = [f.name for f in dataclasses.fields(Scheduler)]
    for k in overrides:
        if k not in allowed:
            raise EngineError(f"unknown scheduler setting {k!r}; allowed: {', '.join(allowed)}")
    return dataclasses.replace(base, **overrides)


def _name(name: str) -> str:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in ENGINE_NAMES:
        raise EngineError(f"unknown engine {name!r}; known: {', '.join(ENGINE_NAMES)}")
    return key


def _hardware_key(hardware) -> str:
    if isinstance(hardware, str):
        from dcost import presets

        presets.hardware_card(hardware)  # an unknown name: PresetError listing the known ones
        return hardware
    raise EngineError(
        f"engine: hardware must be a hardware preset name (see dcost.hardware_names()), got "
        f"{type(hardware).__name__}"
    )


@functools.cache
def _load_shipped(file_name: str) -> Engine:
    f = resources.files(__name__).joinpath(_DIR).joinpath(file_name)
    return _engine_from(_read(f.read_text(encoding="utf-8"), file_name), file_name, {})


def engine(
    name: str,
    hardware: str,
    version: str | None = None,
    profile=None,
    **scheduler,
) -> Engine:
    """A serving engine on a chip, from the shipped profiles (or a profile file).

    Args:
      name: "vllm", "sglang" or "trtllm" ("tensorrt-llm" too); "vllm-0.19" names a version.
      hardware: a hardware preset name (``dcost.hardware_names()``).
      version: the engine version; None: the latest shipped for that chip. A prefix selects the
        latest version it starts ("0.19" -> "0.19.x"). An unshipped version raises
        ``EngineError`` listing the shipped ones.
      profile: a profile file written by ``Engine.save`` or ``dcost calibrate``; it replaces the
        shipped one (the name and chip must match the file's).
      **scheduler: scheduler settings (``Scheduler`` fields: ``max_num_seqs``,
        ``max_num_batched_tokens``, ``gpu_memory_utilization``, ``block_size``,
        ``prefix_caching``) that override the engine's defaults.

    Returns:
      An ``Engine``.

    >>> import dcost
    >>> dcost.engine("sglang", hardware="b200", max_num_seqs=256).scheduler.max_num_seqs
    256
    """
    if not isinstance(name, str):
        raise EngineError(f"engine: name must be a string, got {type(name).__name__}")
    given = name
    if version is None and "-" in name and name.lower() not in _ALIASES:
        name, version = name.split("-", 1)
    try:
        key = _name(name)
    except EngineError:
        raise EngineError(
            f"engine.name: unknown engine {given!r}; known: {', '.join(ENGINE_NAMES)} (a "
            "version may follow, e.g. 'vllm-0.19')"
        ) from None
    chip = _hardware_key(hardware)
    if profile is not None:
        eng = from_file(profile, **scheduler)
        if eng.name != key or eng.hardware_name != chip:
            raise EngineError(
                f"engine profile {str(profile)!r} is {eng.name} on {eng.hardware_name}, not "
                f"{key} on {chip}"
            )
        return eng
    rows = [r for r in _shipped() if r[0] == key and r[2] == chip]
    if not rows:
        have = sorted({r[2] for r in _shipped() if r[0] == key})
        raise EngineError(
            f"no shipped {key} profile for hardware {chip!r}; {key} ships profiles for: "
            f"{', '.join(have) or 'none'} (pure physics: engine=None; a family profile: "
            f"dcost.hardware({chip!r}, calibrated=True))"
        )
    if version is not None:
        version = str(version)
        match = [r for r in rows if r[1] == version or r[1].startswith(version + ".")]
        if not match:
            raise EngineError(
                f"no shipped {key} {version} profile for {chip}; shipped versions: "
                f"{', '.join(sorted({r[1] for r in rows}, key=_version_key))}"
            )
        rows = match
    row = max(rows, key=lambda r: _version_key(r[1]))
    eng = _load_shipped(row[3])
    if scheduler:
        eng = Engine(
            name=eng.name,
            version=eng.version,
            hardware_name=eng.hardware_name,
            profile=eng.profile,
            precision_profile=eng.precision_profile,
            provenance=eng.provenance,
            scheduler=_settings(eng.scheduler, scheduler),
        )
    return eng


def on_engine(engine, hardware: Hardware, model=None) -> Hardware:
    """The chip a cost function evaluates: ``hardware`` itself when ``engine`` is None (pure
    physics, or whatever profile the chip already carries), else
    ``engine.apply(hardware, model=model)``.

    An engine is a value for what runs on the chip; a name alone does not say which chip's
    profile to take, so it is refused with the call that does.
    """
    if engine is None:
        return hardware
    if isinstance(engine, Engine):
        return engine.apply(hardware, model=model)
    if isinstance(engine, str):
        raise EngineError(
            f"engine={engine!r}: pass dcost.engine({engine!r}, hardware=<preset name>) (a name "
            "alone does not say which chip's profile to use)"
        )
    raise EngineError(f"engine must be None or a dcost.Engine, got {type(engine).__name__}")


@functools.cache
def heldout() -> dict:
    """The shipped profiles' held-out error on AIConfigurator's silicon sample
    (``heldout.toml``, written by ``dcost calibrate --from-aiconfigurator``): ``{"tpot": {...},
    ...}`` with ``overall`` and ``by_engine`` / ``by_hardware`` / ``by_mode`` / ``by_model`` /
    ``by_concurrency`` tables of ``rows``, ``median``, ``p90`` and ``bias``."""
    text = resources.files(__name__).joinpath("heldout.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["silicon"]


def engine_error(name: str) -> dict:
    """Held-out TPOT error of engine ``name``'s profiles on the silicon sample (``heldout``):
    ``{"rows", "median", "p90", "bias"}``; the overall figures when it has no rows there."""
    table = heldout()["tpot"]
    return dict(table["by_engine"].get(_name(name), table["overall"]))


@functools.cache
def own_measurements() -> dict:
    """How a deployment's error falls with k of its own runs (``own_measurements.toml``, written
    by ``experiments/own_measurements.py``): ``{"k": ..., "by_engine": ..., "intervals":
    {engine: {k: band}}, "published": ...}``, the bands of ``dcost.calibrate.engines.band`` over
    the held-out log errors of calibrated deployments, and ``"published"`` the same curve on the
    validation set's published runs (``{"k": ..., "by_group": ...}``, groups of one source's runs
    on one chip under one engine)."""
    text = resources.files(__name__).joinpath("own_measurements.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["own"]


@functools.cache
def _ttft_bands() -> dict:
    text = resources.files(__name__).joinpath("ttft_bands.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["ttft"]["bands"]


def ttft_band(name: str, moe: bool, clients) -> dict | None:
    """How far measured mean TTFTs under load were from the simulated ones, for runs like this:
    the ratio ``measured / simulated`` of benchmark runs of engine ``name``, of a mixture of
    experts (``moe``) or a dense model, at ``clients`` closed-loop clients (16 or fewer:
    ``"light"``, else ``"heavy"``) (``ttft_bands.toml``, written by
    ``experiments/ttft_bands.py`` from AIConfigurator's silicon sample simulated as its
    benchmarks ran; its never-seen runs fell in their band 77 % of the time):
    ``{"q10", "q50", "q90", "runs", "pooled", "kind", "load"}``, ``q10``-``q90`` the band meant
    to hold 80 % of such runs and ``q50`` their median. None for an open loop (``clients``
    None: the runs were closed-loop benchmarks) or an engine without runs.

    >>> b = ttft_band("vllm", moe=True, clients=8)
    >>> b["load"], b["q10"] < b["q50"] < b["q90"], b["runs"] >= 8
    ('light', True, True)
    >>> ttft_band("vllm", moe=True, clients=None) is None
    True
    """
    if clients is None:
        return None
    if isinstance(clients, bool) or not isinstance(clients, (int, float)) or not clients >= 1:
        raise EngineError(
            f"ttft_band: clients = {clients!r} is not allowed: a number of clients >= 1, or None "
            "(an open loop)"
        )
    kind = "moe" if moe else "dense"
    load = "light" if clients <= 16 else "heavy"
    band = _ttft_bands().get(_name(name), {}).get(kind, {}).get(load)
    return None if band is None else {**band, "kind": kind, "load": load}


def _own_records(engine) -> int:
    """How many of a deployment's runs ``engine`` was calibrated on (``dcost.calibrate.fit``'s
    provenance); 0 for a shipped profile, and for one calibrated on runs of two or more
    architectures (``provenance["models"]``): that is not one deployment, and on the published
    runs of such groups the deployments' band held 46-48 % where the shipped profile's band
    held 84-86 % (``own_measurements()["published"]``; chosen on those runs)."""
    prov = engine.provenance or {}
    if not str(prov.get("source", "")).startswith("dcost.calibrate.fit"):
        return 0
    models = prov.get("models") or []
    if isinstance(models, (list, tuple)) and len(models) > 1:
        from dcost import presets

        known = [m for m in models if m in presets.model_names()]
        if len(known) < len(models) or len(set(presets.architectures(known).values())) > 1:
            return 0
    try:
        return max(int(prov.get("records", 0)), 0)
    except (TypeError, ValueError):
        return 0


def band_runs(engine) -> int:
    """The k whose band ``interval_factors`` puts around ``engine``'s predictions: the largest
    k (1, 3, 10) of ``own_measurements()["intervals"]`` at most the runs it was calibrated on
    (``_own_records``); 0 for the shipped profile's band (a shipped or hand-written profile,
    one calibrated on several architectures, or an engine without calibrated bands)."""
    n = _own_records(engine)
    bands = own_measurements().get("intervals", {}).get(_name(engine.name), {}) if n else {}
    return max((int(k) for k in bands if int(k) <= n), default=0)


def _spread(engine) -> dict:
    """The band table (quantiles of held-out ``log(predicted/measured)``) for ``engine``: a name
    or a shipped ``Engine``, the shipped profile's on a new model (``heldout()["intervals"]``);
    an ``Engine`` calibrated on ``n`` of a deployment's runs, the band of deployments calibrated
    on the largest ``k <= n`` of their runs (``own_measurements()["intervals"]``); one
    calibrated on several architectures' runs, the shipped profile's (``_own_records``)."""
    name = engine.name if isinstance(engine, Engine) else engine
    if not isinstance(name, str):
        raise EngineError(f"engine must be a name or a dcost.Engine, got {type(engine).__name__}")
    key = _name(name)
    k = band_runs(engine) if isinstance(engine, Engine) else 0
    if k:
        return own_measurements()["intervals"][key][str(k)]
    table = heldout()["intervals"].get(key)
    if table is None:
        raise EngineError(f"no held-out spread for engine {name!r} in the shipped summary")
    return table


_LEVELS = {0.5: ("q25", "q75"), 0.8: ("q10", "q90"), 0.9: ("q05", "q95")}


def interval_factors(engine, level: float = 0.8) -> tuple[float, float]:
    """``(low, high)`` factors on a prediction of ``engine``'s profile (a name or a
    ``dcost.Engine``) that bound a measurement with probability ``level`` (0.5, 0.8 or 0.9).

    A shipped profile's band is from the held-out errors of its engine's runs in the silicon
    sample, for a model its fixed costs never saw (``heldout()["intervals"]``); a profile
    calibrated on ``n`` of a deployment's own runs (``dcost.calibrate.fit``) gets the narrower
    band of deployments calibrated on ``k <= n`` of theirs, for their other runs
    (``own_measurements()["intervals"]``: it is meant for the deployment you calibrated, not
    another model); a profile calibrated on runs of several architectures gets the shipped
    band. Each table reports its coverage, checked nested, beside it.

    With ``r = log(predicted/measured)``: ``low = exp(-q_{(1+a)/2}(r))``, ``high =
    exp(-q_{(1-a)/2}(r))``.

    >>> lo, hi = interval_factors("vllm", 0.8)
    >>> lo < 1.0 < hi
    True
    """
    if level not in _LEVELS:
        raise EngineError(
            f"interval level = {level!r} is not allowed: one of {', '.join(map(str, _LEVELS))}"
        )
    table = _spread(engine)
    q_lo, q_hi = _LEVELS[level]
    return math.exp(-table[q_hi]), math.exp(-table[q_lo])


def confidence_factor(engine, confidence: float) -> float:
    """How much slower than predicted to plan so that step times hold with probability
    ``confidence`` (0.5, 0.75, 0.9 or 0.95): ``exp(-q_{1-c}(r))`` of the held-out
    ``r = log(predicted/measured)`` of ``engine`` (a name or a ``dcost.Engine``; the table
    ``interval_factors`` reads); below 1 where the profile is slow at that quantile.

    >>> confidence_factor("vllm", 0.9) > confidence_factor("vllm", 0.5)
    True
    """
    keys = {0.5: "q50", 0.75: "q25", 0.9: "q10", 0.95: "q05"}
    if confidence not in keys:
        raise EngineError(
            f"confidence = {confidence!r} is not allowed: one of {', '.join(map(str, keys))}"
        )
    return math.exp(-_spread(engine)[keys[confidence]])


def slower(hardware: Hardware, factor: float) -> Hardware:
    """The chip ``factor`` times slower at everything: its rates divided by ``factor``, its
    fixed costs and link latencies multiplied by it. Every step time of the serving model is
    homogeneous of degree one in (1/rates, costs, latencies), so each scales by ``factor``
    exactly (memory and prices are untouched).

    >>> import dcost
    >>> h = dcost.engine("vllm", hardware="h100-sxm").apply(dcost.hardware("h100-sxm"))
    >>> d, m, w = dcost.Design(batch=8, chips=2), dcost.model("llama-3-8b"), dcost.Workload(512)
    >>> a = float(dcost.decode(d, slower(h, 1.5), m, w).tpot)
    >>> round(a / float(dcost.decode(d, h, m, w).tpot), 6)
    1.5
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise EngineError(f"slower: factor = {factor!r} must be a number > 0")
    rates = ("flops", "hbm_bandwidth", "scaleup_bandwidth", "scaleout_bandwidth")
    times = (
        "step_overhead",
        "layer_overhead",
        "sequence_overhead",
        "prefill_step_overhead",
        "scaleup_latency",
        "scaleout_latency",
        "expert_overhead",
        "moe_layer_overhead",
        "moe_ep_overhead",
        "index_layer_overhead",
        "eager_moe_layer_overhead",
        "gemm_overhead",
    )
    values = {n: getattr(hardware, n) / factor for n in rates}
    if hardware.attention_flops is not None:
        values["attention_flops"] = hardware.attention_flops / factor
    values.update(
        {n: getattr(hardware, n) * factor for n in times if getattr(hardware, n) is not None}
    )
    names = tuple(values)
    return eqx.tree_at(
        lambda h: tuple(getattr(h, n) for n in names), hardware, tuple(values[n] for n in names)
    )


def resolve(value, hardware_name: str | None = None) -> Engine | None:
    """An ``engine=`` argument as an ``Engine``: None stays None (pure physics), an ``Engine``
    is itself, a string "vllm" or "vllm-0.24" is looked up on ``hardware_name``."""
    if value is None or isinstance(value, Engine):
        return value
    if isinstance(value, str):
        if hardware_name is None:
            raise EngineError(
                f"engine={value!r} names an engine but not its chip: pass "
                f"dcost.engine({value!r}, hardware=...) instead"
            )
        return engine(value, hardware=hardware_name)
    raise EngineError(
        f"engine must be None, a dcost.Engine or an engine name, got {type(value).__name__}"
    )


class _CallableModule(types.ModuleType):
    """This subpackage, callable: ``dcost.engines()`` is ``dcost.engines.engines()`` (the public
    contract names both the listing and the subpackage ``dcost.engines``)."""

    def __call__(self) -> list[tuple[str, str, str]]:
        return engines()


sys.modules[__name__].__class__ = _CallableModule
