"""The one callable loader (ram_live/loading.py): both spellings, the current folder on request, every error a
ConfigError naming the option and the path."""

import math

import pytest

from ram_live.errors import ConfigError
from ram_live.loading import load_callable


def test_both_spellings_and_callables_pass_through():
    assert load_callable("math:sqrt", "evaluate") is math.sqrt
    assert load_callable("math.sqrt", "evaluate") is math.sqrt
    assert load_callable(len, "evaluate") is len


@pytest.mark.parametrize(
    "value, message",
    [
        ("sqrt", "--eval takes package.module:function, got 'sqrt'"),
        ("math:", "--eval takes package.module:function"),
        ("bad-name:f", "--eval takes package.module:function"),
        ("no_such_module_q:f", "--eval='no_such_module_q:f': cannot import 'no_such_module_q'"),
        ("math:nothing", "--eval='math:nothing': 'math' has no function 'nothing'"),
        ("math:pi", "--eval='math:pi': math.pi is not callable"),
        (3, "--eval takes a callable or 'package.module:function', got int"),
    ],
)
def test_errors_name_the_option_and_path(value, message):
    with pytest.raises(ConfigError) as info:
        load_callable(value, "--eval")
    assert message in str(info.value)


def test_from_cwd_imports_a_module_of_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "my_scores_x.py").write_text("def score(model):\n    return 1.5\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    with pytest.raises(ConfigError, match="cannot import"):
        load_callable("my_scores_x:score", "--eval")
    assert load_callable("my_scores_x:score", "--eval", from_cwd=True)(None) == 1.5
    (tmp_path / "broken_scores_x.py").write_text("def score(model):\n    return 1\nraise NameError('typo')\n")
    with pytest.raises(ConfigError, match="importing 'broken_scores_x' raised NameError: typo"):
        load_callable("broken_scores_x:score", "--eval", from_cwd=True)


def test_a_python_file_path_as_verl_names_its_reward_function(tmp_path):
    (tmp_path / "my_reward.py").write_text("def compute_score(d, s, g, e=None):\n    return 2.5\n")
    assert load_callable(f"{tmp_path / 'my_reward.py'}:compute_score", "score")("toy", "x", "y") == 2.5
    with pytest.raises(ConfigError, match="'nothing'"):
        load_callable(f"{tmp_path / 'my_reward.py'}:nothing", "score")
    with pytest.raises(ConfigError, match="no file .*absent.py"):
        load_callable(f"{tmp_path / 'absent.py'}:compute_score", "score")


@pytest.mark.parametrize(
    "body, message",
    [
        ("import sys\nsys.exit(0)\n", "importing 'exits_at_import_{i}' called sys.exit(0)"),
        ("raise SystemExit('bye')\n", "importing 'exits_at_import_{i}' called sys.exit('bye')"),
        ("exit()\n", "importing 'exits_at_import_{i}' called sys.exit(None)"),
        ("raise GeneratorExit\n", "importing 'exits_at_import_{i}' raised GeneratorExit"),
    ],
)
def test_a_module_that_exits_while_imported_is_a_config_error(tmp_path, monkeypatch, body, message):
    i = len(body)  # a module name of its own per case (a failed import leaves nothing in sys.modules anyway)
    (tmp_path / f"exits_at_import_{i}.py").write_text(body + "def score(model):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_callable(f"exits_at_import_{i}:score", "--reward", from_cwd=True)
    assert str(info.value) == f"--reward='exits_at_import_{i}:score': " + message.format(i=i)
    (tmp_path / "interrupted_q.py").write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C stays Ctrl-C
        load_callable("interrupted_q:score", "--reward", from_cwd=True)
