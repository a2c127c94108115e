"""The lab's node software, compiled here at start: the emulated libcuda, the quota library,
the workload program, and the workload image's build context (no registry)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from .prereqs import NODE_PATH, LabUnavailable

HERE = Path(__file__).resolve().parent
NODE_FILES = HERE / "node"
IMAGE = "gpuplatform-lab/workload:1"  # built from build_artifacts' context in each node's dockerd
BUSYBOX_APPLETS = (
    "sh", "ash", "cat", "echo", "env", "id", "ls", "ps", "sleep", "grep", "head", "tail",
    "kill", "mkdir", "rm", "true", "false", "wc", "tr", "cut", "dd", "hostname", "uname",
    "free", "top", "date", "test", "[", "httpd", "nc",
)  # fmt: skip


def build_artifacts(out: Path) -> Path:
    """Compile the emulated driver library, the quota library and the workload, and lay
    out the workload image's build context. Returns the build directory."""
    out.mkdir(parents=True, exist_ok=True)
    cc = ["gcc", "-O2", "-Wall", "-Wextra", "-Werror"]
    steps = [
        [*cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out / "libcuda.so.1"),
         str(NODE_FILES / "libcuda.c")],
        [*cc, "-shared", "-fPIC", "-o", str(out / "libvramquota.so"),
         str(NODE_FILES / "vramquota.c")],
        [*cc, "-DVRAMQUOTA_ENV_ONLY", "-shared", "-fPIC",
         "-o", str(out / "libvramquota-env-only.so"), str(NODE_FILES / "vramquota.c")],
        # a job that reaches the device with no dynamic loader, so nothing can be
        # preloaded into it: what only the watchdog's second count can catch
        [*cc, "-static", "-o", str(out / "gpu-workload-static"), str(NODE_FILES / "workload.c"),
         str(NODE_FILES / "libcuda.c")],
    ]  # fmt: skip
    for argv in steps:
        _build(argv)
    with contextlib.suppress(FileNotFoundError):
        (out / "libcuda.so").unlink()
    (out / "libcuda.so").symlink_to("libcuda.so.1")
    _build([*cc, "-o", str(out / "gpu-workload"), str(NODE_FILES / "workload.c"),
            f"-L{out}", "-lcuda"])  # fmt: skip
    context = out / "image"
    rootfs = context / "rootfs"
    shutil.rmtree(context, ignore_errors=True)
    for d in ("bin", "usr/bin", "usr/lib/x86_64-linux-gnu", "lib64", "lib/x86_64-linux-gnu",
              "etc", "tmp", "root", "dev", "proc", "sys"):  # fmt: skip
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    os.chmod(rootfs / "tmp", 0o1777)  # noqa: S103 - /tmp inside the image, as on any system
    busybox = shutil.which("busybox", path=NODE_PATH)
    assert busybox is not None
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for applet in BUSYBOX_APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    shutil.copy2(out / "gpu-workload", rootfs / "usr" / "bin" / "gpu-workload")
    shutil.copy2(out / "gpu-workload-static", rootfs / "usr" / "bin" / "gpu-workload-static")
    # the C library the workload links against, from the machine's Debian libc6
    for soname, target in (
        ("ld-linux-x86-64.so.2", "lib64"),
        ("libc.so.6", "lib/x86_64-linux-gnu"),
    ):
        source = _library_path(soname)
        shutil.copy2(os.path.realpath(source), rootfs / target / soname)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    (context / "Dockerfile").write_text(
        "FROM scratch\n"
        "COPY rootfs/ /\n"
        "ENV PATH=/usr/local/bin:/usr/bin:/bin\n"
        'CMD ["/usr/bin/gpu-workload"]\n'
    )
    return out


def _library_path(soname: str) -> str:
    for d in ("/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"):
        path = os.path.join(d, soname)
        if os.path.exists(path):
            return path
    raise LabUnavailable(f"{soname} not found: install Debian's libc6")


def _build(argv: list[str]) -> None:
    run = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603
    if run.returncode != 0:
        detail = (run.stderr.strip().splitlines() or ["?"])[-1]
        raise LabUnavailable(f"building the lab's node software failed: {detail}")
