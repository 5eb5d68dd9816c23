"""GPU products lorapool places pools on: memory and NVIDIA GFD node labels. Pure."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024**2
GIB = 1024**3

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"  # set by GPU feature discovery on every GPU node
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class GpuType:
    """One GPU model: its memory and the GFD ``nvidia.com/gpu.product`` values of its variants."""

    product: str
    memory_bytes: int
    node_products: tuple[str, ...]


GPUS: dict[str, GpuType] = {
    g.product: g
    for g in (
        # nvidia.com/gpu.memory as GPU Feature Discovery reports it, in MiB.
        GpuType("A100-80GB", 81920 * MIB, ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe")),
        GpuType("A100-40GB", 40960 * MIB, ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB")),
        GpuType("H100-80GB", 81559 * MIB, ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe")),
        GpuType("L40S", 46068 * MIB, ("NVIDIA-L40S",)),
    )
}
