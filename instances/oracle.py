"""The simulator's truth: how long one iteration of a job really takes on a shape.

``Oracle.true_iteration_time(job, shape) -> float | None`` (None: infeasible — does not
fit in memory, or slower than ``max_iteration_time_s``, Arena's 300 s cap by default).

Two table-driven oracles, both built from the measured table
(``instances/data/arena/measured_iter_times.csv``):

``TableOracle`` (ours). Exact lookup when (model, batch, GPU type, nodes, GPUs/node) is
measured. Otherwise an approximation, fitted on the table, in two parts:

1. A log-linear *prior* per model family (gpt, moe, wide_resnet), least squares over
   the measured feasible rows::

       log2 t = u[model] + gamma*log2(batch) + s[gpu type] - beta*log2(GPUs) + kappa*log2(nodes)

   ``u`` is one offset per measured model; a model with no rows takes the nearest
   measured size of its family (by FLOPs per sample) scaled by the ratio of FLOPs per
   sample (instances.models ModelArch.fwd_flops_per_sample). A GPU type with no rows
   takes the measured type closest in spec speed and scales by the spec ratio
   ``(fp16 FLOP/s ratio)**w * (memory bandwidth ratio)**(1-w)`` (w = 0.5 by default).
   A family with no rows (llama, tiny-*) uses the gpt family's coefficients (a decoder
   stack), wide_resnet's for CNNs.
2. A *residual correction* (kernel smoothing): the weighted mean of the prior's
   residuals on measured rows near the queried key — the same (model, batch, type) at
   other GPU counts/localities weigh most, other types, batches and sizes less; the
   weight decays with the distance in log2(GPUs) and log2(GPUs per node) and is shrunk
   towards 0 when there is little nearby data.

   Extrapolated values are made monotone in the GPU count: at a fixed number of GPUs
   per node, an unmeasured shape is never faster than the same type with twice the
   nodes (``t(n, g) >= t(2n, g)``).

Memory feasibility of an unmeasured key (in this order): fits if the same (model,
batch) fit on at most as many GPUs of a type with at most as much memory (the same
type included); does not fit if it did not fit on at least as many GPUs of a type with
at least as much memory; otherwise a model-state rule: ``bytes_per_param * params /
GPUs <= usable_fraction * GPU memory`` (16 B/param: fp16 weights and gradients plus
fp32 master weights and two Adam moments, fully sharded across the stages and tensor
ranks of the best plan; activations assumed traded by micro-batching). The measured
out-of-memory rows stay infeasible.

``ArenaRuleOracle`` replays the Arena artifact's own rule for missing keys, for
faithful replications: a measured shape with GPUs spread over more nodes ("relaxed
locality") times 0.9 per halving of GPUs per node (and, in the other direction, divided
by 0.9), else a measured smaller model of the family times 1.8 per size step; else
infeasible.

``estimators.evaluation.oracle_loo`` (``bench/bench_oracle.py``) measures both rules by
leave-one-out over the measured rows.

Values are cached per key and deterministic; optional multiplicative log-normal noise
(``noise_std``, mean 1) is seeded per (seed, key), so the same key always gets the same
noisy value within and across runs.
"""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

import numpy as np

from .gpus import canonical_gpu_name, get_gpu
from .grid import Shape
from .jobs import Job
from .measurements import MeasuredIterTime, load_measured_iter_times
from .memory_rule import ADAM_STATE_BYTES_PER_PARAM
from .models import MODELS, canonical_model_name, get_model
from .registry import Registry

Key = tuple[str, int, str, int, int]     # (model, global batch, GPU type, nodes, GPUs per node)


@runtime_checkable
class Oracle(Protocol):
    # the training runtime the truth was measured under (``estimators.perf.RUNTIMES``
    # names it): a simulation's policies estimate for it unless told otherwise
    training_runtime: str

    def true_iteration_time(self, job: Job, shape: Shape) -> float | None:
        """Seconds per iteration of ``job`` on ``shape``; None = infeasible."""
        ...


