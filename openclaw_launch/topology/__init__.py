"""What a host is: GPUs, NUMA nodes, CPUs, links. Read live (the driver's /proc files, NVML, sysfs),
from saved ``nvidia-smi`` text, or from a recorded snapshot."""
