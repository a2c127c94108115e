"""The lab's node software, compiled here at start: the emulated libcuda, the quota library,
the workload program, and the workload image's build context (no registry)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from .jupyter_image import jupyter_context, saved_image
from .prereqs import NODE_PATH, LabUnavailable

HERE = Path(__file__).resolve().parent
NODE_FILES = HERE / "node"
IMAGE = "gpuplatform-lab/workload:1"  # built from build_artifacts' context in each node's dockerd
# Stand-ins for the images renters launch, from the same context: a real OpenSSH sshd that
# takes the renter's key from PUBLIC_KEY (run as an ordinary user: under --cap-drop ALL
# root may not chroot, which sshd's privilege separation needs as root), and an HTTP
# service, each starting the GPU job given as the command.
SSH_IMAGE = "gpuplatform-lab/ssh:1"
HTTP_IMAGE = "gpuplatform-lab/http:1"
SSH_PORT = 22
HTTP_PORT = 8000
SSH_USER_IN_IMAGE = "renter"
# where the platform gives an SSH image its slice's own host key (nodes.host_keys)
HOST_KEY_IN_CONTAINER = "/run/gpuplatform/ssh_host_ed25519_key"
IMAGES = {IMAGE: "Dockerfile", SSH_IMAGE: "Dockerfile.ssh", HTTP_IMAGE: "Dockerfile.http"}
# under the build directory: links to the Jupyter image's context and to where that image
# is saved once built (nodelab.jupyter_image)
JUPYTER_CONTEXT = "jupyter"
JUPYTER_SAVED = "jupyter.tar"
# what OpenSSH needs inside: the server, and ssh-keygen for a host key made at first start
OPENSSH_BINARIES = ("/usr/sbin/sshd", "/usr/bin/ssh-keygen")
# rsync's receiving end (`rsync -e ssh` runs `rsync --server` inside), Debian's as well
RSYNC_BINARY = "/usr/bin/rsync"
BUSYBOX_APPLETS = (
    "sh", "ash", "cat", "echo", "env", "id", "ls", "ps", "sleep", "grep", "head", "tail",
    "kill", "mkdir", "rm", "true", "false", "wc", "tr", "cut", "dd", "hostname", "uname",
    "free", "top", "date", "test", "[", "httpd", "nc",
)  # fmt: skip


def build_artifacts(out: Path, *, jupyter: bool = False) -> Path:
    """Compile the emulated driver library, the quota library and the workload, and lay
    out the workload image's build context; with `jupyter`, link to the Jupyter image's
    context and saved image (nodelab.jupyter_image, made once and kept). Returns the build
    directory."""
    out.mkdir(parents=True, exist_ok=True)
    _compile(out)
    _image_context(out)
    if jupyter:
        context = jupyter_context()
        for name, target in (
            (JUPYTER_CONTEXT, context),
            (JUPYTER_SAVED, saved_image(context, out / "image" / "rootfs")),
        ):
            (out / name).unlink(missing_ok=True)
            (out / name).symlink_to(target)
    return out


def _compile(out: Path) -> None:
    """The emulated libcuda, the quota library (and its env-only variant) and the workload,
    dynamic and static."""
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
    # the slice's nvidia-smi: through libcuda, so a preloaded quota library answers it
    _build([*cc, "-o", str(out / "nvidia-smi-slice"), str(NODE_FILES / "slice-smi.c"),
            f"-L{out}", "-lcuda"])  # fmt: skip


def _image_context(out: Path) -> None:
    """The workload images' build context in `out/image`: a root filesystem and the
    Dockerfiles of the plain, SSH and HTTP images."""
    context = out / "image"
    rootfs = context / "rootfs"
    shutil.rmtree(context, ignore_errors=True)
    _image_rootfs(rootfs, out)
    (context / "home" / SSH_USER_IN_IMAGE).mkdir(parents=True)
    base = "FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/local/bin:/usr/bin:/bin\n"
    (context / "Dockerfile").write_text(base + 'CMD ["/usr/bin/gpu-workload"]\n')
    (context / "Dockerfile.ssh").write_text(
        base + f"COPY --chown=1000:1000 home/ /home/\nUSER 1000:1000\nEXPOSE {SSH_PORT}\n"
        'ENTRYPOINT ["/usr/bin/lab-ssh"]\nCMD ["/usr/bin/gpu-workload"]\n'
    )
    (context / "Dockerfile.http").write_text(
        base + f"EXPOSE {HTTP_PORT}\n"
        'ENTRYPOINT ["/usr/bin/lab-http"]\nCMD ["/usr/bin/gpu-workload"]\n'
    )


def _image_rootfs(rootfs: Path, out: Path) -> None:
    """busybox, the workloads, the C library they link against, OpenSSH, the start
    scripts and the users."""
    for d in ("bin", "usr/bin", "usr/lib/x86_64-linux-gnu", "lib64", "lib/x86_64-linux-gnu",
              "etc/profile.d", "tmp", "root", "dev", "proc", "sys"):  # fmt: skip
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    os.chmod(rootfs / "tmp", 0o1777)  # noqa: S103 - /tmp inside the image, as on any system
    busybox = shutil.which("busybox", path=NODE_PATH)
    assert busybox is not None
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for applet in BUSYBOX_APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    shutil.copy2(out / "gpu-workload", rootfs / "usr" / "bin" / "gpu-workload")
    shutil.copy2(out / "gpu-workload-static", rootfs / "usr" / "bin" / "gpu-workload-static")
    shutil.copy2(out / "nvidia-smi-slice", rootfs / "usr" / "bin" / "nvidia-smi")
    # the C library the workload links against, from the machine's Debian libc6
    for soname, target in (
        ("ld-linux-x86-64.so.2", "lib64"),
        ("libc.so.6", "lib/x86_64-linux-gnu"),
    ):
        source = _library_path(soname)
        shutil.copy2(os.path.realpath(source), rootfs / target / soname)
    _add_openssh(rootfs)
    _add_program(rootfs, RSYNC_BINARY, "rsync")
    (rootfs / "etc" / "profile").write_text(PROFILE)
    for name, script in (("lab-ssh", SSH_START), ("lab-http", HTTP_START)):
        (rootfs / "usr" / "bin" / name).write_text(script)
        os.chmod(rootfs / "usr" / "bin" / name, 0o755)  # noqa: S103 - a program in the image
    (rootfs / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\n"
        f"{SSH_USER_IN_IMAGE}:x:1000:1000:renter:/home/{SSH_USER_IN_IMAGE}:/bin/sh\n"
    )
    (rootfs / "etc" / "group").write_text(f"root:x:0:\n{SSH_USER_IN_IMAGE}:x:1000:\n")


SSHD_CONFIG = f"""\
# The lab SSH image's sshd: keys only, as the image's user, on port {SSH_PORT}.
Port {SSH_PORT}
PidFile none
AuthorizedKeysFile .ssh/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin no
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
Subsystem sftp internal-sftp
# ~/.ssh/environment, which the start script makes from the platform's login file: a
# command without a login shell (`ssh slice env`, rsync, scp) gets the caps too
PermitUserEnvironment yes
"""
# What busybox sh reads as a login shell: the platform's file among /etc/profile.d's.
PROFILE = """\
for f in /etc/profile.d/*.sh; do
  if [ -r "$f" ]; then . "$f"; fi
done
unset f
"""
# PUBLIC_KEY is what the platform passes a slice launched with an SSH key.
SSH_START = f"""\
#!/bin/sh
# The lab SSH image: the renter's key from PUBLIC_KEY, the slice's host key where the
# platform gives one (the same on every run), else one made at first start, OpenSSH's sshd
# on port {SSH_PORT}, then the command (the GPU job by default).
set -e
mkdir -p "$HOME/.ssh"
chmod 700 "$HOME/.ssh"
printf '%s\\n' "${{PUBLIC_KEY:-}}" > "$HOME/.ssh/authorized_keys"
chmod 600 "$HOME/.ssh/authorized_keys"
# The platform's variables (nodes/login_env.py) for commands run without a login shell:
# sshd starts every session afresh and reads ~/.ssh/environment (NAME=value lines).
: > "$HOME/.ssh/environment"
if [ -r /etc/profile.d/gpuplatform.sh ]; then
  names=$(grep '^export ' /etc/profile.d/gpuplatform.sh | cut -d' ' -f2 | cut -d= -f1)
  ( . /etc/profile.d/gpuplatform.sh
    for name in $names; do eval "printf '%s=%s\\n' $name \\"\\$$name\\""; done
  ) > "$HOME/.ssh/environment"
fi
chmod 600 "$HOME/.ssh/environment"
host_key={HOST_KEY_IN_CONTAINER}
if [ ! -r "$host_key" ]; then
  host_key="$HOME/.ssh/host_ed25519"
  [ -f "$host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$host_key"
fi
/usr/sbin/sshd -f /etc/ssh/sshd_config -h "$host_key" -E /tmp/sshd.log
echo "sshd: listening on port {SSH_PORT} for $(id -un)"
exec "$@"
"""
HTTP_START = f"""\
#!/bin/sh
# The lab HTTP image: a small web service on port {HTTP_PORT} (a page and an
# OpenAI-style model list), then the command (the GPU job by default).
set -e
mkdir -p /tmp/www/v1
echo "<h1>gpuplatform lab service</h1><p>$(hostname)</p>" > /tmp/www/index.html
echo '{{"object":"list","data":[{{"id":"lab-model","object":"model"}}]}}' > /tmp/www/v1/models
httpd -p 0.0.0.0:{HTTP_PORT} -h /tmp/www
echo "http: serving on port {HTTP_PORT}"
exec "$@"
"""


def _add_openssh(rootfs: Path) -> None:
    """OpenSSH's server and ssh-keygen from the machine's Debian packages, with the shared
    libraries each loads (as ldd resolves them), and the server's configuration."""
    for binary in OPENSSH_BINARIES:
        _add_program(rootfs, binary, "openssh-server")
    (rootfs / "etc" / "ssh").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc" / "ssh" / "sshd_config").write_text(SSHD_CONFIG)


def _add_program(rootfs: Path, binary: str, package: str) -> None:
    """A program of the machine's Debian package, with the shared libraries it loads (as
    ldd resolves them), at the same path in the image."""
    if not os.path.exists(binary):
        raise LabUnavailable(f"{binary} not found: install Debian's {package}")
    target = rootfs / binary.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, target)
    for library in _libraries(binary):
        copy = rootfs / library.lstrip("/")
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(library), copy)


def _libraries(binary: str) -> list[str]:
    ldd = subprocess.run(  # noqa: S603
        ["ldd", binary],  # noqa: S607
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if ldd.returncode != 0:
        raise LabUnavailable(f"ldd {binary} failed: {ldd.stderr.strip()}")
    return [
        part
        for line in ldd.stdout.splitlines()
        for part in line.split()
        if part.startswith("/") and "ld-linux" not in part
    ]


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
