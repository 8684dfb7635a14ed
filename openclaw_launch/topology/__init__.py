"""What a host is: GPUs, NUMA nodes, CPUs, links. Read live (NVML + sysfs),
from saved ``nvidia-smi`` text, or from a recorded snapshot."""

from openclaw_launch.topology.model import (
    GpuInfo,
    IbPort,
    NvLink,
    PcieLink,
    Topology,
    normalize_bus_id,
)

__all__ = ["GpuInfo", "IbPort", "NvLink", "PcieLink", "Topology", "normalize_bus_id"]
