"""Run reports: building, rendering, loading and their schema."""
