import json

from conftest import assert_one_line_error, run_cli, run_in_process


def test_help_lists_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("model", "device"):
        assert command in result.stdout


def test_device_json_has_clock_verdict():
    result = run_in_process("device", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["kind"] == "cpu"
    assert "clocks_locked" in info and info["clocks_locked"] in (True, False, None)
    assert info["threads"] >= 1


def test_model_json_geometry():
    result = run_in_process("model", "deit_small", "--input-size", "448", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["resolved"] == "deit_small_patch16_224"
    assert info["num_tokens"] == 785 and info["prefix_tokens"] == 1


def test_unknown_model_is_one_line_exit_2():
    assert_one_line_error(run_in_process("model", "deit_smal"), "unknown model", "deit_small")


def test_input_size_not_divisible_is_one_line_exit_2():
    assert_one_line_error(run_in_process("model", "deit_small", "--input-size", "230"), "not divisible")


def test_unknown_option_is_one_line_exit_2():
    assert_one_line_error(run_in_process("model", "deit_small", "--bogus"), "--bogus")
