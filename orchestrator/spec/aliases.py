"""Key aliases: an earlier name of a spec key, still read, mapped onto the key that replaced it.

A spec that writes an alias runs as if it wrote the kept key (its value mapped, ``KeyAlias.value``), prints one
warning naming both keys, and is saved with the kept key only, so a run's spec files carry one key per setting.
Applied by ``orchestrator.spec.load`` before defaults are filled, to the spec and to its ``search`` section.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from orchestrator.spec.validate import algorithm_class


@dataclass(frozen=True)
class KeyAlias:
    """An earlier key of ``section`` (``alias``) read as ``kept``, for algorithms whose spec class has ``kept``
    and not ``alias``.

    Fields:
        section: dotted path of the section holding both keys.
        alias: the earlier key.
        kept: the key that replaced it.
        values: alias value -> kept value; a value not listed is left for the kept key's check to refuse.
        keep_over: kept values that an explicit kept key keeps whatever the alias says (they meant the same
            setting before the rename).
    """

    section: str
    alias: str
    kept: str
    values: tuple[tuple[Any, Any], ...]
    keep_over: tuple[Any, ...] = ()

    def value(self, alias_value: Any, kept_value: Any = None) -> Any:
        """The kept key's value for ``alias_value``, given the kept key's own explicit value (None: not set).

        ``normalize_advantage: false`` with ``normalize_advantages: percentile`` stays ``percentile``: before the
        rename, the boolean only switched standardization off."""
        if kept_value is not None and (kept_value in self.keep_over or alias_value is True):
            return kept_value
        for old, new in self.values:
            if alias_value is old or (type(alias_value) is type(old) and alias_value == old):
                return new
        return alias_value

    def warning(self, alias_value: Any, kept_value: Any) -> str:
        """The one-line warning for a spec that writes the alias."""
        return (f"{self.section}.{self.alias} is the earlier name of {self.section}.{self.kept}: "
                f"{self.alias}: {_show(alias_value)} is read as {self.kept}: {_show(kept_value)}; write "
                f"{self.kept} (the run's saved spec has it alone)")


def _show(value: Any) -> str:
    """A value as a spec file writes it (``true``, ``'none'``)."""
    return {True: "true", False: "false", None: "null"}.get(value, repr(value)) if not isinstance(value, str) \
        else repr(value)


ALIASES: tuple[KeyAlias, ...] = (
    KeyAlias("agent.algorithm", "normalize_advantage", "normalize_advantages",
             values=((True, "standardize"), (False, "none")), keep_over=("percentile",)),
)


class KeyAliasWarning(UserWarning):
    """A spec wrote an earlier key name (``KeyAlias``); printed once per process."""


def _section(tree: Any, dotted: str) -> dict[str, Any] | None:
    """The dict at ``dotted`` in ``tree``, or None."""
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree if isinstance(tree, dict) else None


def _applies(alias: KeyAlias, spec: dict[str, Any]) -> bool:
    """The spec's algorithm has the kept key and not the alias (``agent.algorithm`` aliases)."""
    cls = algorithm_class(spec)
    names = {f.name for f in dataclasses.fields(cls.spec_cls)} if cls is not None else set()
    return alias.kept in names and alias.alias not in names


def _alias_search(alias: KeyAlias, spec: dict[str, Any], warn: bool) -> None:
    """Rename ``alias__choice`` / ``alias__grid_search`` entries of the search section (nested or dotted) to the
    kept key, their values mapped; other space types and entries beside a searched kept key stay as written."""
    search = spec.get("search")
    for table, prefix in ((_section(search, alias.section), ""), (search, f"{alias.section}.")):
        if not isinstance(table, dict):
            continue
        for name in [n for n in table if isinstance(n, str) and n.startswith(f"{prefix}{alias.alias}__")]:
            kind = name.rsplit("__", 1)[1]
            kept_name = f"{prefix}{alias.kept}__{kind}"
            if kind not in ("choice", "grid_search") or not isinstance(table[name], list) or kept_name in table:
                continue
            values = [alias.value(v) for v in table.pop(name)]
            table[kept_name] = values
            if warn:
                warnings.warn(f"search {alias.section}.{alias.alias}__{kind} is the earlier name of "
                              f"{alias.section}.{alias.kept}: searched as {alias.kept}__{kind} {values!r}",
                              KeyAliasWarning, stacklevel=3)


def apply_key_aliases(spec: dict[str, Any], warn: bool = True) -> dict[str, Any]:
    """``spec`` (a flat spec, before defaults; changed in place and returned) with every alias of ``ALIASES``
    that applies to it replaced by its kept key, a ``KeyAliasWarning`` for each when ``warn`` (a spec the user
    wrote; not for the spec files a run saved before the rename, which a resume or ``enjoy@`` reads)."""
    for alias in ALIASES:
        if not _applies(alias, spec):
            continue
        _alias_search(alias, spec, warn)
        section = _section(spec, alias.section)
        if section is None or alias.alias not in section:
            continue
        written = section.pop(alias.alias)
        kept = alias.value(written, section.get(alias.kept))
        if warn:
            warnings.warn(alias.warning(written, kept), KeyAliasWarning, stacklevel=2)
        section[alias.kept] = kept
    return spec
