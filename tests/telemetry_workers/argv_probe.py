"""Prints what a script can see of how it was started, as JSON (no torch)."""

import json
import sys

print(
    json.dumps(
        {
            "argv": sys.argv,
            "path0": sys.path[0],
            "name": __name__,
            "file": __file__,
            "main_file": getattr(sys.modules["__main__"], "__file__", None),
            "package": __package__,
            "spec": repr(__spec__),
            "loader": type(__loader__).__name__,
            "builtins": type(__builtins__).__name__,
            "torch": "torch" in sys.modules,
        }
    )
)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0)
