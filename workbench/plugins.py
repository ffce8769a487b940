"""One way to plug into the workbench: an entry-point group per kind of plugin.

- `workbench.pipelines`: a `Pipeline` or a list of them
  (`distill = "workbench.distill.spec:PIPELINE"`);
- `workbench.agent_packs`: a pack's declaration, an `agent_packs.pack.AgentPack` (its stages,
  report and conditions, and the module offering `evaluate` and `run_inputs`:
  `kgv = "workbench.agent_packs.kgv.declare:PACK"`), or that module itself (the older form);
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

`Registry` is the one lookup table of the workbench: a name -> entry map of one kind
(pipelines, model backends, agent packs, agent scaffolds, seed templates of data tasks,
tool-call syntaxes), an entry being the object itself (registered from code) or a
"module:attribute" string that `load`, the one loader, imports on first use; a registry with
an entry-point group also finds the installed plugins' entries there. An unknown name is one
`WorkbenchError` line naming it and the known ones.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

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


T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind: `register(name, entry)` from code (an object, or a
    "module:attribute" string loaded on first use), and, with `group`, the entry points of
    that group (the workbench's own first, then installed plugins'). An entry registered from
    code wins over an entry point of the same name. `get` resolves `aliases`, loads a string
    entry once (`load`) and says an unknown name in one line (`unknown`: "{kind}", "{name}"
    and "{known}", the known names, with the aliases, sorted when `sort`)."""

    def __init__(self, kind: str, *, group: str | None = None,
                 aliases: Mapping[str, str] | None = None, sort: bool = False,
                 unknown: str = "unknown {kind} {name!r} (known: {known})"):
        if group is not None and group not in GROUPS:
            raise WorkbenchError(f"unknown plugin group {group!r} (groups: {', '.join(GROUPS)})")
        self.kind, self.group, self.sort, self.unknown_text = kind, group, sort, unknown
        self.aliases = dict(aliases or {})
        self._code: dict[str, T | str] = {}
        self._loaded: dict[tuple[str, str], T] = {}  # (name, "module:attr") -> the object

    def register(self, name: str, entry: T | str, *, replace: bool = True) -> T | str:
        old = self._code.get(name)
        if old is not None and old is not entry and old != entry and not replace:
            raise WorkbenchError(f"a {self.kind} named {name!r} is already registered")
        self._code[name] = entry
        return entry

    def add(self, name: str) -> Callable[[T], T]:
        """Decorator: `@REGISTRY.add("name")` registers the function or class it decorates."""

        def deco(obj: T) -> T:
            self.register(name, obj)
            return obj

        return deco

    def unregister(self, name: str) -> bool:
        return self._code.pop(name, None) is not None

    def entries(self) -> dict[str, T | str]:
        """name -> entry (an object or a "module:attribute" string), not loaded."""
        out: dict[str, T | str] = dict(entries(self.group)) if self.group else {}
        out.update(self._code)
        return out

    def registered(self, name: str) -> T | str | None:
        """The entry registered from code under `name`, not loaded (None if there is none)."""
        return self._code.get(name)

    def names(self) -> list[str]:
        """The names, in the order registered (the group's entries first)."""
        return list(self.entries())

    def known(self) -> list[str]:
        """The names an unknown one is told about: with the aliases, sorted when `sort`."""
        names = [*self.names(), *(a for a in self.aliases if a not in self.names())]
        return sorted(names) if self.sort else names

    def canonical(self, name: str) -> str:
        return self.aliases.get(name, name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.canonical(name) in self.entries()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.entries())

    def unknown(self, name: str, known: Iterable[str] | None = None) -> WorkbenchError:
        """The one-line error for a name that is not registered."""
        listed = ", ".join(self.known() if known is None else known)
        return WorkbenchError(self.unknown_text.format(kind=self.kind, name=name, known=listed))

    def get(self, name: str, *, known: Iterable[str] | None = None) -> T:
        """The entry of `name` (an alias resolved), loaded; `known` replaces the names an
        unknown one is told about."""
        name = self.canonical(name)
        found = self.entries()
        if name not in found:
            raise self.unknown(name, known)
        return self.resolve(name, found[name])

    __getitem__ = get

    def resolve(self, name: str, entry: T | str) -> T:
        """An entry as an object: a "module:attribute" string loaded once."""
        if not isinstance(entry, str):
            return entry
        key = (name, entry)
        if key not in self._loaded:
            self._loaded[key] = cast(T, load(entry, what=f"{self.kind} {name!r}"))
        return self._loaded[key]

    def items(self) -> list[tuple[str, T]]:
        """Every entry, loaded, in the order of `names`."""
        return [(n, self.resolve(n, e)) for n, e in self.entries().items()]
