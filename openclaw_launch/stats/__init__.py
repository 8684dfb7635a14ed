"""Launcher side of the per-step statistics: collect workers' batches, sample the GPUs, judge.

``collect`` turns batches into bounded per-rank summaries, ``gpu`` samples NVML off the
supervision loop, ``verdict`` names the straggler and the phase (pure), ``inbox`` is the socket.
"""
