"""Configuration: one application's ``args`` schema (args.py) and checks of whole ``serve deploy``
files."""
