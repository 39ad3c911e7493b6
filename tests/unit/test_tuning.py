"""Recovery knobs from the environment: defaults, overrides, one-line errors."""

import pytest

from omnigent.config.tuning import Tuning, tuning_from_env


def test_defaults_and_overrides():
    assert tuning_from_env({}) == Tuning()
    assert tuning_from_env({"OMNIGENT_PING_INTERVAL": "0.5", "OMNIGENT_PING_ALLOWANCE": "4",
                            "OMNIGENT_TURN_LOSSES": "3", "OMNIGENT_RUNNER_WAIT": "5"}) == Tuning(0.5, 4.0, 3, 5.0)
    assert tuning_from_env({"OMNIGENT_RUNNER_IDLE_TIMEOUT": "90"}).runner_idle_timeout == 90.0
    assert Tuning().approval_timeout == 600.0
    assert tuning_from_env({"OMNIGENT_APPROVAL_TIMEOUT": "30"}).approval_timeout == 30.0


@pytest.mark.parametrize(("env", "needle"), [
    ({"OMNIGENT_PING_INTERVAL": "soon"}, "OMNIGENT_PING_INTERVAL must be a number"),
    ({"OMNIGENT_TURN_LOSSES": "1.5"}, "OMNIGENT_TURN_LOSSES must be a whole number"),
    ({"OMNIGENT_RUNNER_WAIT": "0"}, "must be greater than 0"),
    ({"OMNIGENT_RUNNER_IDLE_TIMEOUT": "-1"}, "OMNIGENT_RUNNER_IDLE_TIMEOUT must be greater than 0"),
    ({"OMNIGENT_APPROVAL_TIMEOUT": "0"}, "OMNIGENT_APPROVAL_TIMEOUT must be greater than 0"),
    ({"OMNIGENT_APPROVAL_TIMEOUT": "soon"}, "OMNIGENT_APPROVAL_TIMEOUT must be a number"),
    ({"OMNIGENT_APPROVAL_TIMEOUT": "nan"}, "OMNIGENT_APPROVAL_TIMEOUT must be a finite number"),
    ({"OMNIGENT_PING_INTERVAL": "inf"}, "OMNIGENT_PING_INTERVAL must be a finite number"),
])
def test_bad_values_are_one_line_errors(env, needle):
    with pytest.raises(ValueError) as info:
        tuning_from_env(env)
    assert needle in str(info.value) and "\n" not in str(info.value)
