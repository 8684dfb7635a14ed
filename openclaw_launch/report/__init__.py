"""Run reports: their frozen types (model, rank), the one JSON codec that also checks them (codec),
building and reading (build), the table (format), the docs tables (docs)."""
