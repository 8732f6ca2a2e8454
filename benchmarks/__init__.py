"""Measurements: raw results (``results/``), dated journals (``journal/``) and the renderer of
the docs' tables (``render``). Not part of the installed package."""
