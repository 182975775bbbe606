"""Reading spec files: JSON (with trailing commas) or YAML, SLM-Lab v5 template variables, and v4/v5 shapes normalized
to one."""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
from typing import Any

import yaml

from orchestrator.errors import SpecError
from orchestrator.spec.slm_lab import SHADOWED_BY
from orchestrator.store import storage


def _strip_trailing_commas(text: str) -> str:
    """Remove JSON trailing commas (``,}`` / ``,]``) outside strings (SLM-Lab v4 files)."""
    out, in_str, esc, i = [], False, False, 0
    while i < len(text):
        ch = text[i]
        if in_str:
            esc = (ch == "\\") and not esc
            if ch == '"' and not esc:
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == ",":
            j = i + 1
            while j < len(text) and text[j] in " \t\r\n":
                j += 1
            if j < len(text) and text[j] in "}]":
                i += 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)


TEMPLATE_VAR = re.compile(r"\$\{(\w+)\}")


class SpecYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 floats: ``1e7`` and ``10e6`` (no dot) are numbers, not strings."""


SpecYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d[\d_]*)?\.?\d*[eE][-+]?\d+$"), list("-+0123456789."))



def is_anchor_entry(uri: str, name: Any) -> bool:
    """Whether a top-level entry of a YAML file is SLM-Lab's ``_name`` holder of anchors, not a spec."""
    return uri.endswith((".yml", ".yaml")) and isinstance(name, str) and name.startswith("_")


def fill_templates(text: str, variables: dict[str, str]) -> str:
    """Fill ``${var}`` placeholders of a spec file's text, as SLM-Lab's ``-s var=value`` does.

    A numeric value is written as a number, also in place of a quoted ``"${var}"`` (so
    ``-s max_frame=3e6`` makes ``"max_frame": 3000000``); any other value replaces ``${var}`` as text.
    """
    for key, value in variables.items():
        try:
            num = float(value)
        except ValueError:
            text = text.replace(f"${{{key}}}", value)
            continue
        canonical = str(int(num)) if math.isfinite(num) and num == int(num) else str(num)
        text = text.replace(f'"${{{key}}}"', canonical).replace(f"${{{key}}}", canonical)
    return text


def template_vars(uri: str) -> set[str]:
    """The ``${var}`` placeholder names in a spec file's text (empty when it cannot be read)."""
    try:
        return set(TEMPLATE_VAR.findall(storage.read_text(uri)))
    except (FileNotFoundError, storage.StorageError, UnicodeDecodeError):
        return set()


