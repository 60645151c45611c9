"""`rmkit R --print-config`: the resolved config of every training command as YAML, loadable again to the same
tree, printed before torch is imported; a bad key fails as a training run would."""

import subprocess
import sys

import pytest
import yaml

from rmkit.cli import main
from rmkit.cli.recipes import RECIPES, _load
from rmkit.config import config_to_dict, load_config


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_print_config_prints_the_resolved_tree(name, tmp_path, capsys):
    loop = {"train": "rm"}.get(name, name)
    command = {"prm": "train"}.get(name, name)  # `rmkit train` with a `prm` section trains a process reward model
    assert main([command, "--print-config", f"{loop}.max_num_steps=7", "logger.plots=false"]) == 0
    printed = capsys.readouterr().out
    path = tmp_path / "printed.yaml"
    path.write_text(printed, encoding="utf-8")
    tree = _load(RECIPES[name].tree)
    again = load_config(path, tree_type=tree)
    assert config_to_dict(again) == config_to_dict(load_config(None, [f"{loop}.max_num_steps=7", "logger.plots=false"],
                                                               tree_type=tree))
    assert yaml.safe_load(printed)[loop]["max_num_steps"] == 7


def test_print_config_lays_the_file_under_the_overrides(tmp_path, capsys):
    config = tmp_path / "grpo.yaml"
    config.write_text("grpo:\n  max_num_steps: 3\npolicy:\n  optimizer:\n    lr: 2.0e-6\n", encoding="utf-8")
    assert main(["grpo", "--config", str(config), "--print-config", "grpo.max_num_steps=5"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["grpo"]["max_num_steps"] == 5 and printed["policy"]["optimizer"]["lr"] == 2e-6
    assert printed["policy"]["scheduler"]["name"] == "constant"  # the RL default, not the reward model's cosine


def test_print_config_needs_no_torch():
    code = ("import sys; from rmkit.cli import main; code = main(['ppo', '--print-config']); "
            "assert code == 0 and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:3]")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "value:" in done.stdout


def test_print_config_reports_a_bad_key_where_it_is(capsys):
    assert main(["ppo", "--print-config", "value.optimizer.lr=-1"]) == 2
    assert "config key 'value.optimizer.lr': must be > 0" in capsys.readouterr().err
