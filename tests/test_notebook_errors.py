"""Bad input in a notebook is one line: the error's class and its message (what was wrong, where ortlab looked, what
is allowed), no frames of ortlab's and no CLI flag; ORTLAB_TRACEBACK=1 brings the traceback back. IPython renders an
exception with `_render_traceback_` (ortlab.errors.InputError has one) as the lines it returns."""

import re

import pytest


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    yield shell
    InteractiveShell.clear_instance()


def _shown(shell, capsys, cell: str) -> list[str]:
    capsys.readouterr()
    shell.run_cell(cell)
    out = capsys.readouterr()
    return [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in (out.out + out.err).splitlines() if line.strip()]


def test_a_missing_model_file_in_the_lab_is_one_line(shell, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = _shown(shell, capsys, "import ortlab\nortlab.Lab('nope.py:make')")
    assert lines == [f"WorkloadError: model file 'nope.py' does not exist (looked for {tmp_path / 'nope.py'}); a "
                     "model is 'path/to/file.py:callable' or 'module:callable'"]
    lines = _shown(shell, capsys, "ortlab.Options(memory_opt_level=3)")
    assert len(lines) == 1 and lines[0].startswith("OptionError: option memory_opt_level") and "allowed" in lines[0]


def test_the_traceback_when_asked_for(shell, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORTLAB_TRACEBACK", "1")
    lines = _shown(shell, capsys, "import ortlab\nortlab.Lab('nope.py:make')")
    assert len(lines) > 5 and any("workload.py" in line for line in lines)
