"""A real one-node Slurm cluster for the tests, started from nothing and stopped by PID.

    cluster = OneNodeSlurm.start()     # or: python tests/slurm_cluster.py (starts, waits, stops)
    ...                                 # sbatch, squeue, submitit: SLURM_CONF is set for them
    cluster.stop()

As root, with Debian's ``slurm-wlm`` and ``munge`` packages (installed here with apt-get if
they are missing and apt-get can), it writes a ``slurm.conf`` for this machine in a new
temporary folder (the node's name from ``hostname -s``, its CPUs and memory from
``slurmd -C``, free ports, state and spool directories in the folder; no accounting, no
cgroups: ``proctrack/linuxproc``, ``task/none``), starts ``munged`` (as the munge user, with
a key and socket of its own), ``slurmctld`` and ``slurmd`` in the foreground as child
processes, and waits until the node is idle.  :meth:`stop` ends exactly those processes.
Where any of that cannot be done, :func:`why_not` says why (the tests skip with it).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
PROGRAMS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "scancel", "srun")


def _have_programs() -> bool:
    return all(shutil.which(p) or Path("/usr/sbin", p).exists() for p in PROGRAMS)


def why_not(install: bool = True) -> str | None:
    """None if a one-node Slurm can be started here; else the reason it cannot.  With
    ``install``, missing packages are installed with apt-get first (as root)."""
    if sys.platform != "linux":
        return "a one-node Slurm is started only on Linux"
    if os.geteuid() != 0:
        return "starting slurmctld, slurmd and munged needs root"
    if not _have_programs():
        if not install:
            return f"the Debian packages {' '.join(PACKAGES)} are not installed"
        if shutil.which("apt-get") is None:
            return f"no apt-get to install {' '.join(PACKAGES)}"
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", *PACKAGES]
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:  # a fresh machine has no package lists yet
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
            done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not _have_programs():
            tail = " ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            return f"apt-get install {' '.join(PACKAGES)} failed: {tail}"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "the munge package created no munge user"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_hardware() -> dict[str, str]:
    """``slurmd -C``'s CPUs and RealMemory for this machine."""
    text = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True,
                          timeout=60).stdout
    fields = dict(w.split("=", 1) for w in text.split() if "=" in w)
    return {"CPUs": fields["CPUs"], "RealMemory": fields["RealMemory"]}


@dataclass
class OneNodeSlurm:
    folder: Path
    node: str
    partition: str = "debug"
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    @classmethod
    def start(cls, timeout: float = 60.0) -> OneNodeSlurm:
        reason = why_not()
        if reason:
            raise RuntimeError(reason)
        folder = Path(tempfile.mkdtemp(prefix="lstmablate-slurm-"))
        folder.chmod(0o755)  # munged (the munge user) reaches its own subfolder
        cluster = cls(folder, socket.gethostname().split(".")[0])
        try:
            cluster._start_munge()
            cluster._write_conf()
            for name in ("slurmctld", "slurmd"):
                log = open(folder / f"{name}.out", "wb")
                cluster.processes[name] = subprocess.Popen(
                    [name, "-D", "-f", str(cluster.conf)], stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, **cluster.env})
            cluster._wait_idle(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        d = self.folder / "munge"
        d.mkdir(mode=0o700)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for p in (d, key):
            os.chown(p, munge.pw_uid, munge.pw_gid)
        self.processes["munged"] = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={d / 'munge.socket'}",
             f"--key-file={key}", f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
             f"--seed-file={d / 'munged.seed'}"],
            user=munge.pw_uid, group=munge.pw_gid, extra_groups=[],
            stdout=subprocess.DEVNULL, stderr=open(self.folder / "munged.out", "wb"))
        for _ in range(100):
            if (d / "munge.socket").exists():
                return
            if self.processes["munged"].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"munged did not start: {self._log('munged.out')}")

    def _write_conf(self) -> None:
        f = self.folder
        for sub in ("state", "spool"):
            (f / sub).mkdir()
        hw = _node_hardware()
        lines = {
            "ClusterName": "lstmablate-test",
            "SlurmctldHost": self.node,
            "SlurmctldPort": _free_port(),
            "SlurmdPort": _free_port(),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={f / 'munge' / 'munge.socket'}",
            "CredType": "cred/munge",
            "StateSaveLocation": f / "state",
            "SlurmdSpoolDir": f / "spool",
            "SlurmctldPidFile": f / "slurmctld.pid",
            "SlurmdPidFile": f / "slurmd.pid",
            "SlurmctldLogFile": f / "slurmctld.log",
            "SlurmdLogFile": f / "slurmd.log",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_CPU",
            "SchedulerType": "sched/backfill",
            "MpiDefault": "none",
            "ReturnToService": 2,
            "KillWait": 10,
            "SlurmdTimeout": 60,
            "InactiveLimit": 0,
            "MinJobAge": 30,
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        text += (f"NodeName={self.node} CPUs={hw['CPUs']} RealMemory={hw['RealMemory']} State=UNKNOWN\n"
                 f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n")
        self.conf.write_text(text)

    def _text(self, name: str) -> str:
        """One of the daemons' files in this cluster's folder ("" before it exists)."""
        p = self.folder / name
        return p.read_text(errors="replace") if p.exists() else ""

    def _log(self, name: str) -> str:
        return " | ".join(self._text(name).strip().splitlines()[-5:])

    def job_log(self, job: str) -> str:
        """What slurmctld and slurmd logged about ``job`` (for a failing test's message)."""
        kept = []
        for name in ("slurmctld.log", "slurmd.log"):
            kept += [f"{name}: {line.strip()}" for line in self._text(name).splitlines()
                     if re.search(rf"(\bJobId=|\b[Jj]ob |\bStepId=|\[){re.escape(job)}\b", line)]
        return "\n".join(kept[-30:])

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=timeout,
                              env={**os.environ, **self.env})

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for name, p in self.processes.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited ({p.returncode}): {self._log(name + '.out')} "
                                       f"{self._log(name + '.log')}")
            done = self.run("sinfo", "-h", "-N", "-o", "%T", check=False, timeout=20)
            state = done.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the node did not become idle in {timeout:.0f} s (state {state!r}): "
                           f"{self._log('slurmctld.log')} {self._log('slurmd.log')}")

    def stop(self) -> None:
        """Cancel every job of this cluster, end the daemons this object started (by their
        PIDs) and delete the folder."""
        if self.processes.get("slurmctld") and self.processes["slurmctld"].poll() is None:
            jobs = self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
            if jobs:
                self.run("scancel", "--full", *jobs, check=False)
                deadline = time.monotonic() + 60
                while self.run("squeue", "-h", check=False).stdout.strip() and \
                        time.monotonic() < deadline:
                    time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.processes.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":  # start one by hand, print how to use it, stop it on Enter / Ctrl-C
    c = OneNodeSlurm.start()
    print(f"export SLURM_CONF={c.conf}   # daemons: " +
          ", ".join(f"{n} {p.pid}" for n, p in c.processes.items()), flush=True)
    try:
        if len(sys.argv) > 1:
            time.sleep(float(sys.argv[1]))
        else:
            input()
    except (KeyboardInterrupt, EOFError):
        pass
    finally:
        c.stop()
