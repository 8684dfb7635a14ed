"""The project's own tools, outside the package (an installed wheel has no docs/ to write): the
generators of docs/'s tables, run from the repository root as ``python -m tools.NAME [--write]``."""
