"""The Python API reference, docs/api.md, generated from the public names (`ortlab.__all__`): each function's
signature and docstring; each class's constructor, dataclass fields, public methods and properties; each
subpackage's summary and names.

    python scripts/api_reference.py  # write docs/api.md

tests/test_reference.py fails when the page is out of date, or when a public name has no docstring.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"

# Public names that are data, not code: what they hold (a constant has no docstring of its own).
DATA = {
    "REGISTRY": "Every ORTModule option ortlab knows, as `OptionSpec`s in the order of docs/options.md.",
    "FIXES": "The compatibility fixes by name (`ortlab.compat.registry.Fix`: what each removes, how it is applied); "
             "`fixes=` of `burst`, `check` and `Session` take these names.",
}


def kind(value: Any) -> str:
    """"package", "exception", "class", "function" or "data": which section a public name belongs to."""
    if inspect.ismodule(value):
        return "package"
    if inspect.isclass(value):
        return "exception" if issubclass(value, BaseException) else "class"
    return "function" if callable(value) else "data"


def public_members(cls: type) -> list[tuple[str, Any]]:
    """(name, member) of the methods and properties ortlab defines on `cls` (not those of object, Exception or
    ipywidgets), in source order."""
    seen, out = set(), []
    for base in cls.__mro__:
        if not base.__module__.startswith("ortlab"):
            continue
        for name, member in vars(base).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(member, property | staticmethod | classmethod) or inspect.isfunction(member):
                out.append((name, member))
    return out


def _function(member: Any) -> Any:
    return member.__func__ if isinstance(member, staticmethod | classmethod) else member


class _Plain:
    """An annotation written as text (`from __future__ import annotations`), shown without quotes."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def signature(obj: Any, name: str) -> str:
    """`name(args) -> result` as the code declares it, without `self`."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params = [p.replace(annotation=_Plain(p.annotation)) if isinstance(p.annotation, str) else p
              for p in sig.parameters.values() if p.name not in ("self", "cls")]
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):  # `= <factory>` as the factory's call, `list()`
        factories = {f.name: f.default_factory for f in dataclasses.fields(obj)
                     if f.default_factory is not dataclasses.MISSING}
        params = [p.replace(default=_Plain(f"{factories[p.name].__name__}()")) if p.name in factories else p
                  for p in params]
    result = sig.return_annotation
    if inspect.isclass(obj):
        result = inspect.Signature.empty  # a constructor returns the instance, not its __init__'s None
    sig = sig.replace(parameters=params, return_annotation=_Plain(result) if isinstance(result, str) else result)
    text = str(sig)
    return f"{name}{re.sub(r' at 0x[0-9a-f]+', '', text)}"


def doc(obj: Any) -> str:
    """The docstring ortlab wrote (not the one `dataclass` makes up from the fields, nor one inherited)."""
    text = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    if not text or (inspect.isclass(obj) and dataclasses.is_dataclass(obj) and text.startswith(obj.__name__ + "(")):
        return ""
    return inspect.cleandoc(text)


def first_sentence(text: str) -> str:
    text = " ".join(text.split("\n\n")[0].split())
    found = re.match(r"(.+?[.?!])(\s+[A-Z`(]|$)", text)
    return found.group(1) if found else text


def _fields(cls: type) -> list[str]:
    if not dataclasses.is_dataclass(cls):
        return []
    rows = ["| field | type | default |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        if f.default is not dataclasses.MISSING:
            default = f"`{f.default!r}`"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"`{f.default_factory.__name__}()`"
        else:
            default = "required"
        rows.append(f"| `{f.name}` | `{f.type}` | {default} |".replace("|`", "| `"))
    return ["Fields:", "", *(r.replace("\\|", "|") for r in rows), ""]


def _section(name: str, value: Any) -> list[str]:
    what = kind(value)
    lines = ["", f"### `ortlab.{name}`", ""]
    if what == "package":
        names = ", ".join(f"`{n}`" for n in getattr(value, "__all__", []))
        first = doc(value).split("\n\n")[0]
        lines += [f"The subpackage `{value.__name__}`: {first}", "", f"Names: {names}." if names else ""]
        return lines
    if what == "data":
        return [*lines, f"`{type(value).__name__}`: {DATA.get(name, '')}"]
    where = f"{value.__module__}"
    if what == "function":
        return [*lines, "```python", signature(value, name), "```", "", doc(value), "", f"*Defined in `{where}`.*"]
    bases = [b.__name__ for b in value.__bases__ if b is not object]
    if what == "exception":  # raised, not built: its place among the errors is what matters
        head = f"class {name}({', '.join(bases)})"
    else:
        head = f"class {signature(value, name)}" + (f"  # {', '.join(bases)}" if bases else "")
    lines += ["```python", head, "```", "", doc(value), "", *_fields(value)]
    for member_name, member in public_members(value):
        if isinstance(member, property):
            lines += [f"- **`.{member_name}`** (property): {_flat(doc(member))}"]
        else:
            lines += [f"- **`{signature(_function(member), '.' + member_name)}`**: {_flat(doc(member))}"]
    return [*lines, "", f"*Defined in `{where}`.*"]


def _flat(text: str) -> str:
    """A docstring on one line (a list item's text)."""
    return " ".join(text.split())


SECTIONS = (("function", "Functions"), ("class", "Classes"), ("exception", "Errors"), ("data", "Data"),
            ("package", "Subpackages"))


def render() -> str:
    """docs/api.md as the code says it now."""
    import ortlab

    values = {name: getattr(ortlab, name) for name in ortlab.__all__}
    lines = [
        "# The `ortlab` Python API",
        "",
        "Generated from the docstrings and signatures of `ortlab.__all__` by `python scripts/api_reference.py`;",
        "tests/test_reference.py keeps this page equal to it. `import ortlab` is light: each name loads its module",
        "(and torch or onnxruntime) on first use. The command line is in [cli.md](cli.md), how to use both in",
        "[guide.md](guide.md).",
        "",
        "Start with `burst` (one backend, a `Run`), `Session` (one model, many bursts; `compare` gives a `Comparison`",
        "with a `Verdict`), `check` (a `CheckReport`), `record` (your own loop) and `Lab` (JupyterLab).",
        "",
        "| name | kind | what it is |",
        "|---|---|---|",
    ]
    order = [n for k, _ in SECTIONS for n in sorted(values, key=str.lower) if kind(values[n]) == k]
    seen: dict[str, int] = {}
    for name in order:  # GitHub's heading anchors: `session` then `Session` are #ortlabsession, #ortlabsession-1
        value, anchor = values[name], f"ortlab{name.lower()}"
        seen[anchor] = seen.get(anchor, -1) + 1
        anchor += f"-{seen[anchor]}" if seen[anchor] else ""
        summary = DATA.get(name, "") if kind(value) == "data" else first_sentence(doc(value))
        lines.append(f"| [`{name}`](#{anchor}) | {kind(value)} | {summary.replace('|', chr(92) + '|')} |")
    for section, title in SECTIONS:
        names = [n for n in order if kind(values[n]) == section]
        if names:
            lines += ["", f"## {title}"]
            for name in names:
                lines += _section(name, values[name])
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    PAGE.write_text(render(), encoding="utf-8")
