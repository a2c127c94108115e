"""A launch command is never a way around the reserved variable list: every plain way of
setting, unsetting or clearing one (in the argv, or in a script a shell is handed) is
found and named with isolation's reason, and ordinary commands pass. No database."""

from __future__ import annotations

import shlex

import pytest

from nodes import command_env, isolation
from nodes.command_env import command_reserved

JOB = "./job"

REFUSED = [
    # env in all its spellings
    (["env", "CUDA_DISABLE_CONTROL=true", JOB], "CUDA_DISABLE_CONTROL", "env CUDA_DISABLE_CONTROL"),
    (["/usr/bin/env", "CUDA_DEVICE_MEMORY_LIMIT=80g", JOB], "CUDA_DEVICE_MEMORY_LIMIT", "env"),
    (["env", "A=1", "CUDA_DEVICE_MEMORY_LIMIT_0=80g", JOB], "CUDA_DEVICE_MEMORY_LIMIT_0", "env"),
    (["env", "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/x", JOB], "CUDA_DEVICE_MEMORY_SHARED_CACHE", ""),
    (["env", "-u", "LD_PRELOAD", JOB], "LD_PRELOAD", "env -u LD_PRELOAD"),
    (["env", "-uLD_PRELOAD", JOB], "LD_PRELOAD", "env -u LD_PRELOAD"),
    (["env", "-v", "-u", "LD_PRELOAD", JOB], "LD_PRELOAD", "env -u"),
    (["env", "-0u", "LD_PRELOAD"], "LD_PRELOAD", "env -u"),
    (["env", "--unset=LD_PRELOAD", JOB], "LD_PRELOAD", "env -u"),
    (["env", "--unset", "LD_PRELOAD", JOB], "LD_PRELOAD", "env -u"),
    (["env", "--uns=LD_PRELOAD", JOB], "LD_PRELOAD", "env -u"),  # getopt_long's prefixes
    (["env", "-C", "/tmp", "-u", "LD_PRELOAD", JOB], "LD_PRELOAD", "env -u"),
    (["env", "--", "CUDA_DISABLE_CONTROL=1", JOB], "CUDA_DISABLE_CONTROL", "env"),
    (["env", "-i", JOB], "LD_PRELOAD", "env -i clears the whole environment"),
    (["env", "-vi", JOB], "LD_PRELOAD", "env -vi clears"),
    (["env", "-", JOB], "LD_PRELOAD", "env - clears"),
    (["env", "--ignore-environment", JOB], "LD_PRELOAD", "clears"),
    (["env", "--ignore-env", JOB], "LD_PRELOAD", "clears"),
    (["env", "-S", "CUDA_DISABLE_CONTROL=1 ./job"], "CUDA_DISABLE_CONTROL", "env"),
    (["env", "--split-string=-u LD_PRELOAD ./job"], "LD_PRELOAD", "env -u"),
    (["env", "PATH=/bin", "env", "-u", "LD_PRELOAD", JOB], "LD_PRELOAD", "env -u"),
    (["env", "NVIDIA_VISIBLE_DEVICES=all", JOB], "NVIDIA_VISIBLE_DEVICES", "env"),
    # through programs that run another (the first env or shell among their words)
    (["timeout", "60", "env", "-u", "LD_PRELOAD", JOB], "LD_PRELOAD", "env -u"),
    (["nohup", "nice", "-n", "5", "/bin/env", "LD_AUDIT=/x.so", JOB], "LD_AUDIT", "env"),
    (["tini", "--", "sh", "-c", "unset LD_PRELOAD; ./job"], "LD_PRELOAD", "unset"),
    (["busybox", "env", "-u", "LD_PRELOAD", JOB], "LD_PRELOAD", "env -u"),
    # argv words a shell would read as assignments or builtins
    (["CUDA_DISABLE_CONTROL=true", JOB], "CUDA_DISABLE_CONTROL", "before a command"),
    (["export", "LD_PRELOAD="], "LD_PRELOAD", "export LD_PRELOAD="),
    (["unset", "LD_PRELOAD"], "LD_PRELOAD", "unset LD_PRELOAD"),
    # an entrypoint that is a shell reads the first argument as a script
    (["export CUDA_DISABLE_CONTROL=1; ./job"], "CUDA_DISABLE_CONTROL", "export"),
]

