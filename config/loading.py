"""Reading a profile file: YAML problems and schema problems become one-line ProfileErrors.

- YAML syntax errors name the file, line and column;
- a key given twice is refused (YAML would silently keep the last one);
- an unknown key is reported as such, with the closest known key as a suggestion, before any
  "missing field" that the misspelling causes;
- a number where a string is expected gets a hint to quote it (`eks_version: 1.30` is 1.3).
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from config.errors import ProfileError
from config.profile import PROFILE_DIR, Profile
from config.training import describe_error, pod_owned


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys, naming the line of the second one."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ProfileError(
                f"{key_node.start_mark.name}:{line}: key {key!r} appears twice (first on line {seen[key]})"
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> data; a syntax error becomes `file:line:column: problem`."""
    loader = _UniqueKeyLoader(text)
    loader.name = source
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise ProfileError(f"{where}: YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{source}: YAML error: {str(exc).splitlines()[0]}") from None
    finally:
        loader.dispose()


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that holds the field at `loc` (for did-you-mean suggestions)."""
    model: type[BaseModel] = Profile
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is None:
            return None
        model = nested
    return model


def _describe(err: dict) -> str:
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc) or "profile"
    if err["type"] == "extra_forbidden" and loc[:1] == ("trainer",) and str(loc[-1]) in pod_owned():
        return f"{where}: set by the deployment ({pod_owned()[str(loc[-1])]}), not by a profile"
    if err["type"] == "extra_forbidden":
        model = _model_at(loc)
        known = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
        return f"{where}: unknown key{hint}"
    if len(loc) > 1 and loc[0] == "trainer":  # a trainer setting: the trainer's own words
        return describe_error({**err, "loc": loc[1:]}, lambda name: f"trainer.{name}")
    msg = err["msg"].removeprefix("Value error, ")
    if not loc:  # a rule between fields: its message names them
        return msg
    if err["type"] == "string_type" and isinstance(err.get("input"), (int, float)):
        msg += f"; quote it in YAML (\"{err['input']}\" is read as a number)"
    return f"{where}: {msg}"


def profile_from_dict(data: dict) -> Profile:
    """Validate raw profile data; the first problem (unknown keys first) becomes a ProfileError."""
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        raise ProfileError(f"profile {data.get('name', '?')!r}: {_describe(errors[0])}") from None


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """`section.key=value` settings on top of a profile's data, each value read as YAML reads it
    (`true`, `64`, `[memory, node]`); the result is validated as the file is."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        path = [p for p in key.strip().split(".") if p]
        if not sep or not path:
            raise ProfileError(f"--set {item!r}: expected KEY=VALUE, e.g. trainer.compile=true")
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ProfileError(f"--set {item!r}: {part} is not a section")
            node = child
        node[path[-1]] = parse_yaml(text, f"--set {key}")
    return out


def load_profile(name_or_path: str, overrides: Sequence[str] = ()) -> Profile:
    """Load `config/profiles/NAME.yaml`, or a YAML file by path, with `--set` overrides."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ProfileError(
            f"profile {name_or_path!r} not found; available: {', '.join(available_profiles())}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"profile file {path} is not UTF-8 text (byte {exc.start}); is it "
                           "a YAML file?") from None
    data = parse_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path} must hold a mapping")
    data.setdefault("name", path.stem)
    return profile_from_dict(apply_overrides(data, overrides))