def read_spec_file(uri: str, variables: dict[str, str] | None = None) -> dict[str, Any]:
    """Parse a spec file (JSON, JSON with trailing commas, or YAML by extension).

    A file holding one bare spec (with ``agent`` and ``env`` keys, as saved in a run directory)
    is returned as ``{its name: spec}``. In a YAML file, top-level entries named ``_...`` only hold
    anchors for the specs (SLM-Lab v5): they may be any value and are not specs (see ``spec_names``).

    Args:
        uri: path or URI.
        variables: ``${var}`` placeholders filled in the text before parsing (``fill_templates``).

    Raises:
        SpecError: file missing, unreadable, not valid JSON/YAML (with line and column), or not a
            mapping of spec names to specs.
    """
    try:
        text = storage.read_text(uri)
    except FileNotFoundError:
        raise SpecError(f"spec file '{uri}' does not exist{similar_file_hint(uri)}") from None
    except (storage.StorageError, UnicodeDecodeError) as err:
        raise SpecError(f"spec file '{uri}' cannot be read: {err}") from None
    text = fill_templates(text, variables or {})
    if uri.endswith((".yml", ".yaml")):
        try:
            data = yaml.load(text, Loader=SpecYamlLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise SpecError(f"spec file '{uri}' is not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    else:
        try:
            data = json.loads(_strip_trailing_commas(text))
        except json.JSONDecodeError as err:
            raise SpecError(f"spec file '{uri}' is not valid JSON: {err.msg} at line {err.lineno}, "
                            f"column {err.colno}") from None
    if isinstance(data, dict) and "agent" in data and "env" in data:  # a saved spec file of a run
        return {data.get("name") or storage.basename(uri).removesuffix("_spec.json"): data}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for k, v in data.items()
                                             if not is_anchor_entry(uri, k)):
        raise SpecError(f"spec file '{uri}' must map spec names to spec objects")
    return data


def similar_file_hint(uri: str) -> str:
    """``". Did you mean 'DIR/NAME'?"`` naming the spec file (``.json``, ``.yml``, ``.yaml``) in ``uri``'s
    directory whose name is closest to ``uri``'s (``difflib``); ``""`` when none is close or the directory
    cannot be listed."""
    folder = storage.dirname(uri)
    try:
        names = [n for n in storage.listdir(folder or ".") if n.endswith((".json", ".yml", ".yaml"))]
    except (OSError, storage.StorageError):
        return ""
    close = difflib.get_close_matches(storage.basename(uri), names, n=1)
    return f". Did you mean '{storage.join(folder, close[0]) if folder else close[0]}'?" if close else ""


def spec_names(uri: str) -> list[str]:
    """The names of the specs in a spec file, in file order.

    Raises:
        SpecError: the file cannot be read (see ``read_spec_file``).
    """
    return [name for name in read_spec_file(uri) if not is_anchor_entry(uri, name)]


def _unwrap_v4_search(search: Any) -> None:
    """SLM-Lab v4's list-shaped search sections (``"agent": [{...}]``, one element per agent/env), in place.

    Raises:
        SpecError: a list other than one object.
    """
    for key in ("agent", "env"):
        value = search.get(key) if isinstance(search, dict) else None
        if isinstance(value, list):
            if len(value) != 1 or not isinstance(value[0], dict):
                raise SpecError(f"search.{key}: SLM-Lab v4's list-shaped search section needs one object (one "
                                f"{key}), got {value!r}")
            search[key] = value[0]


def _drop_shadowed(spec: dict[str, Any]) -> None:
    """Drop SLM-Lab v3's fixed values written beside the schedule that replaced them (``SHADOWED_BY``: e.g.
    ``clip_eps`` next to ``clip_eps_spec``), and searches over them: every SLM-Lab since v4 leaves them unread.
    Without their schedule they stay and are refused naming the v5 key."""
    search = spec.get("search") if isinstance(spec.get("search"), dict) else {}
    for dotted, sibling in SHADOWED_BY.items():
        *parents, key = dotted.split(".")
        section, nested = spec, search
        for part in parents:
            section = section.get(part) if isinstance(section, dict) else None
            nested = nested.get(part) if isinstance(nested, dict) else None
        if not (isinstance(section, dict) and isinstance(section.get(sibling), dict)):
            continue
        section.pop(key, None)
        for table, prefix in ((nested, f"{key}__"), (search, f"{dotted}__")):
            for name in [n for n in (table or {}) if isinstance(n, str) and n.startswith(prefix)]:
                del table[name]


def normalize(raw: dict[str, Any]) -> dict[str, Any]:
    """SLM-Lab v4 shape -> flat shape: unwrap one-element ``agent``/``env`` lists (also in ``search``), drop
    ``body``, ``spec_params`` and v3 fixed values beside their schedules (``_drop_shadowed``).

    Raises:
        SpecError: a list with other than one element (multi-agent/multi-env is not supported).
    """
    spec = copy.deepcopy(raw)
    spec.pop("body", None)
    spec.pop("spec_params", None)  # SLM-Lab v4's experiment grid: load_spec checks its variables are filled
    if isinstance(spec.get("meta"), dict):  # indices a run writes into its trial/session spec files
        for key in RUNTIME_META_KEYS:
            spec["meta"].pop(key, None)
    for key in ("agent", "env"):
        value = spec.get(key)
        if isinstance(value, list):
            if len(value) != 1:
                hydra = " (SLM-Lab's multi-agent / multi-env hydra specs are not supported: one agent, one env)"
                raise SpecError(f"{key}: expected one {key} (a dict or a one-element list), got {len(value)}"
                                + (hydra if len(value) > 1 else ""))
            spec[key] = value[0]
    _unwrap_v4_search(spec.get("search"))
    _drop_shadowed(spec)
    meta = spec.get("meta")
    if isinstance(meta, dict):  # SLM-Lab per-session resource keys
        for old, new in (("num_cpus", "num_cpus"), ("num_gpus", "num_gpus")):
            if old in meta:
                spec["meta"].setdefault("resources", {})[new] = meta.pop(old)
    return spec




RUNTIME_META_KEYS = ("trial", "session", "session_seed", "session_dir")


