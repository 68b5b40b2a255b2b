"""``--config FILE.yaml``: its settings checked as their flags check them, and its ``pipeline_options``
mapping turned into Beam flags. Flags on the command line override it (cli.parse_convert)."""

from __future__ import annotations

import os
import re
from typing import Any

from .errors import UsageError, one_line
from .flags import CONFIG_KEYS


def _no_alias_loader(path: str) -> Any:
    """PyYAML's safe loader, refusing aliases (``*name``): ten lines of aliases to aliases ("billion laughs")
    under split_ratios or pipeline_options grew to gigabytes when the values were turned into flags. A
    settings file has no need of them, so one is refused where it is read, whatever it would expand to."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise UsageError(
                    f"--config {path}: YAML alias *{event.anchor} (line {event.start_mark.line + 1}): config files "
                    "take no aliases or merge keys (<<); write the value out"
                )
            return super().compose_node(parent, index)

    return NoAliasLoader


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_no_alias_loader(path))  # noqa: S506 - a SafeLoader
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"--config {path}: a folder, not a YAML file") from None
    except UnicodeDecodeError:
        raise UsageError(f"--config {path}: not UTF-8 text") from None
    except RecursionError:
        raise UsageError(f"--config {path}: nested deeper than the YAML reader goes") from None
    except ValueError as e:  # a value YAML reads but Python cannot hold, e.g. the date 2026-02-30
        raise UsageError(f"--config {path}: {one_line(e)}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UsageError(f"--config {path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of settings")
    return data


def yaml_settings(path: str) -> tuple[dict[str, Any], list[str]]:
    """Settings and Beam flags from a config file."""
    data = _load_yaml(path)
    settings: dict[str, Any] = {}
    beam_flags: list[str] = []
    for key, value in data.items():
        if key == "pipeline_options":
            if not isinstance(value, dict):
                raise UsageError(f"--config {path}: pipeline_options must be a mapping")
            beam_flags.extend(_beam_flags_from_mapping(value, path))
            continue
        if key not in CONFIG_KEYS:
            raise UsageError(f"--config {path}: unknown setting {key!r}")
        if value is None:
            continue
        value = _expand(value, key, path)
        if key == "split_ratios" and isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        settings[key] = _setting_value(key, value, path)
    return settings, beam_flags


_KIND_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def _setting_value(key: str, value: Any, path: str) -> Any:
    """A config file's value as its flag would take it: ``seed: 1.5`` and ``image_size: true`` are
    errors (as ``--seed 1.5`` is), not 1; numbers may be quoted; a YAML date is text (run_date)."""
    kind = CONFIG_KEYS[key]
    fits = isinstance(value, bool) if kind is bool else not isinstance(value, (bool, list, dict))
    try:
        if fits:
            return value if kind is bool else kind(str(value))
    except ValueError:
        pass
    raise UsageError(f"--config {path}: {key} must be {_KIND_NAMES[kind]}, got {value!r}")


def _expand(value: Any, key: str, path: str) -> Any:
    """``${VAR}`` in a config string comes from the environment; an unset one is an error naming it.
    ``${VAR:-default}`` is ``default`` when VAR is unset or empty (``${VAR:-}``: an optional setting; a Beam
    option that comes out empty is left out)."""
    if not isinstance(value, str) or "$" not in value:
        return value
    value = re.sub(
        r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}", lambda m: os.environ.get(m.group(1)) or m.group(2), value
    )
    expanded = os.path.expandvars(value)
    missing = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded)
    if missing:
        raise UsageError(f"--config {path}: {key} needs the environment variable {missing[0]} (or pass the flag)")
    return expanded


def _beam_flags_from_mapping(options: dict[str, Any], path: str = "") -> list[str]:
    flags: list[str] = []
    for key, value in options.items():
        value = [_expand(v, key, path) for v in value] if isinstance(value, list) else _expand(value, key, path)
        if value is True:
            flags.append(f"--{key}")
        elif value is False or value is None or value == "":
            continue
        elif isinstance(value, list):
            flags.extend(f"--{key}={item}" for item in value)
        else:
            flags.append(f"--{key}={value}")
    return flags
