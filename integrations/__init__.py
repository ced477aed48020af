"""Thin adapters from ram_live to training frameworks, installed as ``ram_live.integrations``.

Each submodule imports its framework lazily; ``import ram_live`` never imports one.
"""
