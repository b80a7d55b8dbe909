"""The references a newcomer reads: docs/cli.md and docs/api.md are what their scripts generate from the code now,
every `--help` shows the defaults, every public name says what it is and returns, and docs/architecture.md names
every module."""

import argparse
import importlib.util
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["cli_reference", "api_reference"])
def test_the_reference_page_is_what_its_script_generates(name):
    script = _script(name)
    assert script.PAGE.read_text(encoding="utf-8") == script.render(), (
        f"{script.PAGE.relative_to(ROOT)} is out of date: python scripts/{name}.py")


def _subparsers():
    from ortlab.cli import build_parser

    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_argument_has_help_and_help_shows_each_default():
    from ortlab.cli import shown_default

    for name, parser in _subparsers().items():
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"ortlab {name} {action.dest}: no help text"
            shown = shown_default(action)
            if shown is not None:
                assert f"(default: {shown})" in text, f"ortlab {name} --help does not show {action.dest}'s default"
            assert "default: None" not in text and "(default: [])" not in text and "(default: False)" not in text


def test_a_default_the_help_names_itself_is_not_repeated():
    parsers = _subparsers()
    burst = " ".join(parsers["burst"].format_help().split())
    assert "(default: pytorch,ortmodule on the ort stack, pytorch,compile on the current stack" in burst
    assert "ortmodule unless told" in burst  # the CLI's and Python's defaults
    assert "(default: on)" in burst and "(default: True)" not in burst  # --memory / --no-memory
    assert burst.count("(default: the demo)") == 1 and "(default: 20)" in burst
    graphs = " ".join(parsers["graphs"].format_help().split())
    assert "(default: every mode listed;" in graphs and "(default: training)" not in graphs


# What a docstring that says what it returns looks like: "Returns ...", or it opens with the thing returned ("The
# Run ...", "Whether ...", "{option: value} ...") or the question answered ("Will `model` ... train?").
_SAYS_RESULT = re.compile(r"\breturns?\b|\byields?\b|^[{\[(]|^(the|a|an|one|every|each|all|what|which|whether|"
                          r"how|its|this|these|true|none|per|everything|is|are|does|did|will|why|where|when)\b",
                          re.IGNORECASE)


def _public():
    import ortlab

    api = _script("api_reference")
    for name in ortlab.__all__:
        value = getattr(ortlab, name)
        yield name, value, api.kind(value)
        if api.kind(value) in ("class", "exception"):
            for member_name, member in api.public_members(value):
                yield f"{name}.{member_name}", member, "property" if isinstance(member, property) else "method"


def test_every_public_name_says_what_it_is_and_what_it_returns():
    api = _script("api_reference")
    missing, no_result = [], []
    for name, value, kind in _public():
        if kind == "data":
            assert api.DATA.get(name), f"ortlab.{name} has no description in scripts/api_reference.py DATA"
            continue
        target = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        text = api.doc(target)
        if not text:
            missing.append(name)
            continue
        if kind in ("function", "method"):
            result = inspect.signature(target).return_annotation
            if result not in (None, "None") and not _SAYS_RESULT.search(text):
                no_result.append(name)
    assert not missing, f"public names without a docstring: {', '.join(missing)}"
    assert not no_result, f"docstrings that do not say what they return: {', '.join(no_result)}"


def test_architecture_names_every_module():
    """docs/architecture.md's table names every module under ortlab/: a top-level module as `name.py` in the
    first cell of its row, a package's module as `name` in the row of its package (`package/` first)."""
    import ortlab

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {}
    for line in page.splitlines():
        if line.startswith("| `"):
            first = line[2:].partition(" | ")[0]
            for cell in re.findall(r"`([^`]+)`", first):
                rows[cell] = rows.get(cell, "") + line
    unnamed = []
    for info in pkgutil.walk_packages(ortlab.__path__, "ortlab."):
        parts = info.name.split(".")[1:]
        if parts[-1] == "__main__":
            continue
        if info.ispkg:
            named = "/".join(parts) + "/" in rows
        elif len(parts) == 1:
            named = f"{parts[0]}.py" in rows
        else:
            package, leaf = "/".join(parts[:-1]) + "/", parts[-1]
            named = f"{package}{leaf}.py" in rows or f"`{leaf}`" in rows.get(package, "")
        if not named:
            unnamed.append(info.name)
    assert not unnamed, f"docs/architecture.md does not name: {', '.join(unnamed)}"