@dataclass(frozen=True)
class OracleConfig:
    """Every knob of the table oracles (all read; validated)."""
    max_iteration_time_s: float = 300.0      # Arena's cap: slower counts as infeasible
    noise_std: float = 0.0                   # std of log of the multiplicative noise
    seed: int = 0
    # memory rule for unmeasured keys
    model_state_bytes_per_param: float = ADAM_STATE_BYTES_PER_PARAM   # 16 (memory_rule)
    activation_memory_fraction: float = 0.01 # share of a full batch's activations held at once
    usable_memory_fraction: float = 1.0
    # transfer to unmeasured GPU types
    spec_flops_weight: float = 0.5           # exponent of the fp16 FLOP/s ratio; 1-w on bandwidth
    # residual correction (kernel weights)
    residual_shrinkage: float = 0.1          # pseudo-weight of "no correction"
    other_type_weight: float = 0.05
    other_batch_weight: float = 0.8
    other_model_weight: float = 0.03
    gpus_length: float = 0.5                 # weight decays by e per this many doublings of GPUs
    locality_length: float = 0.5             # ... and per this many doublings of GPUs per node
    ridge: float = 1e-3                      # ridge penalty of the prior's least squares
    monotone_max_gpus: int = 4096            # monotone clamp looks up to this many GPUs
    # Arena's rule
    arena_locality_factor: float = 0.9
    arena_size_step_factor: float = 1.8

    def __post_init__(self):
        for f in ("max_iteration_time_s", "model_state_bytes_per_param", "gpus_length", "locality_length"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"OracleConfig.{f} must be a positive finite number, got {v!r}")
        for f in ("noise_std", "activation_memory_fraction", "residual_shrinkage", "other_type_weight",
                  "other_batch_weight",
                  "other_model_weight", "ridge"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"OracleConfig.{f} must be a finite number >= 0, got {v!r}")
        if not 0 < self.usable_memory_fraction <= 1:
            raise ValueError("OracleConfig.usable_memory_fraction must be in (0, 1]")
        if not 0 <= self.spec_flops_weight <= 1:
            raise ValueError("OracleConfig.spec_flops_weight must be in [0, 1]")
        if not 0 < self.arena_locality_factor <= 1 or not self.arena_size_step_factor >= 1:
            raise ValueError("OracleConfig: arena_locality_factor in (0, 1], arena_size_step_factor >= 1")
        if not isinstance(self.monotone_max_gpus, int) or self.monotone_max_gpus < 1:
            raise ValueError("OracleConfig.monotone_max_gpus must be a positive integer")
        if not isinstance(self.seed, int):
            raise ValueError("OracleConfig.seed must be an integer")


def spec_speed(gpu_type: str, flops_weight: float) -> float:
    """Approximate relative training speed of a GPU type from its catalog specs."""
    g = get_gpu(gpu_type)
    return g.fp16_flops ** flops_weight * g.memory_bw_bytes_per_s ** (1.0 - flops_weight)


_SIZE_LABEL = re.compile(r"^(\d+(?:\.\d+)?)([MB])$")


def memory_param_count(model: str) -> float:
    """Parameters for the memory rule: the size label when it is a number (``6.8B``),
    else the catalog's derived count. Labels win because the measured table is about the
    labelled models, and some derived counts are far off (wide_resnet__6.8B derives to
    76B parameters, yet the table shows it training on 8 x 48 GB)."""
    m = _SIZE_LABEL.match(get_model(model).size)
    if m:
        return float(m.group(1)) * (1e6 if m.group(2) == "M" else 1e9)
    return float(get_model(model).param_count)


def _family_of(model: str) -> str:
    return get_model(model).base_family


