"""The effects of a run: supervision (state machine), the OS layer, guardian, cgroup, MPS, output."""
