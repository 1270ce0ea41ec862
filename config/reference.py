"""The settings reference of docs/configuration.md, generated from the one definition of the
trainer's settings (`config.training`) so that the docs cannot drift from the code:
`python -m config.reference docs/configuration.md` rewrites it; a test fails when it is stale."""

from __future__ import annotations

from pathlib import Path

from config.training import GROUPS, TrainConfig, choices, field_bounds, shown

REFERENCE_BEGIN, REFERENCE_END = "<!-- settings:begin -->", "<!-- settings:end -->"


def _allowed(name: str) -> str:
    if choices(name):
        return " \\| ".join(choices(name))
    if TrainConfig.model_fields[name].annotation is bool:
        return "true \\| false"
    bounds = field_bounds(name)
    words = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    return ", ".join(f"{words[k]} {v}" for k, v in bounds.items())


def reference_markdown() -> str:
    """The table of every setting, generated so that the docs cannot drift from the code."""
    rows = ["| setting | default | allowed | what it does |", "|---|---|---|---|"]
    for group in GROUPS:
        rows.append(f"| **{group}** | | | |")
        for name, info in TrainConfig.model_fields.items():
            extra = info.json_schema_extra
            if extra["group"] != group:
                continue
            what = info.description.replace("|", "\\|")
            if extra["pod"]:
                what += f" *Set by the deployment: {extra['pod']}.*"
            rows.append(f"| `{name}` | `{shown(info.default)}` | {_allowed(name)} | {what} |")
    return "\n".join(rows)


def write_reference(path: str) -> bool:
    """Replace the table between the markers in `path`; True if the file changed."""
    doc = Path(path)
    text = doc.read_text(encoding="utf-8")
    head, _, rest = text.partition(REFERENCE_BEGIN)
    _, _, tail = rest.partition(REFERENCE_END)
    new = f"{head}{REFERENCE_BEGIN}\n{reference_markdown()}\n{REFERENCE_END}{tail}"
    doc.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":  # python -m config.reference docs/configuration.md
    import sys

    for target in sys.argv[1:] or ["docs/configuration.md"]:
        print(f"{target}: {'updated' if write_reference(target) else 'up to date'}")
