"""Profiler: time each distinct layer kind and the collectives with real torch.

What is measured and what is scaled:

- Layers. Each distinct (kind, signature) of a model is built from the launcher's own
  modules (``build_layer``: ``launcher.model``'s blocks and pipeline stages, cut to one
  tensor-parallel shard by ``launcher.parallelize.tp_shard`` with the launcher's
  ``tp_plan``; vocabulary rows or conv channels / tp where the launcher has no split) and run
  forward and backward on the local device (CUDA when present, else CPU) at each
  micro-batch size, median of ``repeats`` timed runs after ``warmup`` runs. When the layer
  is larger than ``ProfilerConfig`` allows (the CPU cannot run a 2048-wide, 1024-token
  block in a test), it is built at a reduced shape: hidden size, sequence, vocabulary,
  experts and channels are shrunk (the model catalog re-derives FLOPs for the reduced
  architecture), the achieved FLOP/s of the reduced shard is measured, and the full-size
  time is the full shard's FLOPs divided by that rate (``LayerProfile.scale`` = FLOP
  ratio; 1.0 = measured at full size). Small GEMMs run below a CPU's large-GEMM rate, so
  scaled times are pessimistic.
- Collectives: all-reduce, all-gather, reduce-scatter and send/recv over message sizes and
  group sizes, with torch.multiprocessing workers on 127.0.0.1 (gloo on CPU, NCCL on
  GPUs). Operations the backend lacks (gloo has no reduce-scatter) are reported as such.

Device-seconds are wall time x devices busy (1 per layer run; the group size per
collective run).
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace

from instances.arch import ModelArch
from instances.errors import InputError
from instances.limits import MAX_PROFILE_ACTIVATION_BYTES, available_cores, show_number

from .layers import layer_costs
from .profile_store import CollectiveProfile, LayerProfile, ProfileStore


@dataclass(frozen=True)
class ProfilerConfig:
    micro_batches: tuple[int, ...] = (1, 2)
    tp_degrees: tuple[int, ...] = (1, 2)
    warmup: int = 1
    repeats: int = 3
    max_hidden: int = 256            # transformer shapes above these are reduced (CPU)
    max_seq: int = 128
    max_vocab: int = 4096
    max_experts: int = 4
    max_channels: int = 256          # Wide-ResNet: last stage's output channels cap (32 x base channels)
    threads: int = 1                 # torch intra-op threads on CPU (reproducible timings)
    flush_cache_mib: int = 8         # written before each timed forward and backward so that a
                                     # layer does not find its weights and activations in cache from
                                     # its previous repetition (in a training step other layers ran
                                     # in between); 0: off. Default: twice this host's per-core L2;
                                     # triton.testing.do_bench clears the GPU's L2 the same way

    def __post_init__(self):
        for n in ("micro_batches", "tp_degrees"):
            v = getattr(self, n)
            if not v or any((not isinstance(x, int)) or x < 1 for x in v):
                raise InputError(f"must be a non-empty list of positive integers, got {v!r}", field=n)
        for n in ("warmup", "max_hidden", "max_seq", "max_vocab", "max_experts", "max_channels", "threads",
                  "flush_cache_mib"):
            if getattr(self, n) < 0 or (n not in ("warmup", "flush_cache_mib") and getattr(self, n) < 1):
                raise InputError("must be a positive integer", field=n)
        if self.repeats < 1:
            raise InputError("must be >= 1", field="repeats")


_CUDA_NAMES = (("h200", "h200"), ("h100", "h100-sxm"), ("a100-sxm4-80gb", "a100-80gb"), ("a100 80gb", "a100-80gb"),
               ("a100", "a100-40gb"), ("v100", "v100-32gb"), ("a40", "a40"), ("a10", "a10"), ("l20", "l20"))


def local_device() -> tuple[str, str]:
    """(catalog device name, torch device string) of this machine."""
    import torch
    if torch.cuda.is_available():
        raw = torch.cuda.get_device_name(0).lower()
        for needle, name in _CUDA_NAMES:
            if needle in raw:
                return name, "cuda"
        return raw.replace(" ", "-"), "cuda"
    return "cpu", "cpu"


def local_ranks() -> tuple[int, str]:
    """How many processes one measurement may run at once on this host, and what bounds it:
    the GPUs torch sees on CUDA, else the CPU cores this process may use
    (``instances.limits.available_cores``): more measures their sharing, not the work."""
    import torch
    if torch.cuda.is_available():
        return torch.cuda.device_count(), "GPU(s) torch sees"
    return available_cores(), "CPU core(s) this process may use"


def check_group_sizes(group_sizes, field: str = "group_sizes") -> None:
    """Collective groups this host can run: each of at least 2 processes and at most
    ``local_ranks()`` (a group of 100,000 spawned 100,000 torch processes)."""
    small = [n for n in group_sizes if n < 2]
    if small:
        raise InputError(f"a collective needs a group of at least 2 processes, got {small[0]}", field=field)
    cap, what = local_ranks()
    big = [n for n in group_sizes if n > cap]
    if big:
        raise InputError(f"a group of {show_number(big[0])} processes, more than the {cap} {what}: a collective of "
                         "more ranks than that measures their sharing, not the collective", field=field)


def check_micro_batches(arch: ModelArch, micro_batches, cfg: ProfilerConfig | None = None,
                        field: str = "micro_batches") -> None:
    """The largest micro-batch within ``MAX_PROFILE_ACTIVATION_BYTES`` of activations in
    ``arch``'s largest layer, at the shape the profiler runs it (reduced, tensor degree 1;
    the catalog's count, linear in the micro-batch)."""
    cfg = cfg or ProfilerConfig()
    mb = max(micro_batches, default=1)
    small = reduced_arch(arch, cfg, 1) if _needs_reduction(arch, cfg) else arch
    per_sample = max(c.activation_bytes for c in layer_costs(small, micro_batch=1, tp=1))
    most = int(MAX_PROFILE_ACTIVATION_BYTES // per_sample)
    if mb > most:                               # (compared as integers: a 400-digit count is no float)
        need = f"{per_sample * mb / 2**30:,.3g} GiB" if mb < 10**300 else "more bytes than a float holds"
        raise InputError(f"a micro-batch of {show_number(mb)} would hold about {need} of activations in one layer "
                         f"of {arch.name} as profiled, more than the {MAX_PROFILE_ACTIVATION_BYTES // 2**20} MiB a "
                         f"measurement may take: give at most {most:,}", field=field)


# -- reduced shapes -----------------------------------------------------------------
def reduced_arch(arch: ModelArch, cfg: ProfilerConfig, tp: int) -> ModelArch:
    """A smaller architecture whose layers have the same kinds (the catalog re-derives FLOPs)."""
    if arch.is_transformer:
        h = min(arch.hidden_size, cfg.max_hidden)
        head_dim = arch.hidden_size // arch.num_heads
        a = max(tp, min(arch.num_heads, h // max(head_dim, 1)) // tp * tp)
        while h % a:
            a -= tp
        kv = arch.kv_heads
        kv_r = max(tp, min(kv, a) // tp * tp) if arch.num_kv_heads else 0
        if kv_r and a % kv_r:
            kv_r = a
        ffn = max(tp, (arch.ffn * h // arch.hidden_size) // tp * tp)
        return replace(arch, hidden_size=h, num_heads=a, num_kv_heads=kv_r,
                       ffn_hidden_size=ffn if arch.ffn_hidden_size or h != arch.hidden_size else 0,
                       seq_len=min(arch.seq_len, cfg.max_seq), vocab_size=max(tp, min(arch.vocab_size, cfg.max_vocab)),
                       num_experts=min(arch.num_experts, cfg.max_experts))
    # Wide-ResNet: shrink the base channel count (every stage's widths scale with it); the
    # image size is kept so that every stage's spatial size stays as in the full model.
    return replace(arch, num_channels=max(tp, min(arch.num_channels, cfg.max_channels // 32)),
                   num_classes=min(arch.num_classes, 256))


def _needs_reduction(arch: ModelArch, cfg: ProfilerConfig) -> bool:
    if arch.is_transformer:
        return (arch.hidden_size > cfg.max_hidden or arch.seq_len > cfg.max_seq or arch.vocab_size > cfg.max_vocab
                or arch.num_experts > cfg.max_experts)
    return arch.num_channels > cfg.max_channels // 32


# -- torch modules of one tensor-parallel shard --------------------------------------
def run_dtype(arch: ModelArch, device: str) -> str:
    """The dtype the profiler runs: the model's on CUDA; float32 on CPU (CPUs have no fast
    fp16 GEMM). Records carry the dtype that ran, so CPU profiles serve fp32 models only."""
    return arch.dtype if device == "cuda" else "float32"


def _end_stage(arch: ModelArch, kind: str, tp: int):
    """The launcher's ``Transformer`` as a pipeline stage holding only its embeddings
    (``kind`` "embedding": ``FIRST_STAGE``) or only its final norm and output head ("head":
    ``LAST_STAGE``), no decoder layer. At ``tp`` > 1 the token embedding's rows / the
    head's output columns are cut to a 1/tp vocabulary slice: the vocabulary-parallel
    layout ``layers.py`` charges for the Arena runtime. The launcher itself keeps both whole
    on every tensor rank, and its estimate times them with the tp = 1 records
    (``EfficiencyConfig.tp_replicated_embedding_head``)."""
    import torch
    from torch import nn

    from launcher.model import Transformer, loss_fn
    from launcher.parallelize import tp_shard
    stage = Transformer(replace(arch, num_layers=1))
    del stage.layers["0"]
    for name in stage.LAST_STAGE if kind == "embedding" else stage.FIRST_STAGE:
        setattr(stage, name, None)
    if kind == "embedding":
        if tp > 1:
            stage.tok_embeddings = nn.Embedding.from_pretrained(
                stage.tok_embeddings.weight.detach().chunk(tp)[0].clone(), freeze=False)
        return stage

    if tp > 1:
        tp_shard(stage, {"output": "colwise"}, tp)

    class LastStage(nn.Module):
        """The last stage and the launcher's loss, as its pipeline schedule runs them."""

        def __init__(self):
            super().__init__()
            self.stage = stage

        def forward(self, x):
            logits = self.stage(x)
            return loss_fn(logits, torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device))

    return LastStage()


def build_layer(arch: ModelArch, index: int, tp: int, dtype: str):
    """``(module, make_input)``: layer ``index`` of ``arch`` as one of ``tp`` tensor ranks
    computes it, built from the launcher's own modules (``launcher.model``), so that what
    is timed is what the launcher trains:

    - decoder / moe_decoder: ``launcher.model.Block`` (GPT: LayerNorm, GELU; Llama:
      RMSNorm, rotary positions, SwiGLU, grouped-query attention; MoE: the launcher's
      experts), sharded by ``launcher.parallelize.tp_shard`` with the same ``tp_plan`` that
      ``apply_tp`` uses;
    - embedding / head: the launcher's first / last pipeline stage (``_end_stage``), the
      head with the launcher's loss;
    - Wide-ResNet: ``Bottleneck`` and ``conv_stem`` (GroupNorm, as the launcher trains
      them) and the classifier linear. The launcher has no tensor-parallel convolution; a
      tp > 1 shard keeps 1/tp of every convolution's output channels (the estimators'
      Alpa-style channel sharding, an approximation).
    """
    import torch
    from torch import nn

    from launcher.model import Block, Bottleneck, conv_stem, has_shortcut
    from launcher.parallelize import tp_plan, tp_shard
    spec = arch.layers()[index]
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    if spec.kind in ("decoder", "moe_decoder"):
        mod = tp_shard(Block(arch), tp_plan(arch), tp)
        make = lambda mb: torch.randn(mb, arch.seq_len, arch.hidden_size, dtype=dt, requires_grad=True)
    elif spec.kind == "embedding":
        mod = _end_stage(arch, "embedding", tp)
        vocab = mod.tok_embeddings.num_embeddings
        make = lambda mb: torch.randint(0, vocab, (mb, arch.seq_len))
    elif spec.kind == "head":
        mod = _end_stage(arch, "head", tp)
        make = lambda mb: torch.randn(mb, arch.seq_len, arch.hidden_size, dtype=dt, requires_grad=True)
    elif spec.kind == "bottleneck":
        cin, filters, wide, cout, hw, stride, _ = spec.signature
        f, w, co = (max(1, c // tp) for c in (filters, wide, cout))
        mod = Bottleneck(cin, f, w, co, stride, shortcut=has_shortcut(cin, cout, stride))
        make = lambda mb: torch.randn(mb, cin, hw, hw, dtype=dt, requires_grad=True)
    elif spec.kind == "conv_stem":
        c0, img, _ = spec.signature
        mod = conv_stem(max(1, c0 // tp))
        make = lambda mb: torch.randn(mb, 3, img, img, dtype=dt)
    elif spec.kind == "classifier":
        cin, ncls, _ = spec.signature
        mod = nn.Linear(cin, max(1, ncls // tp))          # launcher.model.WideResNet.classifier
        make = lambda mb: torch.randn(mb, cin, dtype=dt, requires_grad=True)
    else:
        raise ValueError(f"no profiler module for layer kind {spec.kind!r}")
    return mod.to(dt), make


@dataclass(frozen=True)
class LayerTiming:
    """What ``time_layer`` measures: median forward and backward times after a cache
    flush (``fwd_s``, ``bwd_s``) and repeated at once without one (``warm_*``: the layer's
    data still in cache from the pass just before), and the layer's working set — its
    parameters and gradients (``param_bytes`` each) and what autograd saves for backward
    plus the input (``saved_bytes``)."""
    fwd_s: float
    bwd_s: float
    warm_fwd_s: float
    warm_bwd_s: float
    param_bytes: float
    saved_bytes: float


def time_layer(mod, make, mb: int, cfg: ProfilerConfig, device: str) -> LayerTiming:
    import torch
    mod = mod.to(device)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    flush_buf = torch.empty(cfg.flush_cache_mib * 2**20 // 4, device=device) if cfg.flush_cache_mib else None

    def flush():
        if flush_buf is not None:
            flush_buf.fill_(1.0)
        sync()

    def fwd_bwd(x, cold: bool) -> tuple[float, float]:
        if cold:
            flush()
        t0 = time.perf_counter()
        y = mod(x)
        sync()
        f_s = time.perf_counter() - t0
        loss = y.float().sum()
        if cold:
            flush()
        t0 = time.perf_counter()
        loss.backward()
        sync()
        b_s = time.perf_counter() - t0
        mod.zero_grad(set_to_none=True)
        return f_s, b_s

    fw, bw, wfw, wbw = [], [], [], []
    for it in range(cfg.warmup + cfg.repeats):
        x = make(mb)
        x = x.to(device) if not x.requires_grad else x.detach().to(device).requires_grad_(True)
        f_s, b_s = fwd_bwd(x, True)
        wf_s, wb_s = fwd_bwd(x, False)          # again at once: what a cache-resident step sees
        if it >= cfg.warmup:
            fw.append(f_s)
            bw.append(b_s)
            wfw.append(wf_s)
            wbw.append(wb_s)
    saved: dict[int, int] = {}

    def pack(t):
        saved[id(t)] = t.numel() * t.element_size()
        return t

    x = make(mb)
    x = x.to(device) if not x.requires_grad else x.detach().to(device).requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = mod(x)
    saved.setdefault(id(x), x.numel() * x.element_size())
    del y
    param_bytes = sum(p.numel() * p.element_size() for p in mod.parameters())
    return LayerTiming(statistics.median(fw), statistics.median(bw), statistics.median(wfw), statistics.median(wbw),
                       float(param_bytes), float(sum(saved.values())))


def profile_layers(arch: ModelArch, *, store: ProfileStore | None = None, cfg: ProfilerConfig | None = None,
                   reuse: bool = True) -> dict:
    """Profile every distinct layer of ``arch``; returns the records and device-seconds.
    Layers whose (kind, signature, tp, micro-batch) the store already holds are reused."""
    import torch
    cfg = cfg or ProfilerConfig()
    dev_name, dev = local_device()
    dtype = run_dtype(arch, dev)
    if dev == "cpu":
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    records, reused, spent = [], 0, 0.0
    seen = set()
    for tp in cfg.tp_degrees:
        if arch.is_transformer and (arch.num_heads % tp or arch.kv_heads % tp):
            continue
        full = layer_costs(arch, micro_batch=1, tp=tp)
        small_arch = reduced_arch(arch, cfg, tp) if _needs_reduction(arch, cfg) else arch
        small = layer_costs(small_arch, micro_batch=1, tp=tp)
        if len(small) != len(full):
            raise RuntimeError(f"reduced architecture of {arch.name} changed the layer count")
        for i, spec in enumerate(arch.layers()):
            key = (spec.kind, spec.signature, tp)
            if key in seen:
                continue
            seen.add(key)
            mod = make = None
            for mb in cfg.micro_batches:
                if reuse and store is not None and store.get_layer(dev_name, dtype, spec.kind, spec.signature,
                                                                   tp, mb):
                    reused += 1
                    continue
                if mod is None:
                    mod, make = build_layer(small_arch, i, tp, dtype)
                t0 = time.perf_counter()
                timing = time_layer(mod, make, mb, cfg, dev)
                f_s, b_s = timing.fwd_s, timing.bwd_s
                spent += time.perf_counter() - t0
                sf, sb = small[i].fwd_flops * mb, small[i].bwd_flops * mb
                ff, fb = full[i].fwd_flops * mb, full[i].bwd_flops * mb
                # memory-bound layers (embedding: 0 FLOPs) scale by bytes instead
                if sf <= 0:
                    sf, sb = small[i].fwd_bytes * mb, small[i].bwd_bytes * mb
                    ff, fb = full[i].fwd_bytes * mb, full[i].bwd_bytes * mb
                ratio = ff / sf
                rate_f, rate_b = sf / f_s, sb / b_s
                shape = (f"h={small_arch.hidden_size},s={small_arch.seq_len},heads={small_arch.num_heads}"
                         if arch.is_transformer else f"channels={small_arch.num_channels},img={small_arch.image_size}")
                if full[i].fwd_flops <= 0:   # store rates in FLOP units of the timer (0 FLOPs: use time)
                    rate_f = rate_b = math.inf
                records.append(LayerProfile(dev_name, dtype, spec.kind, tuple(spec.signature), tp, mb,
                                            f_s * ratio, b_s * (fb / sb), rate_f, rate_b, shape, f_s, b_s, ratio,
                                            cfg.repeats, f_s + b_s, warm_fwd_s=timing.warm_fwd_s * ratio,
                                            warm_bwd_s=timing.warm_bwd_s * (fb / sb),
                                            param_bytes=timing.param_bytes, saved_bytes=timing.saved_bytes,
                                            flush_bytes=float(cfg.flush_cache_mib * 2**20)))
    if store is not None and records:
        store.put_layers([r for r in records if math.isfinite(r.fwd_flops_per_s)])
    step = None
    if store is None or not reuse or dtype not in store.steps(dev_name):
        t0 = time.perf_counter()
        step = _time_optimizer_step(small_arch if _needs_reduction(arch, cfg) else arch, dtype, dev, cfg)
        spent += time.perf_counter() - t0
        if store is not None:
            store.put_step(dev_name, dtype, **step)
    return {"device": dev_name, "records": records, "reused": reused, "device_seconds": spent, "step": step}


def _time_optimizer_step(arch: ModelArch, dtype: str, device: str, cfg: ProfilerConfig) -> dict:
    """Adam step + zero_grad over the parameters of every layer of ``arch`` (the launcher's
    modules, ``build_layer`` at tp = 1), the per-iteration work outside the layers."""
    import torch
    params = []
    for i in range(len(arch.layers())):
        mod, _ = build_layer(arch, i, 1, dtype)
        params += list(mod.to(device).parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.Adam(params, lr=1e-4)
    ts = []
    for it in range(cfg.warmup + cfg.repeats):
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        t0 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if it >= cfg.warmup:
            ts.append(time.perf_counter() - t0)
    n = sum(p.numel() for p in params)
    t = statistics.median(ts)
    return {"seconds_per_param": t / n, "params": n, "seconds": t}


# -- collectives ---------------------------------------------------------------------
def _coll_worker(rank: int, init_method: str, world: int, sizes, ops, repeats: int, backend: str, queue):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    out = []
    for op in ops:
        for nbytes in sizes:
            n = max(1, nbytes // 4)
            x = torch.ones(n, device=dev)
            def run():
                if op == "all_reduce":
                    dist.all_reduce(x)
                elif op == "all_gather":
                    dist.all_gather([torch.empty(n // world or 1, device=dev) for _ in range(world)],
                                    x[: n // world or 1])
                elif op == "reduce_scatter":
                    dist.reduce_scatter(torch.empty(n // world or 1, device=dev),
                                        [x[: n // world or 1].clone() for _ in range(world)])
                elif op == "send_recv":
                    if rank % 2 == 0 and rank + 1 < world:
                        dist.send(x, rank + 1)
                    elif rank % 2 == 1:
                        dist.recv(x, rank - 1)
            try:
                run()
                ts = []
                for _ in range(repeats):
                    dist.barrier()
                    t0 = time.perf_counter()
                    run()
                    if backend == "nccl":
                        torch.cuda.synchronize()
                    ts.append(time.perf_counter() - t0)
                t = statistics.median(ts)
            except RuntimeError:
                t = None            # the backend lacks this operation
            dist.barrier()
            out.append((op, nbytes, t))
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def _spawned_entry(rank: int, fn, init: str, *args) -> None:
    """A spawned rank: run ``fn``; once it has returned, leave with ``os._exit(0)``.
    Skipping the interpreter's teardown is deliberate: there a gloo/DTensor thread
    destructor aborts the process at times ("terminate called without an active
    exception", SIGABRT) after the work itself finished and was checked. An exception in
    ``fn`` still propagates and fails the run."""
    fn(rank, init, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_spawned(fn, args: tuple, nprocs: int, timeout_s: float, what: str) -> None:
    """Run ``fn(rank, init_method, *args)`` in ``nprocs`` spawned processes on this host;
    kill them all and raise TimeoutError naming ``what`` if they take longer than
    ``timeout_s``. ``init_method`` (for ``init_process_group``) is a file store in a fresh
    temporary directory, removed afterwards: a TCP port probed free and bound later by
    rank 0 could be taken in between (launcher/dist.py). A rank leaves through
    ``os._exit`` once ``fn`` returns (``_spawned_entry``), so results must go through a
    ``SimpleQueue`` (written when ``put`` returns), not a ``Queue`` (a feeder thread)."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="arena-rendezvous-") as d:
        init = "file://" + os.path.join(d, "store")
        pc = mp.start_processes(_spawned_entry, args=(fn, init, *args), nprocs=nprocs, join=False,
                                start_method="spawn")
        deadline = time.time() + timeout_s
        while not pc.join(timeout=1.0):
            if time.time() > deadline:
                for p in pc.processes:
                    p.kill()
                raise TimeoutError(f"{what} with {nprocs} ranks exceeded {timeout_s} s")


def profile_collectives(*, group_sizes=(2,), sizes=(4096, 65536, 1 << 20, 4 << 20),
                        ops=("all_reduce", "all_gather", "reduce_scatter", "send_recv"), repeats: int = 5,
                        store: ProfileStore | None = None, timeout_s: float = 120.0) -> dict:
    import torch.multiprocessing as mp
    dev_name, dev = local_device()
    backend = "nccl" if dev == "cuda" else "gloo"
    records, unsupported, spent = [], set(), 0.0
    ctx = mp.get_context("spawn")
    check_group_sizes(group_sizes)              # (a group this host cannot run was skipped without a word)
    for n in group_sizes:
        q = ctx.SimpleQueue()
        t0 = time.perf_counter()
        run_spawned(_coll_worker, (n, tuple(sizes), tuple(ops), repeats, backend, q), n,
                    timeout_s, "collective profiling")
        wall = time.perf_counter() - t0
        spent += wall * n
        results = q.get()
        for op, nbytes, t in results:
            if t is None:
                unsupported.add(op)
                continue
            records.append(CollectiveProfile(dev_name, backend, op, n, nbytes, t, repeats, t * repeats * n))
    if store is not None and records:
        store.put_collectives(records)
    return {"device": dev_name, "backend": backend, "records": records, "unsupported": sorted(unsupported),
            "device_seconds": spent}


STARTUP_STAND_IN = "tiny-gpt__2L"
STARTUP_MAX_PARAMS = 50e6          # larger models are not launched here just to time a start-up


def startup_model(model: str) -> str:
    """The model whose launch is timed for ``model``'s start-up: itself when the launcher
    trains it and it is small (at most ``STARTUP_MAX_PARAMS``), else ``STARTUP_STAND_IN``."""
    from instances.models import get_model
    from launcher.api import make_config
    arch = get_model(model)
    if arch.param_count > STARTUP_MAX_PARAMS:
        return STARTUP_STAND_IN
    try:
        with tempfile.TemporaryDirectory() as d:      # make_config would leave a run folder behind
            make_config(model, 1, 1, 1, steps=1, run_dir=d)
    except InputError:              # a family the launcher does not train (Wide-ResNet)
        return STARTUP_STAND_IN
    return model


def measure_startup_s(model: str, global_batch: int) -> float:
    """Seconds a launch of ``model`` costs beyond its training steps: one rank, one step
    through the launcher (mpiexec, process start, torch import, rendezvous, model build,
    teardown) minus that step's time. The per-launch cost charged to running a grid
    directly. Pass ``startup_model(m)`` for models that cannot be launched here."""
    from launcher.api import run_training
    r = run_training(model, 1, 1, 1, steps=1, global_batch=global_batch, timeout_s=300)
    if not r.ok:
        raise RuntimeError(f"start-up measurement: the one-step launch of {model} failed "
                           f"(rc {r.returncode}): {r.output_tail[-300:]}")
    return max(0.0, r.wall_time_s - sum(r.iteration_times_s))


@dataclass(frozen=True)
class RunCostConfig:
    """How the "run every grid directly" side of the profiling-cost comparison is charged:
    each grid's proxy plan is launched once (``startup_s`` per launch, as
    ``measure_startup_s`` measures it) and runs ``warmup_iters + measured_iters`` iterations
    at its estimated iteration time, on all of the grid's devices."""
    warmup_iters: int = 3
    measured_iters: int = 10
    startup_s: float = 0.0

    def __post_init__(self):
        if self.warmup_iters < 0:
            raise InputError(f"must be >= 0, got {self.warmup_iters}", field="warmup_iters")
        if self.measured_iters < 1:
            raise InputError(f"must be >= 1, got {self.measured_iters}", field="measured_iters")
        if not self.startup_s >= 0:
            raise InputError("must be >= 0", field="startup_s")

    def device_seconds(self, num_gpus: int, iteration_time_s: float) -> float:
        """Charged device-seconds of running one grid of ``num_gpus`` directly."""
        return num_gpus * (self.startup_s + (self.warmup_iters + self.measured_iters) * iteration_time_s)


def run_every_grid_cost(model: str, global_batch: int, perf, cluster, *, max_gpus: int,
                        cfg: RunCostConfig) -> dict:
    """Estimated device-seconds of running each candidate grid's plan directly."""
    from instances.jobs import Job

    from .grids import candidate_grids
    job = Job("profile-cost", model, global_batch, 1, 0.0)
    total, n = 0.0, 0
    for grid in candidate_grids(job, cluster, max_gpus=max_gpus, planner=perf.planner):
        e = perf.estimate(job, grid)
        if not e.feasible or not math.isfinite(e.iteration_time_s):
            continue
        n += 1
        total += cfg.device_seconds(grid.num_gpus, e.iteration_time_s)
    return {"grids": n, "device_seconds": total}


def run_grids_measured(model: str, global_batch: int, perf, cluster, *, max_ranks: int, cfg: RunCostConfig,
                       timeout_s: float = 300) -> dict:
    """Measured side of the comparison for the grids of at most ``max_ranks`` devices: each
    grid's proxy plan is launched for real (``launcher.api.run_training``, one process per
    device, ``warmup_iters + measured_iters`` steps); device-seconds = launch wall time
    (start-up included) x ranks. A run that fails is reported, not counted."""
    from instances.jobs import Job
    from launcher.api import run_training

    from .grids import candidate_grids
    job = Job("profile-cost", model, global_batch, 1, 0.0)
    runs, total, per_grid_estimate = [], 0.0, 0.0
    for grid in candidate_grids(job, cluster, max_gpus=max_ranks, planner=perf.planner):
        e = perf.estimate(job, grid)
        if not e.feasible or e.plan is None:
            continue
        p = e.plan
        try:
            r = run_training(model, p.dp, p.tp, p.pp, steps=cfg.warmup_iters + cfg.measured_iters,
                             microbatches=p.microbatches, schedule=p.schedule, global_batch=global_batch,
                             stage_layers=p.stage_layers, timeout_s=timeout_s)
        except InputError as err:       # refused before launch (a family or plan the launcher lacks)
            runs.append({"grid": str(grid), "plan": f"dp{p.dp} tp{p.tp} pp{p.pp} m{p.microbatches}", "ok": False,
                         "wall_s": 0.0, "device_seconds": 0.0, "error": str(err)})
            continue
        runs.append({"grid": str(grid), "plan": f"dp{p.dp} tp{p.tp} pp{p.pp} m{p.microbatches}", "ok": r.ok,
                     "wall_s": r.wall_time_s, "device_seconds": r.wall_time_s * grid.num_gpus,
                     "error": "" if r.ok else r.output_tail[-200:]})
        if r.ok:
            total += r.wall_time_s * grid.num_gpus
            per_grid_estimate += cfg.device_seconds(grid.num_gpus, e.iteration_time_s)
    return {"grids": sum(r["ok"] for r in runs), "device_seconds": total, "runs": runs,
            "estimated_device_seconds_same_grids": per_grid_estimate}
