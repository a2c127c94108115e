"""The node lab: GPU nodes made of real software except the GPU itself.

Each lab node is a directory and four processes on this machine:

- a private **sshd** (Debian's openssh-server) on a loopback port, with its own host key,
  config, authorized keys and pid file (never the machine's sshd or its configuration);
- a private **dockerd** (Debian's docker.io) with its own data root, exec root, socket,
  pid file, config file and cgroup parent, started with `--bridge=none --iptables=false
  --ip-masq=false`, so no container gets a network address outside its own namespace;
  the platform reaches it through the ordinary `docker` CLI over SSH;
- the **emulated GPU** (`nodelab.gpud`), the only emulated part: memory per host PID,
  utilisation, Xid/ECC;
- on dockerd's PATH the stand-in `nvidia-container-runtime-hook`, and on the SSH
  session's PATH and PYTHONPATH the stand-in `nvidia-smi`, `dmesg` and `pynvml`.

A workload image is built at start from Debian's busybox-static and the lab's own small
CUDA-like program (`nodelab/node/workload.c`, compiled here with gcc against the lab's
emulated libcuda.so.1), with no registry. Faults are real where they can be (kill a
container's process, stop sshd, restart dockerd, change the host key) and emulated where
only silicon can fail (Xid, ECC, memory that outlives its process).

    lab = Lab.start([LabNodeSpec("lab-1", (GpuSpec("NVIDIA A30"),))], authorized_keys=[key])
    node = lab.nodes[0]
    node.port, node.host_key_line(), node.docker("ps")
    lab.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodes.emulator.catalog import GpuSpec

HERE = Path(__file__).resolve().parent
NODE_FILES = HERE / "node"
REPO = HERE.parent
IMAGE = "gpuplatform-lab/workload:1"
SSH_USER = "root"
CONTAINER_NETWORK = "none"  # the node setting the platform uses for lab nodes
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CGROUP_ROOT = Path("/sys/fs/cgroup")
DOCKERD = "/usr/sbin/dockerd"
SSHD = "/usr/sbin/sshd"
BUSYBOX_APPLETS = (
    "sh", "ash", "cat", "echo", "env", "id", "ls", "ps", "sleep", "grep", "head", "tail",
    "kill", "mkdir", "rm", "true", "false", "wc", "tr", "cut", "dd", "hostname", "uname",
    "free", "top", "date", "test", "[",
)  # fmt: skip
START_TIMEOUT_S = 60.0
# containerd's sockets are the deepest paths under a node: <root>/<node>/run/docker/
# containerd/containerd-debug.sock must fit a Unix socket's 108 bytes
SOCKET_TAIL = len("/run/docker/containerd/containerd-debug.sock") + 1


class LabUnavailable(RuntimeError):
    """The lab cannot start here; the message says why in one line."""


@dataclass(frozen=True)
class LabNodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...] = (GpuSpec("NVIDIA A30"),)
    quota_library: bool = True  # the node has the VRAM quota library installed
    context_mb: int = 0  # device memory each CUDA context takes
    live_restore: bool = False  # dockerd keeps containers running across its restart
    port: int = 0  # sshd's loopback port (0: any free one)
    driver_version: str = "550.54.15"
    cuda_version: str = "12.4"
    toolkit_version: str = "1.17.8"  # what the stand-in hook reports for --version


# --- prerequisites ----------------------------------------------------------------------


def _is_static(path: str) -> bool:
    """An ELF executable without a program interpreter (PT_INTERP) is statically linked."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return False
            phoff = int.from_bytes(head[32:40], "little")
            phentsize = int.from_bytes(head[54:56], "little")
            phnum = int.from_bytes(head[56:58], "little")
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
    except OSError:
        return False
    return all(
        int.from_bytes(table[i : i + 4], "little") != 3  # PT_INTERP
        for i in range(0, len(table), phentsize)
    )


