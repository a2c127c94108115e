"""The lab's Jupyter image: JupyterLab as an ordinary user on the machine's own Debian
python3 (the interpreter, its standard library and the shared libraries they load, copied as
they are), with Jupyter's wheels from PyPI installed for that python.

The build context is made once and kept under var/lab-cache/ (GPUPLATFORM_LAB_CACHE), keyed
by what goes into it: the wheels are fetched and installed only on the first lab start. The
first lab node to need the image builds it on top of the workload image and saves it beside
the context (keyed by the workload image's files too); later lab nodes load that, which
writes the tree once instead of building it (about 10 s a node here, against 25)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .prereqs import LabUnavailable

JUPYTER_IMAGE = "gpuplatform-lab/jupyter:1"
JUPYTER_PORT = 8888
JUPYTER_USER_IN_IMAGE = "renter"  # uid 1000, as in the SSH image (nodelab.build's passwd)
# JupyterLab brings jupyter_server and ipykernel; a range, so a cached tree stays valid
JUPYTER_REQUIREMENTS = ("jupyterlab>=4.2,<5",)
# Installed with them but optional where they are used, and half the files of the tree,
# which each lab node's dockerd writes one by one: jedi and parso (IPython completes
# without them) and debugpy (the kernel then offers no debugger).
OMITTED = ("jedi", "parso", "debugpy")
HOST_PYTHON = "/usr/bin/python3"
LAYOUT = 2  # part of the cache key: a change to how the context is laid out makes a new one
REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("GPUPLATFORM_LAB_CACHE") or REPO / "var" / "lab-cache")
# Parts of the standard library a notebook server never loads: the static libpython and
# its build files, the test suite, Tk and IDLE.
STDLIB_SKIP = ("config-3.*", "test", "idlelib", "tkinter", "turtledemo", "ensurepip")
# What the host python says of itself: where its parts live, as its own sysconfig and site
# name them (Debian's python puts third-party packages in /usr/local/.../dist-packages).
_DESCRIBE = """
import json, os, site, sys, sysconfig
p = sysconfig.get_paths()
print(json.dumps({
    "version": sys.version, "tag": "%d%d" % sys.version_info[:2],
    "short": "%d.%d" % sys.version_info[:2], "executable": os.path.realpath(sys.executable),
    "stdlib": p["stdlib"], "purelib": site.getsitepackages()[0], "data": p["data"],
    "scripts": p["scripts"], "dynload": os.path.dirname(__import__("_ctypes").__file__),
}))
"""
# The image's start: JupyterLab on every address of the container's own network namespace
# (on a node's network `none` only its loopback, which the platform's relay reaches with
# nsenter), at the root path, with the slice's token, then the command (the GPU job by
# default). Host and Origin are the proxy's and match: Jupyter's own same-origin check
# holds, with no allow_origin. trust_xheaders: the proxy says the browser's scheme.
START = f"""\
#!/bin/sh
# The lab Jupyter image: JupyterLab on port {JUPYTER_PORT} as $(id -un), with the token the
# platform gives the slice in JUPYTER_TOKEN (never one of its own, which it would print),
# then the command.
set -e
cd "$HOME"
if [ -n "${{JUPYTER_TOKEN:-}}" ]; then
  python3 -m jupyterlab --no-browser --ServerApp.ip=0.0.0.0 --ServerApp.port={JUPYTER_PORT} \\
    --ServerApp.port_retries=0 --ServerApp.allow_remote_access=True \\
    --ServerApp.trust_xheaders=True --ServerApp.root_dir="$HOME" &
  echo "jupyter: starting on port {JUPYTER_PORT}"
else
  echo "jupyter: no JUPYTER_TOKEN given, not started (launch with the Jupyter image entry)"