SCRIPTS = [
    ("export CUDA_DISABLE_CONTROL=true; ./job", "CUDA_DISABLE_CONTROL", "export"),
    ("export A=1 CUDA_OVERSUBSCRIBE=1 && ./job", "CUDA_OVERSUBSCRIBE", "export"),
    ("CUDA_DEVICE_MEMORY_LIMIT=80g ./job", "CUDA_DEVICE_MEMORY_LIMIT", "before a command"),
    ("cd /w && A=1 CUDA_DEVICE_SM_LIMIT=100 python x.py", "CUDA_DEVICE_SM_LIMIT", "before"),
    ("CUDA_DISABLE_CONTROL=true", "CUDA_DISABLE_CONTROL", "before a command"),  # bare
    ("./prep || unset LD_PRELOAD", "LD_PRELOAD", "unset LD_PRELOAD"),
    ("echo start | unset -v LD_PRELOAD", "LD_PRELOAD", "unset"),
    ("./a & env -u LD_PRELOAD ./job", "LD_PRELOAD", "env -u"),
    ("./prep\nexport LD_PRELOAD=/x.so\n./job", "LD_PRELOAD", "export"),
    ("(export LD_PRELOAD=; ./job)", "LD_PRELOAD", "export"),
    ("if true; then export CUDA_DISABLE_CONTROL=1; fi", "CUDA_DISABLE_CONTROL", "export"),
    ("f() { unset LD_PRELOAD; }; f; ./job", "LD_PRELOAD", "unset"),
    ("function f { export LD_PRELOAD=x; }", "LD_PRELOAD", "export"),
    ("for x in 1; do CUDA_DISABLE_CONTROL=1 ./job; done", "CUDA_DISABLE_CONTROL", "before"),
    ("for LD_PRELOAD in x; do ./job; done", "LD_PRELOAD", "for LD_PRELOAD"),
    ("declare -x CUDA_DISABLE_CONTROL=true", "CUDA_DISABLE_CONTROL", "declare -x"),
    ("typeset -x LD_PRELOAD=", "LD_PRELOAD", "typeset -x"),
    ("readonly CUDA_DEVICE_MEMORY_LIMIT=80g", "CUDA_DEVICE_MEMORY_LIMIT", "readonly"),
    ("declare +x LD_PRELOAD", "LD_PRELOAD", "declare +x"),  # un-exported
    ("export -n LD_PRELOAD", "LD_PRELOAD", "export -n"),
    ("f() { local LD_PRELOAD; ./job; }", "LD_PRELOAD", "local"),
    ("declare -n r=LD_PRELOAD; r=", "LD_PRELOAD", "declare -n"),
    ("export CUDA_DEVICE_MEMORY_LIMIT+=0", "CUDA_DEVICE_MEMORY_LIMIT", "export"),
    ("read CUDA_DISABLE_CONTROL < /tmp/x", "CUDA_DISABLE_CONTROL", "read"),
    ("printf -v LD_PRELOAD %s ''", "LD_PRELOAD", "printf"),
    ("let CUDA_DEVICE_MEMORY_LIMIT=99999", "CUDA_DEVICE_MEMORY_LIMIT", "let"),
    (": ${CUDA_DISABLE_CONTROL:=true}; ./job", "CUDA_DISABLE_CONTROL", "${CUDA_DISABLE"),
    ("command export LD_PRELOAD=", "LD_PRELOAD", "export"),
    ("builtin unset LD_PRELOAD", "LD_PRELOAD", "unset"),
    ("exec env -u LD_PRELOAD ./job", "LD_PRELOAD", "env -u"),
    ("exec -c ./job", "LD_PRELOAD", "exec -c clears"),
    ("exec -a name env -i ./job", "LD_PRELOAD", "env -i"),
    ("eval 'export CUDA_DISABLE_CONTROL=1'", "CUDA_DISABLE_CONTROL", "export"),
    ("trap 'unset LD_PRELOAD' EXIT; ./job", "LD_PRELOAD", "unset"),
    ("env 2>&1 -u LD_PRELOAD ./job", "LD_PRELOAD", "env -u"),  # a redirection in between
    ("export >/dev/null LD_PRELOAD=", "LD_PRELOAD", "export"),
    # quoting the shell removes before it reads the name
    ("export 'CUDA_DISABLE_CONTROL=true'", "CUDA_DISABLE_CONTROL", "export"),
    ('export "LD_PRELOAD"=', "LD_PRELOAD", "export"),
    ("export CUDA\\_DISABLE_CONTROL=1", "CUDA_DISABLE_CONTROL", "export"),
    ("export \\\nCUDA_DISABLE_CONTROL=1", "CUDA_DISABLE_CONTROL", "export"),  # continued line
    ("echo '#'; unset LD_PRELOAD", "LD_PRELOAD", "unset"),  # a quoted # is no comment
    # a comment ends at its line: the next line is read
    ("echo hi # a comment\nexport CUDA_DISABLE_CONTROL=1", "CUDA_DISABLE_CONTROL", "export"),
    # a name the shell makes at run time could be any
    ("N=CUDA_DISABLE_CONTROL; export $N=1", "$N", "export $N=1"),
    ('unset "${V}"', "${V}", "unset"),
    ('env "$OPTS" ./job', "$OPTS", "env $OPTS"),
    # quoting shlex cannot follow: read word by word
    ("echo 'unclosed; export LD_PRELOAD=", "LD_PRELOAD", "cannot follow"),
    ("echo $'\\'' ; export CUDA_DISABLE_CONTROL=1 ; echo 'a'", "CUDA_DISABLE_CONTROL", ""),
    # a shell inside the script, inside the script
    ("sh -c 'bash -c \"unset LD_PRELOAD\"'", "LD_PRELOAD", "unset"),
]

