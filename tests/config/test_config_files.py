"""A config file's YAML problems are one line naming the file, line and column: a tab, an unclosed brace, and a
key given twice (PyYAML kept the second without a word, so a section written twice lost its first half)."""

import pytest

from rmkit.config import load_config
from rmkit.errors import ConfigError


@pytest.mark.parametrize("text, message", [
    ("rm:\n\tmax_num_steps: 2\n", "c.yaml:2:1: not valid YAML: found character '\\t' that cannot start any token"),
    ("rm: {max_num_steps: 2\n", "c.yaml:2:1: not valid YAML: expected ',' or '}', but got '<stream end>'"),
    ("rm:\n  max_num_steps: 2\nrm:\n  val_period: 3\n",
     "c.yaml:3:1: not valid YAML: 'rm' is given twice in one mapping (the second would replace the first)"),
    ("rm:\n  max_num_steps: 2\n  max_num_steps: 3\n",
     "c.yaml:3:3: not valid YAML: 'max_num_steps' is given twice in one mapping"),
])
def test_yaml_problems_name_file_line_and_column(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in str(err.value) and "\n" not in str(err.value)