def problems() -> list[str]:
    """Why the lab cannot start here, one line each (empty when it can)."""
    out = []
    if sys.platform != "linux":
        return ["the node lab needs Linux (dockerd, sshd and cgroups)"]
    if os.geteuid() != 0:
        out.append("the node lab needs root: dockerd and sshd run as root")
    if not os.path.exists(DOCKERD):
        out.append("dockerd is missing: install Debian's docker.io")
    if not os.path.exists(SSHD):
        out.append("sshd is missing: install Debian's openssh-server")
    if shutil.which("ssh-keygen", path=NODE_PATH) is None:
        out.append("ssh-keygen is missing: install Debian's openssh-client")
    busybox = shutil.which("busybox", path=NODE_PATH)
    if busybox is None or not _is_static(busybox):
        out.append("a static busybox is missing: install Debian's busybox-static")
    if shutil.which("gcc", path=NODE_PATH) is None:
        out.append("gcc is missing: install Debian's gcc and libc6-dev")
    if shutil.which("docker", path=NODE_PATH) is None:
        out.append("the docker CLI is missing: install Debian's docker.io")
    if shutil.which("python3", path=NODE_PATH) is None:
        out.append("python3 is missing on the node's PATH: install Debian's python3")
    for tool in ("nsenter", "mount"):
        if shutil.which(tool, path=NODE_PATH) is None:
            out.append(f"{tool} is missing: install Debian's util-linux")
    return out


# --- processes ---------------------------------------------------------------------------


