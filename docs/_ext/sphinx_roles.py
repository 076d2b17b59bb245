"""A griffe extension for the API reference. durably's docstrings are Google style with two
habits griffe does not read as intended:

- Sphinx cross-reference roles (``:class:`~durably.Run```, ``:meth:`Task.explain```): each
  becomes a mkdocs-autorefs link when it names an object the reference renders, and plain
  code otherwise (the standard library, private modules), so ``mkdocs build --strict`` finds
  no unresolved reference and the pages show no raw ``:class:`` text;
- an ``Example:`` section (griffe reads only ``Examples:`` as doctest code): it is renamed,
  so its ``>>>`` lines render as code;
- reStructuredText literal blocks (a paragraph ending in ``::``): the marker is dropped, and
  the indented block after it renders as code in Markdown too.

Where an object is rendered (its "home") follows the reference pages: the first of
``HOMES`` that exports it in ``__all__``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# the modules the reference pages render, in order of precedence (see docs/reference/*.md)
HOMES = ("durably.exceptions", "durably.stategraph", "durably.executors", "durably.render",
         "durably.testing", "durably")

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj):`(~?)([^`]+)`")
_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)
_LITERAL_ALONE = re.compile(r"^[ \t]*::[ \t]*\n", re.M)  # a line holding only "::"
_LITERAL_END = re.compile(r"(\S)::[ \t]*$", re.M)  # "Formats::" -> "Formats:"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring of the package into autorefs links."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "durably":
            return
        homes = _homes(pkg)
        for obj in _walk(pkg):
            doc = obj.docstring
            if doc is None:
                continue
            text = _EXAMPLE.sub(r"\1Examples:", doc.value)
            text = _LITERAL_END.sub(r"\1:", _LITERAL_ALONE.sub("", text))
            if ":`" in text:
                text = _ROLE.sub(lambda m, obj=obj: _link(m, obj, homes), text)
            doc.value = text


def _walk(obj: Any, seen: set[str] | None = None) -> Any:
    seen = set() if seen is None else seen
    if obj.is_alias or obj.path in seen:
        return
    seen.add(obj.path)
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member, seen)


def _homes(pkg: griffe.Module) -> dict[str, str]:
    """Canonical path of each rendered object (and of its public members) → rendered path."""
    homes: dict[str, str] = {}

    def add(obj: Any, rendered: str) -> None:
        target = obj.final_target if obj.is_alias else obj
        homes.setdefault(target.path, rendered)
        homes.setdefault(rendered, rendered)
        if target.is_class:  # its own public members with a docstring are rendered
            for name, member in target.members.items():
                if not name.startswith("_") and not member.is_alias and member.docstring:
                    add(member, f"{rendered}.{name}")

    for module_path in HOMES:
        module = pkg if module_path == "durably" else pkg[module_path.partition(".")[2]]
        homes.setdefault(module.path, module.path)
        exported = module.exports or []
        for name in exported:
            name = name if isinstance(name, str) else getattr(name, "name", str(name))
            if name in module.members:
                add(module.members[name], f"{module_path}.{name}")
    return homes


def _link(match: re.Match[str], owner: Any, homes: dict[str, str]) -> str:
    short, text = match.group(1) == "~", match.group(2).strip()
    title, _, explicit = text.partition(" <")
    target = explicit.rstrip(">") if explicit else text
    target = target.lstrip("~.")
    shown = title if explicit else (target.rpartition(".")[2] if short else target)
    rendered = _resolve(target, owner, homes)
    if rendered is None:
        return f"`{shown}`"
    return f"[`{shown}`][{rendered}]"


def _resolve(target: str, owner: Any, homes: dict[str, str]) -> str | None:
    scopes = []
    obj = owner
    while obj is not None:  # the owner, its class, its module, its package: innermost first
        scopes.append(obj.path)
        obj = obj.parent
    candidates = [target] + [f"{scope}.{target}" for scope in scopes]
    for candidate in candidates:
        if candidate in homes:
            return homes[candidate]
    return None
