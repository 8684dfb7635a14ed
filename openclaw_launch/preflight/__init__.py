"""Preflight: measure the plan's all-reduce bandwidth per tier before the real job (docs/preflight.md).

``tiers`` (pure: plan + topology -> tiers, expectations, verdicts), ``worker`` (runs inside each
rank, imports torch), ``command`` (the launcher side of ``openclaw-launch preflight``).
"""