class _TableOracleBase:
    """Exact lookup, cap, noise and cache; subclasses supply ``_extrapolate``."""

    # the Arena artifact's runtime (rematerialisation, a sharded optimizer): the one its
    # measured table was taken under, and so every extrapolation from it
    training_runtime = "arena"

    def __init__(self, rows: Iterable[MeasuredIterTime] | None = None,
                 config: OracleConfig | None = None, **overrides):
        base = config or OracleConfig()
        if overrides:
            base = OracleConfig(**{**vars(base), **overrides})
        self.config = base
        self.rows: tuple[MeasuredIterTime, ...] = tuple(load_measured_iter_times() if rows is None else rows)
        self._exact: dict[Key, float | None] = {r.key: r.iter_time_s for r in self.rows}
        self._cache: dict[Key, float | None] = {}
        self._by_model: dict[str, list[MeasuredIterTime]] = {}
        for r in self.rows:
            self._by_model.setdefault(r.model, []).append(r)

    # -- public ----------------------------------------------------------------------
    def true_iteration_time(self, job: Job, shape: Shape) -> float | None:
        return self.iteration_time(job.model, job.global_batch, shape)

    def iteration_time(self, model: str, global_batch: int, shape: Shape) -> float | None:
        key = (model, int(global_batch), shape.gpu_type, shape.num_nodes, shape.gpus_per_node)
        try:
            return self._cache[key]
        except KeyError:
            pass
        key = (canonical_model_name(model), int(global_batch), canonical_gpu_name(shape.gpu_type),
               shape.num_nodes, shape.gpus_per_node)
        if key not in self._cache:
            t = self._noiseless(key)
            t = None if t is None else float(t)
            if t is not None and self.config.noise_std > 0:
                t *= self._noise_factor(key)
            if t is not None and not t <= self.config.max_iteration_time_s:
                t = None
            self._cache[key] = t
        value = self._cache[key]
        self._cache[(model, int(global_batch), shape.gpu_type, shape.num_nodes, shape.gpus_per_node)] = value
        return value

    @property
    def cache_size(self) -> int:
        """How many lookups ``iteration_time`` has kept (each as asked and by its canonical
        names): it grows with the distinct (model, batch, shape) asked, not with the calls."""
        return len(self._cache)

    def is_measured(self, model: str, global_batch: int, shape: Shape) -> bool:
        key = (canonical_model_name(model), int(global_batch), canonical_gpu_name(shape.gpu_type),
               shape.num_nodes, shape.gpus_per_node)
        return key in self._exact

    # -- internals -------------------------------------------------------------------
    def _noiseless(self, key: Key) -> float | None:
        if key in self._exact:
            return self._exact[key]
        return self._extrapolate(key)

    def _extrapolate(self, key: Key) -> float | None:       # pragma: no cover - abstract
        raise NotImplementedError

    def _noise_factor(self, key: Key) -> float:
        seq = np.random.SeedSequence([self.config.seed & 0xFFFFFFFF, zlib.crc32(repr(key).encode())])
        z = np.random.default_rng(seq).standard_normal()
        s = self.config.noise_std
        return float(math.exp(s * z - 0.5 * s * s))


# ------------------------------------------------------------------------------------
# Our rule: fitted log-linear prior + residual kernel correction + memory rule.
# ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _FamilyFit:
    family: str
    model_offset: dict            # model -> u (log2 s)
    type_offset: dict             # gpu type -> s (log2 s), measured types only
    gamma: float                  # log2 batch coefficient
    beta: float                   # -log2 GPUs coefficient
    kappa: float                  # log2 nodes coefficient


def _fit_family(family: str, rows: list[MeasuredIterTime], ridge: float) -> _FamilyFit:
    models = sorted({r.model for r in rows})
    types = sorted({r.gpu_type for r in rows})
    ref_type = "a100-40gb" if "a100-40gb" in types else types[0]
    free_types = [t for t in types if t != ref_type]
    nm, nt = len(models), len(free_types)
    ncol = nm + nt + 3
    X = np.zeros((len(rows), ncol))
    y = np.zeros(len(rows))
    for i, r in enumerate(rows):
        X[i, models.index(r.model)] = 1.0
        if r.gpu_type != ref_type:
            X[i, nm + free_types.index(r.gpu_type)] = 1.0
        X[i, nm + nt] = math.log2(r.global_batch)
        X[i, nm + nt + 1] = -math.log2(r.num_gpus)
        X[i, nm + nt + 2] = math.log2(r.num_nodes)
        y[i] = math.log2(r.iter_time_s)
    # Centre the batch feature so the ridge does not pull the model offsets.
    bmean = X[:, nm + nt].mean()
    X[:, nm + nt] -= bmean
    if ridge > 0:
        X = np.vstack([X, math.sqrt(ridge) * np.eye(ncol)])
        y = np.concatenate([y, np.zeros(ncol)])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    gamma = float(coef[nm + nt])
    u = {m: float(coef[i]) - gamma * bmean for i, m in enumerate(models)}
    s = {ref_type: 0.0}
    s.update({t: float(coef[nm + i]) for i, t in enumerate(free_types)})
    return _FamilyFit(family, u, s, gamma, float(coef[nm + nt + 1]), float(coef[nm + nt + 2]))


