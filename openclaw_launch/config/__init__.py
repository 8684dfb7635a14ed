"""YAML -> typed ``Config``: the model, the reader, the limits every stage checks against."""
