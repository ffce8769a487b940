"""One way to plug into the workbench: an entry-point group per kind of plugin.

- `workbench.pipelines`: a `Pipeline` or a list of them
  (`distill = "workbench.distill.spec:PIPELINE"`);
- `workbench.agent_packs`: a pack module offering `evaluate` and `run_inputs`
  (`kgv = "workbench.agent_packs.kgv.api"`);
- `workbench.backends`: a `ChatModel` class (`local = "workbench.models.local:LocalChatModel"`).

The built-ins are registered exactly as an outside plugin is: as entry points in the
workbench's own `pyproject.toml`, so a plugin package adds a table of the same shape to its
own `pyproject.toml` and nothing else. Entries are strings, imported only when used, so
`--help` and the config schema import no model code. For tests and local experiments,
`WB_PLUGINS=module,...` imports pipeline modules without installing them
(`workbench.registry`).

The workbench's own entries are read from its `pyproject.toml` when it runs from a checkout
(so a checkout never runs on metadata left from an older install, and the GPU check's copy of
the tree runs uninstalled), else from the installed package's metadata. An installed plugin's
entry that names a built-in's name replaces it.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

PIPELINES, AGENT_PACKS, BACKENDS = ("workbench.pipelines", "workbench.agent_packs",
                                    "workbench.backends")
GROUPS = (PIPELINES, AGENT_PACKS, BACKENDS)
DIST = "domain-agent-workbench"  # the distribution whose own entries are the built-ins


def entries(group: str) -> dict[str, str]:
    """The group's entries, name -> "module" or "module:attribute": the workbench's own
    first, then every installed plugin's (which may replace one by name)."""
    from importlib.metadata import entry_points

    if group not in GROUPS:
        raise WorkbenchError(f"unknown plugin group {group!r} (groups: {', '.join(GROUPS)})")
    found = list(entry_points(group=group))
    own = _checkout_entries(group)
    if own is None:
        own = {ep.name: ep.value for ep in found if _dist(ep) == _norm(DIST)}
    if not own:
        raise WorkbenchError(
            f"the workbench's own {group} entries are not installed: run `pip install .` "
            "(or ./scripts/setup.sh in a checkout)")
    out = dict(own)
    out.update({ep.name: ep.value for ep in found if _dist(ep) != _norm(DIST)})
    return out


@functools.cache
def _checkout_entries(group: str) -> dict[str, str] | None:
    """The group's table in the checkout's pyproject.toml, when this package runs from one;
    None for an installed package (no pyproject.toml of ours beside it)."""
    import tomllib

    path = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        project = tomllib.loads(path.read_text()).get("project", {})
    except (OSError, ValueError):
        return None
    if _norm(str(project.get("name", ""))) != _norm(DIST):
        return None
    return dict(project.get("entry-points", {}).get(group, {}))


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _dist(ep) -> str | None:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return _norm(name) if name else None


def load(ref: str, *, what: str = "plugin") -> Any:
    """Import "module" (the module) or "module:attribute" (that attribute)."""
    module, _, attr = ref.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise WorkbenchError(f"{what} {ref!r} cannot be loaded ({e})") from None
    return obj