class TableOracle(_TableOracleBase):
    """Measured table + our fitted extrapolation rule (see the module docstring)."""

    name = "table"

    def __init__(self, rows: Iterable[MeasuredIterTime] | None = None,
                 config: OracleConfig | None = None, **overrides):
        super().__init__(rows, config, **overrides)
        self._mono_cache: dict[Key, float | None] = {}
        feasible = [r for r in self.rows if r.feasible]
        by_family: dict[str, list[MeasuredIterTime]] = {}
        for r in feasible:
            by_family.setdefault(_family_of(r.model), []).append(r)
        self._fits = {f: _fit_family(f, rs, self.config.ridge) for f, rs in by_family.items()}
        # residuals of the prior on every feasible measured row, per family, as arrays
        self._res: dict[str, dict[str, np.ndarray | list]] = {}
        for f, rs in by_family.items():
            res = np.array([math.log2(r.iter_time_s) - self._prior(r.model, r.global_batch, r.gpu_type,
                                                                  r.num_nodes, r.gpus_per_node)
                            for r in rs])
            self._res[f] = {
                "model": np.array([r.model for r in rs]), "batch": np.array([r.global_batch for r in rs]),
                "type": np.array([r.gpu_type for r in rs]),
                "lg_gpus": np.log2([r.num_gpus for r in rs]),
                "lg_gpn": np.log2([r.gpus_per_node for r in rs]), "res": res,
            }

    # -- the prior -------------------------------------------------------------------
    def _fit_for(self, model: str) -> _FamilyFit:
        fam = _family_of(model)
        if fam in self._fits:
            return self._fits[fam]
        arch = get_model(model)
        for fallback in (("gpt", "moe", "llama") if arch.is_transformer else ("wide_resnet",)):
            if fallback in self._fits:
                return self._fits[fallback]
        return next(iter(self._fits.values()))

    def _model_offset(self, fit: _FamilyFit, model: str) -> float:
        if model in fit.model_offset:
            return fit.model_offset[model]
        flops = get_model(model).fwd_flops_per_sample
        nearest = min(fit.model_offset,
                      key=lambda m: (abs(math.log2(get_model(m).fwd_flops_per_sample / flops)), m))
        return fit.model_offset[nearest] + math.log2(flops / get_model(nearest).fwd_flops_per_sample)

    def _type_offset(self, fit: _FamilyFit, gpu_type: str) -> float:
        if gpu_type in fit.type_offset:
            return fit.type_offset[gpu_type]
        w = self.config.spec_flops_weight
        speed = spec_speed(gpu_type, w)
        anchor = min(fit.type_offset, key=lambda t: (abs(math.log(spec_speed(t, w) / speed)), t))
        return fit.type_offset[anchor] - math.log2(speed / spec_speed(anchor, w))

    def _prior(self, model: str, batch: int, gpu_type: str, nodes: int, gpn: int) -> float:
        fit = self._fit_for(model)
        return (self._model_offset(fit, model) + fit.gamma * math.log2(batch)
                + self._type_offset(fit, gpu_type) - fit.beta * math.log2(nodes * gpn)
                + fit.kappa * math.log2(nodes))

    def _correction(self, model: str, batch: int, gpu_type: str, nodes: int, gpn: int) -> float:
        data = self._res.get(_family_of(model))
        if data is None:
            return 0.0
        c = self.config
        w = np.exp(-np.abs(data["lg_gpus"] - math.log2(nodes * gpn)) / c.gpus_length
                   - np.abs(data["lg_gpn"] - math.log2(gpn)) / c.locality_length)
        w *= np.where(data["model"] == model, 1.0, c.other_model_weight)
        w *= np.where(data["batch"] == batch, 1.0, c.other_batch_weight)
        w *= np.where(data["type"] == gpu_type, 1.0, c.other_type_weight)
        total = float(w.sum())
        if total <= 0:
            return 0.0
        return float((w * data["res"]).sum() / (c.residual_shrinkage + total))

    def predicted_log2(self, key: Key) -> float:
        """The fitted prior plus residual correction, log2 seconds (no memory check, no clamp)."""
        return self._prior(*key) + self._correction(*key)

    # -- memory ----------------------------------------------------------------------
    def fits_in_memory(self, key: Key) -> bool:
        if key in self._exact:
            return self._exact[key] is not None
        model, batch, gpu_type, nodes, gpn = key
        n = nodes * gpn
        mem = get_gpu(gpu_type).memory_bytes
        rows = self._by_model.get(model, ())
        # An out-of-memory row contradicted by a fit of the same or a larger batch on fewer
        # GPUs of the same type is a failed plan search, not a memory limit: not evidence.
        ooms = [r for r in rows if not r.feasible and not any(
            f.feasible and f.gpu_type == r.gpu_type and f.num_gpus <= r.num_gpus
            and f.global_batch >= r.global_batch for f in rows)]
        fits = [r for r in rows if r.feasible]
        # Evidence, nearest first: same batch and type; same batch; any batch (a larger
        # batch needs at least as much memory as a smaller one).
        for same_type, same_batch in ((True, True), (False, True), (False, False)):
            def keep(r):
                return (not same_type or r.gpu_type == gpu_type) and (not same_batch or r.global_batch == batch)
            if any(keep(r) and r.num_gpus <= n and r.global_batch >= batch
                   and get_gpu(r.gpu_type).memory_bytes <= mem for r in fits):
                return True
            if any(keep(r) and r.num_gpus >= n and r.global_batch <= batch
                   and get_gpu(r.gpu_type).memory_bytes >= mem for r in ooms):
                return False
        c = self.config
        arch = get_model(model)
        acts = sum(l.activation_bytes for l in arch.layers()) * batch * c.activation_memory_fraction
        need = (c.model_state_bytes_per_param * memory_param_count(model) + acts) / n
        return need <= c.usable_memory_fraction * mem

    # -- extrapolation ---------------------------------------------------------------
    def _extrapolate(self, key: Key) -> float | None:
        if not self.fits_in_memory(key):
            return None
        t = 2.0 ** self.predicted_log2(key)
        model, batch, gpu_type, nodes, gpn = key
        if 2 * nodes * gpn <= self.config.monotone_max_gpus:
            bigger = self._monotone_time((model, batch, gpu_type, 2 * nodes, gpn))
            if bigger is not None:
                t = max(t, bigger)
        return t

    def _monotone_time(self, key: Key) -> float | None:
        """Noiseless, uncapped time used by the monotone clamp (cached separately)."""
        if key not in self._mono_cache:
            self._mono_cache[key] = self._noiseless(key)
        return self._mono_cache[key]


