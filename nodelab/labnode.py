"""One lab node: its spec and files, its daemons (the emulated GPU, dockerd, sshd) started,
faulted, reset and stopped, and the test side's hands on its docker and its GPU."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator.catalog import GpuSpec

from .build import IMAGES, JUPYTER_CONTEXT, JUPYTER_SAVED, NODE_FILES
from .jupyter_image import JUPYTER_IMAGE
from .node import gpuctl
from .prereqs import DOCKERD, NODE_PATH, SSHD, LabUnavailable
from .processes import (
    descendants,
    free_port,
    holders_of_port,
    kill_matching,
    last_line,
    remove_cgroups,
    run_checked,
    stop_process,
    unmount_under,
    wait_until,
)

REPO = Path(__file__).resolve().parent.parent  # the checkout: the emulated GPU runs from it
SSH_USER = "root"
# The host user whose subordinate ids a userns-remap node's containers run as: a system
# account with no login and a high range, so its ids are nobody else's on the machine.
REMAP_USER = "gpplab-remap"
REMAP_RANGE = (1_500_000_000, 65536)
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LabNodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...] = (GpuSpec("NVIDIA A30"),)
    quota_library: bool = True  # the node has the VRAM quota library installed
    # its build takes settings only from each process's environment (upstream HAMi-core
    # on the CUDA path), not from the node's read-only /overrideEnv
    quota_env_only: bool = False
    # dockerd remaps user namespaces: the containers' root is an unprivileged host user
    userns_remap: bool = False
    context_mb: int = 0  # device memory each CUDA context takes
    live_restore: bool = False  # dockerd keeps containers running across its restart
    port: int = 0  # sshd's loopback port (0: any free one)
    driver_version: str = "550.54.15"
    cuda_version: str = "12.4"
    toolkit_version: str = "1.19.1"  # what the stand-in hook reports for --version
    # the node holds the Jupyter image too (nodelab.jupyter_image): the demo's nodes and the
    # tests that open Jupyter; the others go without its build
    jupyter: bool = False


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
        # where the platform installs its node agent (/var/lib/gpuplatform/agent on a host)
        self.agent_dir = self.dir / "agent"
        self._procs: dict[str, subprocess.Popen] = {}
        self._original_host_key = ""

    # -- setup
    def prepare(self, authorized_keys: list[str]) -> None:
        for d in (self.etc, self.run_dir / "gpu", self.log_dir, self.bin, self.lib / "python",
                  self.run_dir / "user", self.quota_accounting):  # fmt: skip
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        if self.spec.userns_remap:
            # dockerd refuses a data root the remapped root cannot reach: search (not
            # read) permission on the way down, for the lab's directory and this node's
            for d in (self.dir.parent, self.dir):
                os.chmod(d, 0o711)  # noqa: S103 - search only, nothing readable
        self._install_node_files()
        self._write_gpu_config()
        self.kernel_log.touch()
        self.hook_log.touch()
        self.set_toolkit_version(self.spec.toolkit_version)
        self.authorize(authorized_keys)
        run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name,
              "-f", str(self.host_key_path)])  # fmt: skip
        self._original_host_key = self.host_key_path.read_text()
        daemon = {"live-restore": self.spec.live_restore}
        (self.etc / "daemon.json").write_text(json.dumps(daemon))

    def _install_node_files(self) -> None:
        """The node's NVIDIA tools, its dmesg, the pynvml its sampler imports, the CUDA
        library and the quota library, as the node's own files."""
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
            build = "libvramquota-env-only.so" if self.spec.quota_env_only else "libvramquota.so"
            shutil.copy2(self.build / build, self.quota_library)

    def _write_gpu_config(self) -> None:
        """What the emulated GPU's tools read (gpu-emu.json) and its daemon's cards (gpu.json)."""
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
        wait_until(
            control.exists, 15, f"{self.name}: the emulated GPU", lambda: self._alive("gpud")
        )

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
            *((f"--userns-remap={REMAP_USER}",) if self.spec.userns_remap else ()),
        ]  # fmt: skip

    def start_dockerd(self) -> None:
        if self.spec.userns_remap:
            ensure_remap_user()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        env = {"PATH": f"{self.bin}:{NODE_PATH}", "HOME": str(self.dir)}
        self._spawn("dockerd", self.dockerd_argv(), env=env)
        wait_until(
            lambda: (
                self.docker("version", "--format", "{{.Server.Version}}", check=False).returncode
                == 0
            ),
            START_TIMEOUT_S,
            f"{self.name}: dockerd ({last_line(self.log_dir / 'dockerd.log')})",
            lambda: self._alive("dockerd"),
        )

    def build_image(self) -> None:
        """The lab's images, from one context (the second and third reuse the first's
        layer): the workload, and the SSH and HTTP stand-ins; then, where the spec asks,
        the Jupyter image."""
        context = self.build / "image"
        for image, dockerfile in IMAGES.items():
            if self.docker("image", "inspect", image, check=False).returncode == 0:
                continue
            self.docker(
                "build", "--quiet", "--tag", image, "--file", str(context / dockerfile),
                str(context), timeout=120,
            )  # fmt: skip
        if self.spec.jupyter:
            self._jupyter_image()

    def _jupyter_image(self) -> None:
        """Loaded where an earlier node saved it, else built on the workload image and
        saved for the next (nodelab.jupyter_image)."""
        if self.docker("image", "inspect", JUPYTER_IMAGE, check=False).returncode == 0:
            return
        saved = (self.build / JUPYTER_SAVED).resolve()
        if saved.exists():
            self.docker("load", "--quiet", "--input", str(saved), timeout=300)
            return
        context = (self.build / JUPYTER_CONTEXT).resolve()
        self.docker("build", "--quiet", "--tag", JUPYTER_IMAGE, str(context), timeout=300)
        partial = saved.with_name(f".{saved.name}.{self.name}.{os.getpid()}")
        try:
            self.docker("save", "--output", str(partial), JUPYTER_IMAGE, timeout=300)
            partial.replace(saved)  # whichever node saves last, the same image
        finally:
            partial.unlink(missing_ok=True)

    def sshd_config(self) -> str:
        setenv = {
            "PATH": f"{self.bin}:{NODE_PATH}",
            "PYTHONPATH": str(self.lib / "python"),
            "DOCKER_HOST": f"unix://{self.socket}",
            "XDG_RUNTIME_DIR": str(self.run_dir / "user"),
            "GPUPLATFORM_KERNEL_LOG": str(self.kernel_log),
            "GPUPLATFORM_AGENT_DIR": str(self.agent_dir),
            # no systemd on a lab node: the agent keeps itself running (its `supervise`)
            "GPUPLATFORM_AGENT_SUPERVISOR": "self",
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
                self.port = free_port()
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
                wait_until(self._banner, 15, f"{self.name}: sshd", lambda: self._alive("sshd"))
                return
            except LabUnavailable:
                stop_process(self._procs.pop("sshd", None))
                if "Address already in use" not in (self.log_dir / "sshd.log").read_text():
                    raise LabUnavailable(
                        f"{self.name}: sshd did not start: {last_line(self.log_dir / 'sshd.log')}"
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
        """A request to the emulated GPU's control socket (through the node's own client)."""
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
        stop_process(self._procs.pop("sshd", None))
        if sessions:
            for pid in holders_of_port(self.port):
                for victim in [pid, *descendants(pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim, signal.SIGKILL)

    def restart_dockerd(self) -> None:
        stop_process(self._procs.pop("dockerd", None), timeout=30)
        self.start_dockerd()

    def rotate_host_key(self) -> str:
        """A new host key, as after a reinstall (or an impostor at the address): sshd
        restarted with it, and no session of the old one left."""
        self.host_key_path.unlink()
        self.host_key_path.with_suffix(".pub").unlink()
        run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name,
              "-f", str(self.host_key_path)])  # fmt: skip
        self.stop_sshd(sessions=True)
        self.start_sshd()
        return self.host_key_line()

    def agent_pids(self) -> dict[str, int]:
        """The node agent's processes as its pid files name them ("supervisor", "agent"),
        those alive only."""
        out = {}
        for name in ("supervisor", "agent"):
            with contextlib.suppress(OSError, ValueError):
                pid = int((self.agent_dir / f"{name}.pid").read_text())
                if str(self.agent_dir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out[name] = pid
        return out

    def stop_agent(self) -> None:
        """What the platform installed on this node goes with the node's reset: the agent's
        processes (it runs in a session of its own, outside sshd's) and its directory."""
        kill_matching(str(self.agent_dir))
        shutil.rmtree(self.agent_dir, ignore_errors=True)

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
        self.stop_agent()
        self.gpu("reset")
        self.kernel_log.write_text("")
        shutil.rmtree(self.quota_accounting, ignore_errors=True)
        self.quota_accounting.mkdir()
        if self.host_key_path.read_text() != self._original_host_key:
            self.host_key_path.write_text(self._original_host_key)
            os.chmod(self.host_key_path, 0o600)
            pub = run_checked(["ssh-keygen", "-y", "-f", str(self.host_key_path)]).stdout
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
        self.stop_agent()
        stop_process(self._procs.pop("sshd", None))
        if self._alive("dockerd"):
            try:
                ids = self.container_ids()
                if ids:
                    self.docker("rm", "--force", *ids, timeout=120)
                self.docker("image", "rm", "--force", *IMAGES, JUPYTER_IMAGE, check=False)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                left.append(f"{self.name}: containers: {exc}")
        stop_process(self._procs.pop("dockerd", None), timeout=30)
        stop_process(self._procs.pop("gpud", None))
        for name in list(self._procs):
            stop_process(self._procs.pop(name))
        left += unmount_under(self.dir)
        left += remove_cgroups(self.cgroup_parent.lstrip("/"))
        return left


def ensure_remap_user() -> None:
    """The account and subordinate id ranges dockerd's `--userns-remap` needs (dockerd
    reads them from /etc/subuid and /etc/subgid), added once and left for later labs."""
    try:
        pwd.getpwnam(REMAP_USER)
    except KeyError:
        run_checked(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             "--user-group", REMAP_USER]
        )  # fmt: skip
    start, count = REMAP_RANGE
    for path in ("/etc/subuid", "/etc/subgid"):
        lines = Path(path).read_text().splitlines() if os.path.exists(path) else []
        if not any(line.split(":")[0] == REMAP_USER for line in lines):
            with open(path, "a", encoding="ascii") as fh:
                fh.write(f"{REMAP_USER}:{start}:{count}\n")
