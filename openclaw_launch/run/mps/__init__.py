"""The node's NVIDIA MPS daemon: lifecycle, control program, its answers, limit commands."""
