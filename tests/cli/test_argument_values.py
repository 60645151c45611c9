"""A number out of range on a command's options is argparse's usage error naming the option, before any model
loads (the model path here does not exist, so a check after loading would name it instead): `eval --threads -2`
died in torch after the model had loaded, `serve --port 70000` in the socket, `eval --batch-tokens 0` named an
internal key."""

import pytest

from rmkit import cli

DATA = "rmkit/resources/default_val.jsonl"
MODEL = "/nonexistent/model"


@pytest.mark.parametrize("argv, error", [
    (["eval", "--model", MODEL, "--data", DATA, "--threads", "-2"], "argument --threads: must be >= 1, got -2"),
    (["eval", "--model", MODEL, "--data", DATA, "--threads", "0"], "argument --threads: must be >= 1, got 0"),
    (["eval", "--model", MODEL, "--data", DATA, "--batch-tokens", "0"], "argument --batch-tokens: must be >= 1, got 0"),
    (["eval", "--model", MODEL, "--data", DATA, "--max-length", "1"],
     "argument --max-length: must be >= 2 tokens, got 1"),
    (["eval", "--model", MODEL, "--data", DATA, "--report", "r", "--calibration-bins", "0"],
     "argument --calibration-bins: must be >= 1, got 0"),
    (["score", "--model", MODEL, "--input", DATA, "--output", "o.jsonl", "--threads", "two"],
     "argument --threads: expected a whole number, got 'two'"),
    (["serve", "--model", MODEL, "--port", "70000"], "argument --port: a TCP port is 0 to 65535, got 70000"),
    (["serve", "--model", MODEL, "--max-batch-size", "0"], "argument --max-batch-size: must be >= 1, got 0"),
    (["serve", "--model", MODEL, "--batch-window-ms", "-1"], "argument --batch-window-ms: must be >= 0.0, got -1"),
    (["serve", "--model", MODEL, "--max-inputs", "0"], "argument --max-inputs: must be >= 1, got 0"),
    (["data", "check", DATA, "--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
])
def test_an_out_of_range_number_is_a_usage_error_before_anything_loads(argv, error, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].endswith(error), err


@pytest.mark.parametrize("argv, error", [
    (["serve", "--model", MODEL, "--host", "not a host"], "config key '--host': cannot resolve 'not a host'"),
    (["serve", "--model", MODEL, "--device", "gpu"], "config key '--device': 'gpu' is not a device: cpu, cuda, cuda:1"),
    (["parity", "--model", MODEL, "--data", DATA, "--tolerance", "-1"], "argument --tolerance: must be >= 0.0, got -1"),
    (["parity", "--model", MODEL, "--data", DATA, "--limit", "0"], "argument --limit: must be >= 1, got 0"),
])
def test_serve_and_parity_check_their_values_before_the_model(argv, error, capsys):
    """`serve --host 'not a host'` loaded the model and printed uvicorn's lines before failing; `--device cuda:7` on
    a machine without CUDA died in torch with a traceback; `parity --tolerance -1` scored every path, then failed."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and error in err.strip().splitlines()[-1], err


@pytest.mark.parametrize("argv, error", [
    (["data", "check", DATA, "--tokenizer", "/nonexistent"], "config key '--tokenizer': no such model directory"),
    (["data", "check", DATA, "--chat-template", "t.jinja"], "config key '--chat-template': it renders conversations"),
    (["data", "check", DATA, "--tokenizer", "minilm", "--chat-template", "/nonexistent.jinja"],
     "config key '--chat-template': no such file: /nonexistent.jinja"),
    (["data", "check", DATA, "--step-separator", ""], "config key '--step-separator': must not be empty"),
])
def test_data_check_options(argv, error, capsys):
    """`--tokenizer /nonexistent` died in huggingface_hub with a traceback, `--step-separator ''` in a ValueError,
    and `--chat-template` without `--tokenizer` was dropped without a word."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and error in err.strip().splitlines()[-1], err


def test_data_check_takes_a_packaged_tokenizer_by_its_alias(capsys):
    """`--tokenizer minilm` passed the path check, then went to the Hub as a repository named "minilm"."""
    assert cli.main(["data", "check", DATA, "--tokenizer", "minilm", "--max-length", "64"]) == 0
    assert "chosen tokens: min" in capsys.readouterr().out