SHELL_FORMS = [
    ["sh", "-c"],
    ["/bin/sh", "-c"],
    ["bash", "-c"],
    ["bash", "-lc"],
    ["bash", "--login", "-c"],
    ["bash", "-o", "pipefail", "-c"],
    ["bash", "-e", "-c", "--"],
    ["/usr/bin/dash", "-c"],
    ["ash", "-c"],
    ["zsh", "-c"],
    ["busybox", "sh", "-c"],
    ["/bin/busybox", "ash", "-c"],
    ["env", "HOME=/w", "sh", "-c"],
]

ALLOWED = [
    ["python", "train.py", "--env", "prod"],
    ["python", "serve.py", "--name", "a; reboot", "&&", "rm -rf /"],  # no shell reads these
    ["env"],
    ["/usr/bin/env"],
    ["env", "-0"],
    ["env", "HF_HOME=/data/hf", "python", "x.py"],
    ["env", "-u", "HF_TOKEN", "python", "x.py"],
    ["env", "-C", "/work", "python", "x.py"],
    ["printenv", "LD_PRELOAD"],
    ["printenv"],
    ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"],
    ["sh", "-c", 'echo "$LD_PRELOAD" && nvidia-smi'],
    ["sh", "-c", "env | sort; env | grep CUDA_"],
    ["sh", "-c", "export HF_HOME=/data/hf PATH=$PATH:/opt/bin; exec python serve.py"],
    ["sh", "-c", "HF_HOME=/x python -m vllm.entrypoints.openai.api_server --port 8000"],
    ["bash", "-c", "for f in *.ckpt; do echo $f; done"],
    ["bash", "-c", "ld_path=/opt/lib; cuda_disable_control=1; echo $ld_path"],  # locals
    ["bash", "-c", "./prep.sh # then: export LD_PRELOAD=x (a comment)"],
    ["bash", "-c", "unset -f LD_PRELOAD"],  # a function
    ["bash", "-c", "declare -p LD_PRELOAD; export -p"],  # they only print
    ["bash", "-c", "command -v env"],
    ["sh", "-c", 'printf "%s\\n" "$CUDA_DEVICE_MEMORY_LIMIT"'],
    ["sh", "-c", "echo ${CUDA_DEVICE_MEMORY_LIMIT:-unset}"],  # a default, not an assignment
    ["sh", "script.sh", "export", "LD_PRELOAD="],  # the script's arguments
    ["bash"],
    ["jupyter", "lab", "--ip=0.0.0.0", "--no-browser", "--allow-root"],
    [],
]