def _documented_commands() -> list[tuple[str, str]]:
    """(file, command) of every `ortlab ...` command README.md and docs/ show: lines of code blocks and inline code
    spans that start with `ortlab ` or `bin/ortlab `, without their comments; synopses ([--flag], A | B, ...) and
    `--help` left out."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if path.name in ("cli.md", "api.md"):
            continue
        text = path.read_text(encoding="utf-8")
        blocks = [m.group(2) for m in re.finditer(r"```(\w*)\n(.*?)```", text, flags=re.S)
                  if m.group(1) in ("", "bash", "sh", "console")]
        candidates = [line for block in blocks for line in block.splitlines()]
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        candidates += [span for span in re.findall(r"`([^`\n]+)`", prose) if re.match(r"(bin/)?ortlab ", span)]
        for line in candidates:
            command = line.split("#", 1)[0].strip()
            command = re.sub(r"^bin/ortlab\b", "ortlab", command)
            if not command.startswith("ortlab ") or re.search(r"\[|\.\.\.|\||--help|COMMAND|&&", command):
                continue
            found.append((path.name, command))
    return found


def test_every_documented_command_parses_as_written():
    """Every command README.md and docs/ show is one `ortlab` accepts: its subcommand, flags and choices exist."""
    import contextlib
    import io
    import shlex

    from ortlab.cli import build_parser

    commands = _documented_commands()
    assert len(commands) > 20  # the extraction finds the docs' commands
    wrong = []
    for where, command in commands:
        err = io.StringIO()
        if len(shlex.split(command)) == 2:  # a subcommand named in prose ("`ortlab diff` reads ..."): it exists
            command += " --help"
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit as e:
            if command.endswith(" --help") and e.code == 0:
                continue
            wrong.append(f"{where}: {command}: {err.getvalue().strip()}")
    assert not wrong, "\n".join(wrong)


def _anchors(page: Path) -> set[str]:
    """The heading anchors GitHub makes for a page: lower case, punctuation but - and _ dropped, spaces as -,
    a repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        anchors.add(slug + (f"-{seen[slug]}" if seen[slug] else ""))
    return anchors


def test_links_into_the_references_land_on_a_heading():
    pages = {name: _anchors(ROOT / "docs" / name) for name in ("cli.md", "api.md")}
    broken = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name, anchor in re.findall(r"\((?:docs/)?(cli\.md|api\.md)#([^)]+)\)", path.read_text(encoding="utf-8")):
            if anchor not in pages[name]:
                broken.append(f"{path.name}: {name}#{anchor}")
    assert not broken, f"links to no heading: {', '.join(broken)}"


def _shape(text: str) -> list[str]:
    """A summary's lines with the numbers masked, spaces collapsed (columns widen with the numbers) and the
    machine-dependent lines left out (a busy machine; the runs' folders, last): what must read the same in the
    README as in a burst printed today."""
    text = text[:text.index("\nruns: ")] if "\nruns: " in text else text
    return [" ".join(re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", line).split()) for line in text.splitlines()
            if line.strip() and not line.startswith("busy machine")]


@pytest.mark.slow
@pytest.mark.ort
def test_the_readmes_sample_output_is_what_burst_prints(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("What `bin/ortlab burst` printed")
    sample = readme[readme.index("```\n", start) + 4:readme.index("```\n", readme.index("```\n", start) + 4)]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # a user's threads (one: the CPU time)
    r = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--steps", "3", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _shape(r.stdout) == _shape(sample), "README.md's sample output is stale: paste what bin/ortlab burst prints"