# ------------------------------------------------------------------------------------
# Arena's rule (for faithful replays and as the baseline of bench/bench_oracle.py).
# ------------------------------------------------------------------------------------

def _family_sizes(family: str) -> list[str]:
    """Catalog models of a family, smallest first (by parameter count)."""
    return sorted((n for n, m in MODELS.items() if m.family == family), key=lambda n: MODELS[n].param_count)


class ArenaRuleOracle(_TableOracleBase):
    """Measured table + the Arena artifact's extrapolation rule (see the module docstring)."""

    name = "arena-rule"

    def _locality(self, key: Key) -> float | None:
        model, batch, gpu_type, nodes, gpn = key
        f = self.config.arena_locality_factor
        k, n, g = 0, nodes, gpn
        while g > 1 and g % 2 == 0:          # relax: spread over more nodes
            k, n, g = k + 1, n * 2, g // 2
            t = self._exact.get((model, batch, gpu_type, n, g))
            if t is not None:
                return t * f ** k
        k, n, g = 0, nodes, gpn
        while n > 1 and n % 2 == 0:          # compact: fewer, fuller nodes
            k, n, g = k + 1, n // 2, g * 2
            t = self._exact.get((model, batch, gpu_type, n, g))
            if t is not None:
                return t / f ** k
        return None

    def _extrapolate(self, key: Key) -> float | None:
        t = self._locality(key)
        if t is not None:
            return t
        model, batch, gpu_type, nodes, gpn = key
        arch = get_model(model)
        sizes = _family_sizes(arch.family)
        idx = sizes.index(model)
        for step in range(1, idx + 1):
            smaller = (sizes[idx - step], batch, gpu_type, nodes, gpn)
            t = self._exact.get(smaller)
            if t is None:
                t = self._locality(smaller)
            if t is not None:
                return t * self.config.arena_size_step_factor ** step
        return None


ORACLES: Registry[type] = Registry("oracle")
ORACLES.register("table")(TableOracle)
ORACLES.register("arena-rule")(ArenaRuleOracle)


def make_oracle(name: str = "table", **config) -> Oracle:
    """An oracle by registry name (``table``: ours; ``arena-rule``: the artifact's rule),
    configured with ``OracleConfig`` fields (e.g. ``noise_std=0.05, seed=1``)."""
    from .errors import InputError
    cls = ORACLES.get(name)
    try:
        return cls(config=OracleConfig(**config))
    except TypeError as e:
        raise InputError(f"bad oracle option: {e}", field="oracle") from None
    except ValueError as e:
        raise InputError(str(e), field="oracle") from None


__all__ = ["Oracle", "OracleConfig", "TableOracle", "ArenaRuleOracle", "ORACLES", "make_oracle", "spec_speed"]
