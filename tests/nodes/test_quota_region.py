"""The sampler reads the quota library's books as HAMi-core lays them out (its shared
region, version 1.2): the offsets it reads are the ones the lab's stand-in asserts when
it is compiled, a region built here byte by byte is read back, and anything that is not
such a region is an error, never a silent zero."""

from __future__ import annotations

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


def test_the_offsets_read_are_the_ones_the_labs_library_asserts_at_compile_time():  # type: ignore[no-untyped-def]
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


def test_a_region_counts_the_live_processes_of_its_container_by_namespace_or_host_pid():  # type: ignore[no-untyped-def]
    data = region([(1, 0, 3000 * MIB), (7, 4242, 500 * MIB), (9, 0, 900 * MIB)])
    # pid 1 by its namespace PID, pid 7 by the host PID HAMi-core recorded; 9 has exited
    assert sampler.region_usage(data, {1, 4242}) == (3500 * MIB, 8192 * MIB)
    assert sampler.region_usage(data, {None}) == (4400 * MIB, 8192 * MIB)
    assert sampler.region_usage(data, {55}) == (0, 8192 * MIB)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not a shared region"),
        (
            region([]).replace(struct.pack("<i", sampler.REGION_MAGIC), b"\0\0\0\0", 1),
            "not initialised",
        ),
        (region([], version=(1, 1)), "region version 1.1"),
        (bytes(region([]))[: sampler.REGION_SIZE - 1], "not a shared region"),
    ],
    ids=["empty", "no-magic", "other-version", "short"],
)
def test_what_is_not_a_supported_region_is_an_error(data, why):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=why):
        sampler.region_usage(data, {1})


def test_a_region_claiming_impossible_slots_is_an_error():  # type: ignore[no-untyped-def]
    data = bytearray(region([]))
    struct.pack_into("<i", data, sampler.REGION_PROC_NUM_OFFSET, 5000)
    with pytest.raises(ValueError, match="5000 process slots"):
        sampler.region_usage(bytes(data), {1})


def test_quota_usage_reads_each_containers_books_and_counts_tampered_ones_as_nothing(
    tmp_path, monkeypatch
):  # type: ignore[no-untyped-def]
    good, bad, none = "a" * 64, "b" * 64, "c" * 64
    for cid in (good, bad, none):
        (tmp_path / cid).mkdir()
    (tmp_path / good / sampler.REGION_FILE).write_bytes(region([(1, 0, 2048 * MIB)]))
    (tmp_path / bad / sampler.REGION_FILE).write_bytes(b"pid bytes\n1 999999\n")
    monkeypatch.setenv("GPUPLATFORM_VRAM_QUOTA_ACCOUNTING", str(tmp_path))
    monkeypatch.setattr(sampler, "ns_pid", lambda pid: 1)
    processes = [{"container_id": cid, "pid": 100 + i} for i, cid in enumerate((good, bad, none))]
    processes.append({"container_id": "d" * 64, "pid": 200})  # no books: not the library's
    errors: list[str] = []
    rows = sampler.quota_usage(errors, processes)
    assert rows == [
        {"container_id": good, "used_mb": 2048, "limit_mb": 8192},
        {"container_id": bad, "used_mb": 0},
        {"container_id": none, "used_mb": 0},
    ]
    assert errors == [f"quota accounting: {bad[:12]}: 19 bytes, not a shared region"]


def test_a_node_without_books_reports_none(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("GPUPLATFORM_VRAM_QUOTA_ACCOUNTING", raising=False)
    assert sampler.quota_usage([], [{"container_id": "a" * 64, "pid": 1}]) is None
