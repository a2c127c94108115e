"""The preemption notice's signal as an argv: docker kill with a signal the platform names,
to a container reference that is checked like every other."""

from __future__ import annotations

import pytest

from nodes import runtime


def test_the_notice_signal_is_docker_kill_with_term_to_one_container():
    assert runtime.kill_argv("a" * 64) == ["docker", "kill", "--signal", "TERM", "a" * 64]


@pytest.mark.parametrize("signal", ["KILL", "TERM; rm -rf /", "", "9"])
def test_a_signal_the_platform_does_not_send_is_refused(signal):
    with pytest.raises(ValueError, match="not one the platform sends"):
        runtime.kill_argv("a" * 64, signal)


@pytest.mark.parametrize("container", ["", "-f", "x; reboot", "../x"])
def test_a_container_reference_that_is_not_one_is_refused(container):
    with pytest.raises(ValueError):
        runtime.kill_argv(container)