fi
exec "$@"
"""
DOCKERFILE = f"""\
FROM gpuplatform-lab/workload:1
ADD rootfs.tar /
COPY --chown=1000:1000 home/ /home/
ENV SHELL=/bin/sh
USER 1000:1000
WORKDIR /home/{JUPYTER_USER_IN_IMAGE}
EXPOSE {JUPYTER_PORT}
ENTRYPOINT ["/usr/bin/lab-jupyter"]
CMD ["/usr/bin/gpu-workload"]
"""


def jupyter_context(cache: Path = CACHE) -> Path:
    """The Jupyter image's build context (a Dockerfile, a root filesystem, the user's home),
    made on first use and then reused as it is. Raises LabUnavailable naming what failed."""
    host = _describe_host_python()
    key = hashlib.sha256(
        json.dumps(
            [LAYOUT, JUPYTER_REQUIREMENTS, OMITTED, host, STDLIB_SKIP, START, DOCKERFILE]
        ).encode()
    ).hexdigest()[:16]
    context = cache / f"jupyter-{key}"
    if (context / "Dockerfile").exists():  # written last: the directory is complete
        return context
    for stale in cache.glob("jupyter-*"):  # made for another python or other wheels
        shutil.rmtree(stale, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".jupyter-", dir=cache))
    try:
        _lay_out(work, host, cache / "wheels")
        (work / "Dockerfile").write_text(DOCKERFILE)
        try:
            work.rename(context)
        except OSError:  # another lab start finished the same context first
            if not (context / "Dockerfile").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return context


def saved_image(context: Path, base_rootfs: Path) -> Path:
    """Where the image built from `context` on top of a workload image made of
    `base_rootfs` is saved (`docker save`), whether or not it is there yet."""
    digest = hashlib.sha256()
    for path in sorted(base_rootfs.rglob("*")):
        digest.update(str(path.relative_to(base_rootfs)).encode() + b"\0")
        digest.update(oct(path.lstat().st_mode).encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return context / f"image-{digest.hexdigest()[:16]}.tar"


def _describe_host_python() -> dict[str, str]:
    if not os.path.exists(HOST_PYTHON):
        raise LabUnavailable(f"{HOST_PYTHON} is missing: install Debian's python3")
    run = _run([HOST_PYTHON, "-I", "-c", _DESCRIBE], "reading the host python3")
    described: dict[str, str] = json.loads(run.stdout)
    described["glibc"] = os.confstr("CS_GNU_LIBC_VERSION") or ""
    return described


def _lay_out(context: Path, host: dict[str, str], wheels: Path) -> None:
    """The image's files as one tar (ADD unpacks it: the build context is then one file to
    send, and the daemon writes the tree once) and the user's home."""
    rootfs = context / "rootfs"
    site = Path(tempfile.mkdtemp(prefix=".site-", dir=context))
    os.chmod(site, 0o755)  # noqa: S103 - the image's dist-packages, readable by its user
    _install_wheels(site, host, wheels)
    for omitted in OMITTED:
        for path in (*site.glob(omitted), *site.glob(f"{omitted}-*.dist-info")):
            shutil.rmtree(path)
    _copy_python(rootfs, host)
    for src, dst in (
        (site / "bin", host["scripts"]),
        (site / "share", f"{host['data']}/share"),
        (site / "etc", f"{host['data']}/etc"),
    ):
        if src.is_dir():
            shutil.move(src, _inside(rootfs, dst))
    _point_scripts_at(_inside(rootfs, host["scripts"]), f"/usr/bin/python{host['short']}")
    purelib = _inside(rootfs, host["purelib"])
    purelib.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(site, purelib)
    _copy_libraries(rootfs)
    start = rootfs / "usr" / "bin" / "lab-jupyter"
    start.write_text(START)
    os.chmod(start, 0o755)  # noqa: S103 - a program in the image
    tar = ["tar", "--create", "--file", str(context / "rootfs.tar"), "--directory", str(rootfs),
           "--owner=0", "--group=0", "--numeric-owner", "."]  # fmt: skip
    _run(tar, "packing the Jupyter image")
    shutil.rmtree(rootfs)
    (context / "home" / JUPYTER_USER_IN_IMAGE).mkdir(parents=True)


def _install_wheels(site: Path, host: dict[str, str], wheels: Path) -> None:
    """Jupyter's wheels for the host python (its version and the machine's glibc), fetched
    into `wheels` unless already there, then installed from it alone into `site`."""
    minor = int(host["glibc"].rpartition(".")[2] or 17)
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(minor, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    target = ["--only-binary=:all:", "--python-version", host["short"],
              "--implementation", "cp", "--abi", f"cp{host['tag']}", "--abi", "abi3",
              "--abi", "none"]  # fmt: skip
    for platform in platforms:
        target += ["--platform", platform]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    offline = [*pip, "install", "--no-index", "--find-links", str(wheels), "--target",
               str(site), *target, *JUPYTER_REQUIREMENTS]  # fmt: skip
    if subprocess.run(offline, capture_output=True, check=False).returncode == 0:  # noqa: S603
        return
    _run([*pip, "download", "--dest", str(wheels), *target, *JUPYTER_REQUIREMENTS],
         "fetching Jupyter's wheels from PyPI")  # fmt: skip
    shutil.rmtree(site)
    _run(offline, "installing Jupyter's wheels")


def _copy_python(rootfs: Path, host: dict[str, str]) -> None:
    """The interpreter at its own path (`python3` beside it) and its standard library."""
    executable = host["executable"]
    target = _inside(rootfs, executable)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executable, target)
    (target.parent / "python3").symlink_to(target.name)
    shutil.copytree(
        host["stdlib"],
        _inside(rootfs, host["stdlib"]),
        symlinks=True,
        ignore=shutil.ignore_patterns(*STDLIB_SKIP, "site-packages", "dist-packages"),
    )


def _copy_libraries(rootfs: Path) -> None:
    """The host's shared libraries that the interpreter and every extension module in the
    image load (as ldd resolves them), at their own paths; libraries a wheel bundles are
    already in the image."""
    elves = [str(p) for p in rootfs.rglob("*.so*") if p.is_file() and not p.is_symlink()]
    elves.append(str(next((rootfs / "usr" / "bin").glob("python3.*"))))
    for library in _libraries(elves):
        if library.startswith(str(rootfs)):
            continue
        copy = _inside(rootfs, library)
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(library), copy)


def _libraries(elves: list[str]) -> set[str]:
    """What ldd resolves for these files (one run for all: ldd takes many)."""
    ldd = subprocess.run(  # noqa: S603
        ["ldd", *elves],  # noqa: S607
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    missing = [line.strip() for line in ldd.stdout.splitlines() if "not found" in line]
    if missing:
        raise LabUnavailable(f"a library the Jupyter image needs is missing: {missing[0]}")
    return {
        part
        for line in ldd.stdout.splitlines()
        if "=>" in line
        for part in line.split()
        if part.startswith("/") and "ld-linux" not in part
    }


def _point_scripts_at(scripts: Path, interpreter: str) -> None:
    """pip wrote its own interpreter into the console scripts' first lines: the image's."""
    if not scripts.is_dir():
        return
    for script in scripts.iterdir():
        text = script.read_bytes()
        if text.startswith(b"#!") and b"python" in text.split(b"\n", 1)[0]:
            script.write_bytes(b"#!" + interpreter.encode() + b"\n" + text.split(b"\n", 1)[1])


def _inside(rootfs: Path, path: str) -> Path:
    return rootfs / path.lstrip("/")


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603
    if run.returncode != 0:
        detail = (run.stderr.strip().splitlines() or ["?"])[-1]
        raise LabUnavailable(f"{what} failed: {detail}")
    return run
