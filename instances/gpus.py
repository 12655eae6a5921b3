"""GPU catalog: one place for every accelerator's specs.

TF32 figures are the datasheets' dense tensor-core TF32 peaks (A100 156, H100/H200 494.7,
A40 74.8, A10 62.5, L20 59.8 TFLOP/s); V100 has no TF32. ``fp32_gemm_flops`` (A40 18.7,
A10 15.6, L20 29.9): half the datasheet FP32 figure, which counts the second FP32 datapath of
GA10x/AD10x SMs that GEMM/convolution kernels cannot keep busy (the Arena table's fp32
Wide-ResNet runs agree: A40 is 13% slower than A100, not 1.9x faster).

Units: FLOP/s (dense, no structured sparsity), bytes, bytes per second. Bandwidths are
per GPU and per direction: ``intra_node_bw_bytes_per_s`` is one GPU's bandwidth to its
peers inside a node (NVLink or PCIe), ``inter_node_bw_bytes_per_s`` one GPU's share of
the node's network (a typical NIC for that generation of system).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .errors import UnknownGpuType

GB = 10**9
GIB = 2**30
TFLOPS = 1e12


@dataclass(frozen=True)
class GpuType:
    name: str
    fp16_flops: float          # dense fp16/bf16 tensor-core peak, FLOP/s
    fp32_flops: float          # dense fp32 (non-tensor-core) peak, FLOP/s
    memory_bytes: int
    memory_bw_bytes_per_s: float
    intra_node_bw_bytes_per_s: float
    inter_node_bw_bytes_per_s: float
    default_gpus_per_node: int
    interconnect: str          # "nvlink", "nvswitch", "pcie" or "host"
    source: str
    tf32_flops: float = 0.0    # dense TF32 tensor-core peak for fp32 matmuls/convs; 0: none (use fp32)
    fp32_gemm_flops: float = 0.0   # fp32 peak reachable by GEMM/convolution kernels without tensor
                                   # cores; 0: = fp32_flops. GA10x/AD10x (A40, A10, L20) datasheets count a
                                   # second FP32 datapath per SM partition that is shared with INT32;
                                   # GEMM/conv inner loops keep only one busy: half the datasheet figure

    def peak_flops(self, dtype: str) -> float:
        if dtype in ("float16", "bfloat16", "fp16", "bf16"):
            return self.fp16_flops
        if dtype in ("float32", "fp32"):
            return self.fp32_flops
        raise ValueError(f"unknown dtype {dtype!r} for GPU type {self.name}")

    def fp32_matmul_flops(self, allow_tf32: bool) -> float:
        """Peak for fp32 matmuls/convs: TF32 tensor cores where allowed and present
        (JAX/XLA and cuDNN use them by default on Ampere and later)."""
        if allow_tf32 and self.tf32_flops > 0:
            return self.tf32_flops
        return self.fp32_gemm_flops or self.fp32_flops


_CATALOG: tuple[GpuType, ...] = (
    GpuType("a100-40gb", 312 * TFLOPS, 19.5 * TFLOPS, 40 * GIB, 1555 * GB, 300 * GB, 25 * GB, 8,
            "nvswitch", "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB): FP16/BF16 312 TF dense, "
            "FP32 19.5 TF, HBM2 1,555 GB/s, NVLink3 600 GB/s bidirectional; DGX A100: 8 GPUs, "
            "one 200 Gb/s HDR NIC per GPU",
            tf32_flops=156 * TFLOPS),
    GpuType("a100-80gb", 312 * TFLOPS, 19.5 * TFLOPS, 80 * GIB, 2039 * GB, 300 * GB, 25 * GB, 8,
            "nvswitch", "NVIDIA A100 datasheet (SXM4 80GB): 312 TF FP16 dense, 19.5 TF FP32, "
            "HBM2e 2,039 GB/s, NVLink3 600 GB/s bidirectional; DGX A100 8 GPUs, 200 Gb/s per GPU",
            tf32_flops=156 * TFLOPS),
    GpuType("h100-sxm", 989 * TFLOPS, 67 * TFLOPS, 80 * GIB, 3350 * GB, 450 * GB, 50 * GB, 8,
            "nvswitch", "NVIDIA H100 datasheet (SXM5): BF16 989 TF dense, FP32 67 TF, HBM3 3.35 TB/s, "
            "NVLink4 900 GB/s bidirectional; DGX H100: 8 GPUs, one 400 Gb/s NDR NIC per GPU",
            tf32_flops=494.7 * TFLOPS),
    GpuType("h200", 989 * TFLOPS, 67 * TFLOPS, 141 * GB, 4800 * GB, 450 * GB, 50 * GB, 8,
            "nvswitch", "NVIDIA H200 datasheet (SXM): BF16 989 TF dense, FP32 67 TF, 141 GB HBM3e "
            "4.8 TB/s, NVLink 900 GB/s bidirectional; HGX H200 8 GPUs, 400 Gb/s per GPU",
            tf32_flops=494.7 * TFLOPS),
    GpuType("v100-32gb", 125 * TFLOPS, 15.7 * TFLOPS, 32 * GIB, 900 * GB, 150 * GB, 12.5 * GB, 8,
            "nvlink", "NVIDIA V100 datasheet (SXM2 32GB): 125 TF tensor FP16, 15.7 TF FP32, HBM2 "
            "900 GB/s, NVLink2 300 GB/s bidirectional; DGX-1: 8 GPUs, 100 Gb/s EDR per GPU"),
    GpuType("a40", 149.7 * TFLOPS, 37.4 * TFLOPS, 48 * GIB, 696 * GB, 32 * GB, 12.5 * GB, 2,
            "pcie", "NVIDIA A40 datasheet: FP16/BF16 tensor 149.7 TF dense, FP32 37.4 TF, 48 GB "
            "GDDR6 696 GB/s, PCIe Gen4 x16 64 GB/s bidirectional; 100 Gb/s NIC assumed",
            tf32_flops=74.8 * TFLOPS, fp32_gemm_flops=18.7 * TFLOPS),
    GpuType("a10", 125 * TFLOPS, 31.2 * TFLOPS, 24 * GIB, 600 * GB, 32 * GB, 12.5 * GB, 2,
            "pcie", "NVIDIA A10 datasheet: FP16/BF16 tensor 125 TF dense, FP32 31.2 TF, 24 GB GDDR6 "
            "600 GB/s, PCIe Gen4 x16 64 GB/s bidirectional; 100 Gb/s NIC assumed",
            tf32_flops=62.5 * TFLOPS, fp32_gemm_flops=15.6 * TFLOPS),
    GpuType("l20", 119.5 * TFLOPS, 59.8 * TFLOPS, 48 * GIB, 864 * GB, 32 * GB, 25 * GB, 8,
            "pcie", "NVIDIA L20 product brief: FP16 tensor 119.5 TF dense, FP32 59.8 TF, 48 GB GDDR6 "
            "864 GB/s, PCIe Gen4 x16; 200 Gb/s per GPU assumed",
            tf32_flops=59.8 * TFLOPS, fp32_gemm_flops=29.9 * TFLOPS),
    # The Sia (SOSP'23) artifact's GPU types besides A100: AWS g4dn.12xlarge nodes ("aws",
    # 4 x T4) and on-prem 8 x RTX 2080 Ti nodes ("rtx"); their runs are simulated from the
    # artifact's measured profiles, never from these specs (instances/sia_artifact.py).
    GpuType("t4", 65 * TFLOPS, 8.1 * TFLOPS, 16 * GIB, 320 * GB, 16 * GB, 1.5625 * GB, 4,
            "pcie", "NVIDIA T4 datasheet: FP16 tensor 65 TF (mixed precision), FP32 8.1 TF, 16 GB GDDR6 "
            "320 GB/s, PCIe Gen3 x16 32 GB/s bidirectional; AWS g4dn.12xlarge: 4 GPUs, 50 Gb/s per node"),
    GpuType("rtx-2080ti", 53.8 * TFLOPS, 13.4 * TFLOPS, 11 * GIB, 616 * GB, 16 * GB, 1.25 * GB, 8,
            "pcie", "NVIDIA GeForce RTX 2080 Ti (Turing whitepaper): FP16 tensor 53.8 TF with FP32 accumulate, "
            "FP32 13.4 TF, 11 GB GDDR6 616 GB/s, PCIe Gen3 x16; 8 GPUs per node and 10 GB/s per node "
            "assumed (the Sia artifact's on-prem nodes)"),
    GpuType("cpu", 0.1 * TFLOPS, 0.1 * TFLOPS, 16 * GIB, 10 * GB, 5 * GB, 1 * GB, 1,
            "host", "nominal figures for a small x86 VM (2 cores with AVX2 FMA, one DDR channel); "
            "`arena profile` measures the real numbers on the local CPU"),
)

GPU_TYPES: dict[str, GpuType] = {g.name: g for g in _CATALOG}

# Names used by other schedulers' formats (Arena, Gavel, Sia) for our catalog entries.
ALIASES: dict[str, str] = {
    "a100": "a100-40gb", "a100-sxm4-40gb": "a100-40gb", "a100_40gb": "a100-40gb",
    "a100-80g": "a100-80gb", "a100_80gb": "a100-80gb",
    "h100": "h100-sxm", "h100_sxm": "h100-sxm", "h200-sxm": "h200",
    "v100": "v100-32gb", "v100_32gb": "v100-32gb",
}


def canonical_gpu_name(name: str) -> str:
    """The catalog name of ``name`` (case-insensitive, aliases resolved);
    ``UnknownGpuType`` if it is not in the catalog."""
    if not isinstance(name, str):
        raise UnknownGpuType(f"GPU type must be a name (a string), got {name!r}", field="gpu_type")
    return _canonical(name)


@functools.lru_cache(maxsize=256)
def _canonical(name: str) -> str:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in GPU_TYPES:
        raise UnknownGpuType(f"unknown GPU type {name!r}; known: {', '.join(sorted(GPU_TYPES))}",
                             field="gpu_type")
    return key


def get_gpu(name: str) -> GpuType:
    return GPU_TYPES[canonical_gpu_name(name)]
