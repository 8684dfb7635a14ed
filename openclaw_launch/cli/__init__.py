"""The command line: click commands and the option tables (torchrun's flags, our own)."""
