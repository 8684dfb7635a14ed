"""A config file or text -> validated ``Config`` (the format is documented in ``config/model.py``).

PyYAML and the document reader (``config/document.py``) are imported only when a config is read:
a run without ``--config`` must not pay for them at start-up.
"""

from __future__ import annotations

import os

from openclaw_launch.config.model import Config
from openclaw_launch.errors import ConfigError, Problem
from openclaw_launch.limits import MAX_CONFIG_BYTES
from openclaw_launch.safe_read import InputFileError, read_input


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate the YAML file at ``path``; ``ConfigError`` lists every problem with its
    key path and line."""
    source = os.fspath(path)
    try:
        text = read_input(source, "config", MAX_CONFIG_BYTES)
    except InputFileError as e:
        reason = str(e).removeprefix(f"{source}: cannot read the config: ").removeprefix(f"{source}: ")
        raise ConfigError(source, [Problem("", None, f"cannot read the config: {reason}")]) from None
    return parse_config(text, source)


def parse_config(text: str, source: str = "<config>") -> Config:
    """``load_config`` for text already in memory; ``source`` names it in messages."""
    import yaml

    from openclaw_launch.config.document import ConfigChecker
    from openclaw_launch.config.yaml_nodes import BoundedLoader, syntax_problem

    try:
        root = yaml.compose(text, Loader=BoundedLoader)
    except yaml.YAMLError as e:
        raise ConfigError(source, [syntax_problem(e, text)]) from None
    checker = ConfigChecker()
    config = checker.config(root, source)
    if checker.problems:
        raise ConfigError(source, sorted(checker.problems, key=lambda p: p.line or 0))
    return config
