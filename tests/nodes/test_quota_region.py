"""The sampler reads the quota library's books as HAMi-core lays them out (its shared
region, version 1.2): the offsets it reads are the ones the lab's stand-in asserts when
it is compiled, a region built here byte by byte is read back, and anything that is not
such a region is an error, never a silent zero."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pytest

from nodes import sampler

VRAMQUOTA_C = Path(__file__).resolve().parents[2] / "nodelab" / "node" / "vramquota.c"
MIB = 1024 * 1024


def region(slots: list[tuple[int, int, int]], *, limit_mb: int = 8192, version=(1, 2)) -> bytes:
    """A shared region with (pid, hostpid, bytes used on device 0) per process slot."""
    data = bytearray(sampler.REGION_SIZE)
    struct.pack_into("<iII", data, 0, sampler.REGION_MAGIC, *version)
    struct.pack_into("<Q", data, sampler.REGION_LIMIT_OFFSET, limit_mb * MIB)
    struct.pack_into("<i", data, sampler.REGION_PROC_NUM_OFFSET, len(slots))
    for i, (pid, hostpid, used) in enumerate(slots):
        at = sampler.REGION_PROCS_OFFSET + i * sampler.REGION_SLOT_SIZE
        struct.pack_into("<ii", data, at, pid, hostpid)
        struct.pack_into("<Q", data, at + sampler.SLOT_TOTAL_OFFSET, used)
    return bytes(data)


def test_the_offsets_read_are_the_ones_the_labs_library_asserts_at_compile_time():
    source = VRAMQUOTA_C.read_text()
    pattern = r'_Static_assert\(.*?== (\d+), "([a-z_ ]+)"\)'
    asserted = {what: int(n) for n, what in re.findall(pattern, source)}
    assert asserted == {
        "limit offset": sampler.REGION_LIMIT_OFFSET,
        "procs offset": sampler.REGION_PROCS_OFFSET,
        "slot size": sampler.REGION_SLOT_SIZE,
        "total": sampler.SLOT_TOTAL_OFFSET,
        "seqlock offset": 1936,  # not read: see SLOT_TOTAL_OFFSET's comment
        "proc_num offset": sampler.REGION_PROC_NUM_OFFSET,
        "region size": sampler.REGION_SIZE,
    }
    assert f"#define REGION_MAGIC {sampler.REGION_MAGIC}" in source


def test_a_region_counts_the_live_processes_of_its_container_by_namespace_or_host_pid():
    data = region([(1, 0, 3000 * MIB), (7, 4242, 500 * MIB), (9, 0, 900 * MIB)])
    # pid 1 by its namespace PID, pid 7 by the host PID HAMi-core recorded; 9 has exited
    assert sampler.region_usage(data, {1, 4242}) == (3500 * MIB, 8192 * MIB)
    assert sampler.region_usage(data, {None}) == (4400 * MIB, 8192 * MIB)
    assert sampler.region_usage(data, {55}) == (0, 8192 * MIB)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not a shared region"),
        (region([]).replace(struct.pack("<i", sampler.REGION_MAGIC), b"\0\0\0\0", 1), None),
        (region([], version=(1, 1)), "region version 1.1"),
        (bytes(region([]))[: sampler.REGION_SIZE - 1], "not a shared region"),
        (region([(1, 0, 2**64 - 1)]), "its slots claim"),
        (region([(1, 0, 2**39)] * 3), "its slots claim"),
    ],
    ids=["empty", "not-yet-initialised", "other-version", "short", "impossible", "too-many"],
)
def test_what_is_not_a_region_the_library_wrote_is_an_error(data, why):
    if why is None:  # the library counts nothing before it initialises its books
        assert sampler.region_usage(data, {1}) == (0, 0)
        return
    with pytest.raises(ValueError, match=why):
        sampler.region_usage(data, {1})
    other = isinstance(why, str) and why.startswith("region version")
    try:
        sampler.region_usage(data, {1})
    except sampler.UnsupportedRegion:
        assert other
    except ValueError:
        assert not other


def test_a_region_claiming_impossible_slots_is_an_error():
    data = bytearray(region([]))
    struct.pack_into("<i", data, sampler.REGION_PROC_NUM_OFFSET, 5000)
    with pytest.raises(ValueError, match="5000 process slots"):
        sampler.region_usage(bytes(data), {1})


def test_quota_usage_reads_each_containers_books_and_counts_tampered_ones_as_nothing(
    tmp_path, monkeypatch
):
    good, bad, none, fifo, link, newer, forged = (c * 64 for c in "abcdef0")
    for cid in (good, bad, none, fifo, link, newer, forged):
        (tmp_path / cid).mkdir()
    (tmp_path / good / sampler.REGION_FILE).write_bytes(region([(1, 0, 2048 * MIB)]))
    (tmp_path / bad / sampler.REGION_FILE).write_bytes(b"pid bytes\n1 999999\n")
    os.mkfifo(tmp_path / fifo / sampler.REGION_FILE)  # would block a plain open()
    (tmp_path / "host-file").write_bytes(region([(1, 0, 9000 * MIB)]))
    (tmp_path / link / sampler.REGION_FILE).symlink_to(tmp_path / "host-file")
    (tmp_path / newer / sampler.REGION_FILE).write_bytes(region([(1, 0, MIB)], version=(1, 3)))
    (tmp_path / forged / sampler.REGION_FILE).write_bytes(region([(1, 0, 2**64 - 1)]))
    monkeypatch.setenv("GPUPLATFORM_VRAM_QUOTA_ACCOUNTING", str(tmp_path))
    monkeypatch.setattr(sampler, "ns_pid", lambda pid: 1)
    cids = (good, bad, none, fifo, link, newer, forged)
    processes = [{"container_id": cid, "pid": 100 + i} for i, cid in enumerate(cids)]
    processes.append({"container_id": "9" * 64, "pid": 200})  # no books: not the library's
    errors: list[str] = []
    rows = {r["container_id"]: r for r in sampler.quota_usage(errors, processes)}
    assert rows.pop(good) == {"container_id": good, "used_mb": 2048, "limit_mb": 8192}
    # tampered, missing, not a file or a link out: the library holds none of it
    assert rows == {c: {"container_id": c, "used_mb": 0} for c in (bad, none, fifo, link, forged)}
    assert newer not in rows  # another version: no second count rather than a wrong one
    assert any("region version 1.3" in e for e in errors)
    assert f"quota accounting: {bad[:12]}: 19 bytes, not a shared region" in errors


def test_a_node_without_books_reports_none(monkeypatch):
    monkeypatch.delenv("GPUPLATFORM_VRAM_QUOTA_ACCOUNTING", raising=False)
    assert sampler.quota_usage([], [{"container_id": "a" * 64, "pid": 1}]) is None
