"""Package discovery, with the one mapping pyproject.toml cannot express next to it: the folder ``integrations/``
is installed as ``ram_live.integrations`` (never as a top-level ``integrations``). Everything else is in
pyproject.toml."""

from setuptools import find_namespace_packages, find_packages, setup

core = find_namespace_packages(include=["ram_live", "ram_live.*"], exclude=["*.__pycache__"])
integrations = ["ram_live.integrations"] + [f"ram_live.integrations.{p}" for p in find_packages("integrations")]
setup(packages=core + integrations, package_dir={"ram_live.integrations": "integrations"})