@pytest.mark.parametrize(("argv", "name", "how"), REFUSED, ids=lambda v: repr(v)[:60])
def test_a_command_that_sets_unsets_or_clears_a_reserved_variable_is_named(argv, name, how):
    found = command_reserved(argv)
    assert found is not None, argv
    assert found.name == name and how in found.how
    reason = isolation.reserved_reason(name)
    assert reason and found.reason == reason  # isolation's own reason, not another
    assert found.message == f"{name} cannot be set or unset by the command ({found.how}): {reason}."


@pytest.mark.parametrize(("script", "name", "how"), SCRIPTS, ids=lambda v: repr(v)[:60])
@pytest.mark.parametrize("shell", SHELL_FORMS, ids=lambda v: " ".join(v))
def test_a_shell_script_in_the_command_is_read_command_by_command(shell, script, name, how):
    found = command_reserved([*shell, script, "name", "arg"])
    assert found is not None, script
    assert found.name == name and how in found.how, found
    expected = command_env.DYNAMIC if name.startswith("$") else isolation.reserved_reason(name)
    assert found.reason == expected


@pytest.mark.parametrize("argv", ALLOWED, ids=lambda v: repr(v)[:60])
def test_ordinary_commands_pass(argv):
    assert command_reserved(argv) is None


def test_a_name_made_at_run_time_is_only_refused_where_a_shell_makes_it():
    # without a shell `$N` is the literal name, which nothing reserves
    assert command_reserved(["env", "$N=1", JOB]) is None
    assert command_reserved(["sh", "-c", "env $N=1 ./job"]).name == "$N"


def test_a_script_the_shell_reads_from_a_file_or_stdin_is_not_guessed_at():
    # the check reads what the command says; what an image's file says is the node's
    assert command_reserved(["sh", "/opt/start.sh"]) is None
    assert command_reserved(["bash", "-s", "--", "x"]) is None


def test_deep_nesting_and_long_scripts_are_read_to_the_end():
    nested = "unset LD_PRELOAD"
    for _ in range(6):
        nested = f"sh -c {shlex.quote(nested)}"
    found = command_reserved(["sh", "-c", nested])
    assert found.name == "LD_PRELOAD" and found.how == "unset LD_PRELOAD"
    many = " ".join(["env"] * 2000) + " CUDA_DISABLE_CONTROL=1 ./job"
    assert command_reserved(["sh", "-c", many]).name == "CUDA_DISABLE_CONTROL"
    long = "echo ok; " * 400 + "export LD_PRELOAD="
    assert command_reserved(["sh", "-c", long]).name == "LD_PRELOAD"


@pytest.mark.parametrize(
    "argv",
    [["env", "-u"], ["env", "--unset"], ["env", "-C"], ["env", "-S"], ["sh", "-c", "env -u"]]
    + [["sh", "-c"], ["sh", "-c", ""], ["sh", "-c", ";;&&||"], ["bash", "-o"], ["exec", "-a"]]
    + [["sh", "-c", "read -p"], ["sh", "-c", "printf -v"], ["sh", "-c", "for"], ["", ""]],
    ids=repr,
)
def test_a_malformed_command_is_an_answer_not_a_crash(argv):
    assert command_reserved(argv) is None