def _stop_process(proc: subprocess.Popen | None, timeout: float = 15.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str, alive=None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if alive is not None and not alive():
            raise LabUnavailable(f"{what}: the process exited")
        time.sleep(0.05)
    raise LabUnavailable(f"{what}: not ready within {timeout:.0f} s")


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


# --- building the node software and the workload image -----------------------------------


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


# --- a lab node ----------------------------------------------------------------------------


@dataclass
class LabContainer:
    """A container as the lab node's own docker reports it (test side, not the platform)."""

    id: str
    name: str
    status: str
    running: bool
    pid: int  # host PID of the container's first process (docker-init under --init)
    exit_code: int
    oom_killed: bool
    env: dict[str, str]
    labels: dict[str, str]
    raw: dict[str, Any] = field(repr=False)


class LabNode:
    def __init__(self, spec: LabNodeSpec, root: Path, build: Path):
        self.spec = spec
        self.name = spec.name
        self.dir = root / spec.name
        self.build = build
        self.port = spec.port
        self.etc = self.dir / "etc"
        self.run_dir = self.dir / "run"
        self.log_dir = self.dir / "log"
        self.bin = self.dir / "bin"
        self.lib = self.dir / "lib"
        self.socket = self.run_dir / "docker.sock"
        # own cgroups, apart from the machine's Docker and any other lab's
        self.cgroup_parent = f"/gpuplatform-lab-{os.getpid()}-{root.name}-{spec.name}"
        self.host_key_path = self.etc / "ssh_host_ed25519_key"
        self.authorized_keys = self.etc / "authorized_keys"
        self.kernel_log = self.log_dir / "kern.log"
        self.hook_log = self.log_dir / "hook.log"
        self.quota_library = str(self.lib / "libvramquota.so") if spec.quota_library else ""
        self.quota_accounting = self.run_dir / "vramquota"  # one directory per container
        self._procs: dict[str, subprocess.Popen] = {}
        self._original_host_key = ""

    # -- setup
    def prepare(self, authorized_keys: list[str]) -> None:
        for d in (self.etc, self.run_dir / "gpu", self.log_dir, self.bin, self.lib / "python",
                  self.run_dir / "user", self.quota_accounting):  # fmt: skip
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        for name in ("nvidia-smi", "nvidia-container-runtime-hook"):
            shutil.copy2(NODE_FILES / name, self.bin / name)
            os.chmod(self.bin / name, 0o755)  # noqa: S103 - the node's tools, run by its sshd
        # dmesg: the machine's kernel log as the real dmesg prints it, then what the
        # emulated GPU driver logged (NVRM Xid lines, already in --time-format iso form).
        # A shell script: it runs on every sample, and a Python start would dominate it.
        real_dmesg = shutil.which("dmesg", path=NODE_PATH) or "/usr/bin/dmesg"
        (self.bin / "dmesg").write_text(
            "#!/bin/sh\n"
            "# the lab node's dmesg: the kernel's, then its emulated GPU driver's messages\n"
            f'{real_dmesg} "$@" || exit $?\n'
            f'exec cat "{self.kernel_log}"\n'
        )
        os.chmod(self.bin / "dmesg", 0o755)  # noqa: S103 - as above
        for name in ("pynvml.py", "gpuctl.py"):
            shutil.copy2(NODE_FILES / name, self.lib / "python" / name)
        shutil.copy2(self.build / "libcuda.so.1", self.lib / "libcuda.so.1")
        if self.quota_library:
            shutil.copy2(self.build / "libvramquota.so", self.quota_library)
        (self.etc / "gpu-emu.json").write_text(
            json.dumps(
                {
                    "name": self.name,
                    "control_socket": str(self.run_dir / "gpu" / "control.sock"),
                    "libcuda": str(self.lib / "libcuda.so.1"),
                    "quota_library": self.quota_library or None,
                    "quota_accounting_dir": str(self.quota_accounting)
                    if self.quota_library
                    else None,
                    "hook_log": str(self.hook_log),
                    "hook_delay_file": str(self.etc / "hook-delay"),
                    "toolkit_version_file": str(self.etc / "toolkit-version"),
                    "quota_unmounted_file": str(self.etc / "quota-unmounted"),
                    "kernel_log": str(self.kernel_log),
                },
                indent=2,
            )
        )
        (self.etc / "gpu.json").write_text(
            json.dumps(
                {
                    "name": self.name,
                    "gpus": [{"model": g.model, "mig": g.mig} for g in self.spec.gpus],
                    "driver_version": self.spec.driver_version,
                    "cuda_version": self.spec.cuda_version,
                    "context_mb": self.spec.context_mb,
                }
            )
        )
        self.kernel_log.touch()
        self.hook_log.touch()
        self.set_toolkit_version(self.spec.toolkit_version)
        self.authorize(authorized_keys)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name,
              "-f", str(self.host_key_path)])  # fmt: skip
        self._original_host_key = self.host_key_path.read_text()
        daemon = {"live-restore": self.spec.live_restore}
        (self.etc / "daemon.json").write_text(json.dumps(daemon))

    def authorize(self, keys: list[str]) -> None:
        """The public keys that may log in (sshd reads the file at every login)."""
        self.authorized_keys.write_text("".join(k.strip() + "\n" for k in keys))
        os.chmod(self.authorized_keys, 0o600)

    def start(self) -> None:
        self.start_gpu()
        self.start_dockerd()
        self.build_image()
        self.start_sshd()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.log_dir / f"{name}.log").open("ab")
        self._procs[name] = subprocess.Popen(  # noqa: S603 - fixed argv
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=self.dir,
        )
        log.close()

    def _alive(self, name: str) -> bool:
        proc = self._procs.get(name)
        return proc is not None and proc.poll() is None

    def start_gpu(self) -> None:
        control = self.run_dir / "gpu" / "control.sock"
        with contextlib.suppress(FileNotFoundError):
            control.unlink()
        self._spawn(
            "gpud",
            [sys.executable, "-m", "nodelab.gpud", "--spec", str(self.etc / "gpu.json"),
             "--run-dir", str(self.run_dir / "gpu"), "--kernel-log", str(self.kernel_log)],
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        _wait(control.exists, 15, f"{self.name}: the emulated GPU", lambda: self._alive("gpud"))

    def dockerd_argv(self) -> list[str]:
        return [
            DOCKERD,
            "--config-file", str(self.etc / "daemon.json"),
            "--data-root", str(self.dir / "docker"),
            "--exec-root", str(self.run_dir / "docker"),
            "--host", f"unix://{self.socket}",
            "--pidfile", str(self.run_dir / "docker.pid"),
            "--bridge=none", "--iptables=false", "--ip-masq=false", "--ip6tables=false",
            "--ip", "127.0.0.1",  # published ports, were any asked for, bind loopback only
            "--cgroup-parent", self.cgroup_parent,
            "--exec-opt", "native.cgroupdriver=cgroupfs",
        ]  # fmt: skip

    def start_dockerd(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        env = {"PATH": f"{self.bin}:{NODE_PATH}", "HOME": str(self.dir)}
        self._spawn("dockerd", self.dockerd_argv(), env=env)
        _wait(
            lambda: (
                self.docker("version", "--format", "{{.Server.Version}}", check=False).returncode
                == 0
            ),
            START_TIMEOUT_S,
            f"{self.name}: dockerd ({_last_line(self.log_dir / 'dockerd.log')})",
            lambda: self._alive("dockerd"),
        )

    def build_image(self) -> None:
        if self.docker("image", "inspect", IMAGE, check=False).returncode == 0:
            return
        self.docker("build", "--quiet", "--tag", IMAGE, str(self.build / "image"), timeout=120)

    def sshd_config(self) -> str:
        setenv = {
            "PATH": f"{self.bin}:{NODE_PATH}",
            "PYTHONPATH": str(self.lib / "python"),
            "DOCKER_HOST": f"unix://{self.socket}",
            "XDG_RUNTIME_DIR": str(self.run_dir / "user"),
            "GPUPLATFORM_KERNEL_LOG": str(self.kernel_log),
        }
        if self.quota_library:
            setenv["GPUPLATFORM_VRAM_QUOTA_LIBRARY"] = self.quota_library
            setenv["GPUPLATFORM_VRAM_QUOTA_ACCOUNTING"] = str(self.quota_accounting)
        return (
            f"# sshd for lab node {self.name}: loopback only, keys only, root only\n"
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key_path}\n"
            f"PidFile {self.run_dir / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            "AuthenticationMethods publickey\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            f"AllowUsers {SSH_USER}\n"
            "UsePAM no\n"
            # The lab's files sit in a private 0700 directory under a world-writable
            # /tmp, whose mode StrictModes refuses; nothing else can write there.
            "StrictModes no\n"
            "PermitUserEnvironment no\n"
            "X11Forwarding no\n"
            "AllowTcpForwarding no\n"
            "AllowAgentForwarding no\n"
            "AllowStreamLocalForwarding no\n"
            "PermitTunnel no\n"
            "PrintMotd no\n"
            "LogLevel INFO\n"
            "SetEnv " + " ".join(f"{k}={v}" for k, v in setenv.items()) + "\n"
        )

    def start_sshd(self) -> None:
        # sshd's privilege-separation directory is compiled in; Debian's unit creates it
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        for _attempt in range(3):
            if not self.port:
                self.port = _free_port()
            (self.etc / "sshd_config").write_text(self.sshd_config())
            check = subprocess.run(  # noqa: S603
                [SSHD, "-t", "-f", str(self.etc / "sshd_config")],
                capture_output=True,
                text=True,
                check=False,
            )
            if check.returncode != 0:
                raise LabUnavailable(
                    f"{self.name}: sshd refuses its config: {check.stderr.strip()}"
                )
            self._spawn(
                "sshd",
                [SSHD, "-D", "-f", str(self.etc / "sshd_config"), "-E",
                 str(self.log_dir / "sshd.log")],
            )  # fmt: skip
            try:
                _wait(self._banner, 15, f"{self.name}: sshd", lambda: self._alive("sshd"))
                return
            except LabUnavailable:
                _stop_process(self._procs.pop("sshd", None))
                if "Address already in use" not in (self.log_dir / "sshd.log").read_text():
                    raise LabUnavailable(
                        f"{self.name}: sshd did not start: {_last_line(self.log_dir / 'sshd.log')}"
                    ) from None
                if self.spec.port:
                    raise LabUnavailable(
                        f"{self.name}: port 127.0.0.1:{self.spec.port} is taken"
                    ) from None
                self.port = 0  # taken meanwhile: another port
        raise LabUnavailable(f"{self.name}: no free loopback port for sshd")

    def _banner(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                return s.recv(64).startswith(b"SSH-2.0-")
        except OSError:
            return False

    # -- what tests and the demo read
    def host_key_line(self) -> str:
        kind, b64, *_ = (self.host_key_path.with_suffix(".pub")).read_text().split()
        return f"{kind} {b64}"

    def docker(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """This node's docker CLI, run here against its private daemon (the lab's own
        hands and eyes; the platform goes through SSH)."""
        run = subprocess.run(  # noqa: S603
            ["docker", "--host", f"unix://{self.socket}", *args],  # noqa: S607 - NODE_PATH
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={"PATH": NODE_PATH, "HOME": str(self.dir), "DOCKER_BUILDKIT": "0"},
        )
        if check and run.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {run.stderr.strip()}")
        return run

    def container(self, ref: str) -> LabContainer | None:
        run = self.docker("inspect", "--type", "container", ref, check=False)
        if run.returncode != 0:
            return None
        doc = json.loads(run.stdout)[0]
        state, config = doc["State"], doc["Config"]
        return LabContainer(
            id=doc["Id"],
            name=doc["Name"].lstrip("/"),
            status=state["Status"],
            running=state["Running"],
            pid=state["Pid"],
            exit_code=state["ExitCode"],
            oom_killed=state["OOMKilled"],
            env=dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e),
            labels=config.get("Labels") or {},
            raw=doc,
        )

    def container_ids(self) -> list[str]:
        out = self.docker("ps", "--all", "--quiet", "--no-trunc").stdout
        return [line for line in out.split() if line]

    def logs(self, ref: str) -> str:
        run = self.docker("logs", ref, check=False)
        return run.stdout + run.stderr

    def exec(self, ref: str, *argv: str) -> str:
        return self.docker("exec", ref, *argv).stdout

    def gpu(self, op: str, **fields: object) -> dict[str, Any]:
        """A request to the emulated GPU's control socket."""
        sys.path.insert(0, str(NODE_FILES))
        try:
            import gpuctl
        finally:
            sys.path.remove(str(NODE_FILES))
        with gpuctl.Control(str(self.run_dir / "gpu" / "control.sock")) as ctl:
            return ctl.request(op=op, **fields)

    def gpu_processes(self, container_id: str | None = None) -> list[dict[str, Any]]:
        """The GPU processes the emulated driver holds, optionally only those whose host
        process lives in this container (by its cgroup, as the sampler finds it)."""
        procs = [p for g in self.gpu("state")["gpus"] for p in g["processes"]]
        if container_id is None:
            return procs
        out = []
        for p in procs:
            try:
                cgroup = Path(f"/proc/{p['pid']}/cgroup").read_text()
            except OSError:
                continue
            if container_id in cgroup:
                out.append(p)
        return out

    # -- faults
    def inject_xid(self, gpu: int = 0, code: int = 79, pid: int | None = None) -> None:
        self.gpu("xid", gpu=gpu, code=code, pid=pid)

    def set_hook_delay(self, seconds: float) -> None:
        """The toolkit hook takes this long (0: none): a container start that hangs with
        the container already created."""
        path = self.etc / "hook-delay"
        if seconds > 0:
            path.write_text(str(seconds))
        else:
            path.unlink(missing_ok=True)

    def set_toolkit_version(self, version: str) -> None:
        """The NVIDIA Container Toolkit version the node reports (an upgrade, or an old
        install for the preflight gate to refuse)."""
        (self.etc / "toolkit-version").write_text(version + "\n")

    def set_quota_library_mounted(self, mounted: bool) -> None:
        """False: the toolkit no longer puts the quota library into containers (it stays
        installed and advertised): the quota fails open."""
        path = self.etc / "quota-unmounted"
        if mounted:
            path.unlink(missing_ok=True)
        else:
            path.write_text("1\n")

    def freeze_dockerd(self, frozen: bool = True) -> None:
        """dockerd stops answering (SIGSTOP) or answers again (SIGCONT): a hung daemon."""
        proc = self._procs["dockerd"]
        os.kill(proc.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def stop_sshd(self, *, sessions: bool = False) -> None:
        """Stop the listener: new connections are refused. Sessions already open live on,
        as with Debian's ssh.service (KillMode=process), unless `sessions` (the node went
        down, or rebooted)."""
        _stop_process(self._procs.pop("sshd", None))
        if sessions:
            for pid in _holders_of_port(self.port):
                for victim in [pid, *_descendants(pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim, signal.SIGKILL)

    def restart_dockerd(self) -> None:
        _stop_process(self._procs.pop("dockerd", None), timeout=30)
        self.start_dockerd()

    def rotate_host_key(self) -> str:
        """A new host key, as after a reinstall (or an impostor at the address): sshd
        restarted with it, and no session of the old one left."""
        self.host_key_path.unlink()
        self.host_key_path.with_suffix(".pub").unlink()
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name,
              "-f", str(self.host_key_path)])  # fmt: skip
        self.stop_sshd(sessions=True)
        self.start_sshd()
        return self.host_key_line()

    def reset(self, authorized_keys: list[str] | None = None) -> None:
        """Back to a fresh node for the next test: no containers, a healthy card, its
        original host key, sshd and dockerd running, its own toolkit."""
        self.set_hook_delay(0)
        self.set_toolkit_version(self.spec.toolkit_version)
        self.set_quota_library_mounted(True)
        if self._alive("dockerd"):
            self.freeze_dockerd(False)
        else:
            self.start_dockerd()
        ids = self.container_ids()
        if ids:
            self.docker("rm", "--force", *ids, timeout=120)
        self.gpu("reset")
        self.kernel_log.write_text("")
        shutil.rmtree(self.quota_accounting, ignore_errors=True)
        self.quota_accounting.mkdir()
        if self.host_key_path.read_text() != self._original_host_key:
            self.host_key_path.write_text(self._original_host_key)
            os.chmod(self.host_key_path, 0o600)
            pub = _run(["ssh-keygen", "-y", "-f", str(self.host_key_path)]).stdout
            self.host_key_path.with_suffix(".pub").write_text(pub)
            self.stop_sshd()
        if authorized_keys is not None:
            self.authorize(authorized_keys)
        if not self._alive("sshd"):
            self.start_sshd()

    # -- teardown
    def stop(self) -> list[str]:
        """Stop everything this node started and remove what it built; returns what
        could not be cleaned up (empty when all went)."""
        left: list[str] = []
        _stop_process(self._procs.pop("sshd", None))
        if self._alive("dockerd"):
            try:
                ids = self.container_ids()
                if ids:
                    self.docker("rm", "--force", *ids, timeout=120)
                self.docker("image", "rm", "--force", IMAGE, check=False)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                left.append(f"{self.name}: containers: {exc}")
        _stop_process(self._procs.pop("dockerd", None), timeout=30)
        _stop_process(self._procs.pop("gpud", None))
        for name in list(self._procs):
            _stop_process(self._procs.pop(name))
        left += _unmount_under(self.dir)
        left += _remove_cgroups(self.cgroup_parent.lstrip("/"))
        return left


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603
    if run.returncode != 0:
        raise LabUnavailable(f"{argv[0]} failed: {run.stderr.strip()[:200]}")
    return run


def _remove_cgroups(name_glob: str) -> list[str]:
    """Remove the lab's cgroup parents (and what a killed daemon left in them) from
    every hierarchy, killing any process still in them first."""
    if not CGROUP_ROOT.is_dir():
        return []
    left = []
    for top in sorted(CGROUP_ROOT.glob(f"*/{name_glob}")):
        groups = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for group in [*groups, top]:
            with contextlib.suppress(OSError, ValueError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            for _ in range(20):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                left.append(f"cgroup {group} is still in use")
    return left


def _unmount_under(path: Path) -> list[str]:
    prefix = str(path) + "/"
    try:
        mounts = [
            line.split()[4].replace("\\040", " ")
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
        ]
    except OSError:
        return []
    left = []
    for mount in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        run = subprocess.run(["umount", "-l", mount], capture_output=True, text=True, check=False)  # noqa: S603, S607
        if run.returncode != 0:
            left.append(f"mount {mount}: {run.stderr.strip()}")
    return left


# --- the lab -------------------------------------------------------------------------------


class Lab:
    def __init__(self, root: Path, nodes: list[LabNode], *, owned_root: bool):
        self.root = root
        self.nodes = nodes
        self._owned_root = owned_root

    @classmethod
    def start(
        cls,
        specs: list[LabNodeSpec],
        *,
        authorized_keys: list[str],
        root: Path | None = None,
    ) -> Lab:
        """Start the nodes (in parallel); on any failure stop what started and raise
        LabUnavailable with the reason in one line."""
        missing = problems()
        if missing:
            raise LabUnavailable(missing[0])
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise LabUnavailable(f"lab node names must be unique: {names}")
        cleanup_stale()
        if root is not None:
            deepest = len(str(root.resolve())) + 1 + max(len(n) for n in names) + SOCKET_TAIL
            if deepest > 107:
                raise LabUnavailable(
                    f"the lab directory {root} is too long for Unix sockets "
                    f"({deepest} > 107 bytes): give a shorter one"
                )
        owned = root is None
        # Short: sockets live under it (sun_path holds 108 bytes).
        root = Path(tempfile.mkdtemp(prefix="gpl-")) if root is None else root
        root.mkdir(parents=True, exist_ok=True)
        (root / "owner.pid").write_text(str(os.getpid()))
        lab = cls(root, [], owned_root=owned)
        try:
            build = build_artifacts(root / "build")
            lab.nodes = [LabNode(spec, root, build) for spec in specs]
            for node in lab.nodes:
                node.prepare(authorized_keys)
            with ThreadPoolExecutor(max_workers=min(8, len(lab.nodes)) or 1) as ex:
                for future in [ex.submit(n.start) for n in lab.nodes]:
                    future.result()
        except BaseException:
            lab.stop()
            raise
        return lab

    def describe(self) -> dict[str, Any]:
        """What the platform needs to register the nodes (register_fleet's file)."""
        return {
            "kind": "lab",
            "nodes": [
                {
                    "name": n.name,
                    "address": "127.0.0.1",
                    "port": n.port,
                    "ssh_user": SSH_USER,
                    "container_network": CONTAINER_NETWORK,
                    "host_key": n.host_key_line(),
                    "docker_host": f"unix://{n.socket}",
                    "gpus": [g.model for g in n.spec.gpus],
                    "quota_library": n.quota_library or None,
                }
                for n in self.nodes
            ],
        }

    def stop(self) -> list[str]:
        left: list[str] = []
        with ThreadPoolExecutor(max_workers=min(8, len(self.nodes)) or 1) as ex:
            for result in ex.map(LabNode.stop, self.nodes):
                left += result
        if not left:
            if self._owned_root:
                shutil.rmtree(self.root, ignore_errors=True)
            else:  # a directory the caller gave: only what the lab made in it
                shutil.rmtree(self.root / "build", ignore_errors=True)
                for node in self.nodes:
                    shutil.rmtree(node.dir, ignore_errors=True)
                (self.root / "owner.pid").unlink(missing_ok=True)
        return left


def cleanup_stale(base: Path | None = None) -> list[str]:
    """Stop the daemons of labs whose owning process died (a killed test run) and
    remove their directories."""
    base = base or Path(tempfile.gettempdir())
    cleaned = []
    for root in base.glob("gpl-*"):
        try:
            owner = int((root / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if owner == os.getpid() or _pid_alive(owner):
            continue
        for node_dir in [p for p in root.iterdir() if (p / "run").is_dir()]:
            for pidfile in ("sshd.pid", "docker.pid"):
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int((node_dir / "run" / pidfile).read_text()), signal.SIGTERM)
            _kill_matching(str(node_dir))
        time.sleep(0.5)
        _unmount_under(root)
        _remove_cgroups(f"gpuplatform-lab-{owner}-*")
        shutil.rmtree(root, ignore_errors=True)
        cleaned.append(str(root))
    return cleaned


def _holders_of_port(port: int) -> list[int]:
    """The processes holding a TCP socket whose local port is `port` (sshd's sessions)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    holders = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                holders.append(int(proc.name))
    return holders


def _descendants(pid: int) -> list[int]:
    """Every live descendant of pid, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - set(found)
        found += sorted(frontier)
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_matching(needle: str) -> None:
    """Every process whose command line names this path (gpud, containerd, shims)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle.encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
