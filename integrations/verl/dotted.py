"""Reading verl's trainer config (an OmegaConf ``DictConfig`` or a plain mapping): the value at a dotted path, and
nodes as plain containers. What :mod:`.config` and :mod:`.rewards` both read verl's config with (its own module
so that neither imports the other for it); torch-free, verl-free."""

from __future__ import annotations

from typing import Any

__all__ = ["get_dotted", "plain"]


def get_dotted(cfg: Any, dotted: str, default: Any = None) -> Any:
    """``cfg``'s value at the dotted path (``"trainer.save_freq"``), or ``default`` where a part is missing.

    Args:
        cfg: verl's config (``DictConfig``), a mapping or an object with attributes.
        dotted: the path, parts separated by ``.``.
        default: what a missing part (or an OmegaConf interpolation that does not resolve) gives.
    """
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        try:
            node = node.get(part, None) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # an OmegaConf interpolation that does not resolve
            return default
    return default if node is None else node


def plain(node: Any) -> Any:
    """``node`` as plain Python containers (an OmegaConf node resolved), anything else as it is.

    Args:
        node: a config node or value.
    """
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl always brings omegaconf
        return node
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    return node
