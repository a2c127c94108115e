"""The platform's SSH key, made on first use by whichever process needs it first."""

import multiprocessing
import stat

import pytest

from nodes import ssh


def _load(path, start, out):
    start.wait()
    try:
        out.put(ssh.public_key_line(ssh.load_or_create_platform_key(path)))
    except Exception as exc:  # noqa: BLE001 - the parent reports what went wrong
        out.put(f"error: {exc!r}")


@pytest.mark.parametrize("attempt", range(5))  # a race: each round another chance to lose
def test_processes_starting_together_end_with_one_whole_key(tmp_path, attempt):
    """Web, workers and the gateway on a first start: each reads the same key, none
    fails on a file another is still writing."""
    path = tmp_path / "ssh" / "id_ed25519"
    context = multiprocessing.get_context("fork")
    start, out = context.Event(), context.Queue()
    procs = [context.Process(target=_load, args=(path, start, out)) for _ in range(8)]
    for proc in procs:
        proc.start()
    start.set()
    lines = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert len(set(lines)) == 1 and not lines[0].startswith("error"), lines
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    public = path.with_name("id_ed25519.pub").read_text()
    assert public == lines[0] + " gpuplatform\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["id_ed25519", "id_ed25519.pub"]
    # later loads read it, never make another
    assert ssh.public_key_line(ssh.load_or_create_platform_key(path)) == lines[0]
