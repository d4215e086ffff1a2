"""A Slurm cluster on namespace hosts for tests: munged, one slurmctld and one slurmd per host (tests/netns.py's
`hosts`), all from Debian's slurm-wlm (22.05) with a private configuration in a temporary directory.

    lab = SlurmLab(hosts, directory)      # host 1: slurmctld + node h1 (feature learner); hosts 2, 3: h2, h3 (actor)
    lab.start()
    job = lab.submit("--logdir=...", ...) # launch/slurm/submit.sh, run on host 1
    lab.run(["scontrol", "requeue", job])
    lab.stop()

Every daemon runs in the foreground as a child of this process (killed by pid in `stop`); munged lives in this
machine's namespace (it serves a unix socket only), slurmctld and each slurmd in a host's network namespace,
entered with `nsenter --net` (not `ip netns exec`, which mounts a fresh /sys, where slurmd's cgroup probing fails).
All namespaces share this machine's hostname, so SlurmctldHost is that name with host 1's address, and each slurmd
is told its node name (`slurmd -N hI`). `hosts.poweroff(i)` kills host i's slurmd and the job's steps there: a lost
node. Slurm's client commands must run in a namespace too (slurmctld listens on host 1's address only).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

from seed.bench.netns_hosts import NetnsHosts

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "nsenter")
SLURMD_TIMEOUT_S = 5  # a lost node is DOWN (and its job requeued) this long after its last answer, and more
# A requeued job waits for the job credential's lifetime before it starts again (AuthInfo cred_expire; Slurm's
# default is 120 s).
REQUEUE_DELAY_S = 10
SEARCH_PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"


def why_no_slurm() -> str | None:
    """Why this machine cannot run the lab cluster, or None (namespaces are the `hosts` fixture's business)."""
    missing = [name for name in DAEMONS if shutil.which(name, path=SEARCH_PATH) is None]
    if missing:
        return (f"needs Slurm and munge ({', '.join(missing)} not found): launch/install_test_tools.sh installs "
                "slurm-wlm and munge with apt (as root)")
    if os.geteuid() != 0:
        return f"needs root for slurmd and munged (running as uid {os.geteuid()})"
    return None


class SlurmLab:
    """Slurm on `hosts` (host 1 the learner node h1, the others actor nodes); files and logs under `directory`."""

    def __init__(self, hosts: NetnsHosts, directory: str):
        self.hosts, self.directory = hosts, directory
        self.conf = os.path.join(directory, "slurm.conf")
        self.munge_socket = os.path.join(directory, "munge", "munge.socket")
        self.daemons: dict[str, subprocess.Popen] = {}
        self.environment = dict(os.environ, SLURM_CONF=self.conf, PATH=SEARCH_PATH)

    def _namespace(self, host: int) -> str:
        return f"/run/netns/{self.hosts.name}-{host}"

    def node(self, host: int) -> str:
        return f"h{host}"

    def write_config(self) -> None:
        d = self.directory
        for sub in ("munge", "ctld", *(f"spool-{self.node(i)}" for i in range(1, self.hosts.count + 1))):
            os.makedirs(os.path.join(d, sub), mode=0o700, exist_ok=True)
        with open(os.path.join(d, "munge", "munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(os.path.join(d, "munge", "munge.key"), 0o400)
        nodes = "\n".join(
            f"NodeName={self.node(i)} NodeAddr={self.hosts.addr(i)} CPUs=2 RealMemory=1000 "
            f"Features={'learner' if i == 1 else 'actor'} State=UNKNOWN" for i in range(1, self.hosts.count + 1))
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=seedlab
SlurmctldHost={socket.gethostname()}({self.hosts.addr(1)})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire={REQUEUE_DELAY_S}
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SlurmdTimeout={SLURMD_TIMEOUT_S}
ReturnToService=2
MinJobAge=600
KillWait=20
MessageTimeout=5
InactiveLimit=0
MailProg=/bin/true
{nodes}
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")

    def _daemon(self, name: str, command: list[str], host: int | None = None) -> None:
        log = open(os.path.join(self.directory, f"{name}.out"), "ab")
        if host is not None:
            command = ["nsenter", f"--net={self._namespace(host)}", *command]
        self.daemons[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.environment,
                                              start_new_session=True)
        log.close()

    def start(self, timeout_s: float = 60.0) -> None:
        """munged, slurmctld, a slurmd per host; returns once every node is idle."""
        self.write_config()
        d = os.path.join(self.directory, "munge")
        self._daemon("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                                f"--key-file={d}/munge.key", f"--pid-file={d}/munged.pid",
                                f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"])
        self._wait(lambda: os.path.exists(self.munge_socket), timeout_s, "munged's socket")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i"], host=1)
        for i in range(1, self.hosts.count + 1):
            self.start_slurmd(i)
        self._wait(lambda: self.idle_nodes() == self.hosts.count, timeout_s, "every node idle")

    def start_slurmd(self, host: int) -> None:
        self._daemon(f"slurmd-{host}", ["slurmd", "-D", "-N", self.node(host)], host=host)

    def idle_nodes(self) -> int:
        result = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        return sum(1 for line in result.stdout.splitlines() if line.split()[-1] == "idle")

    def _wait(self, done, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            for name, process in self.daemons.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode} while waiting for {what}:\n"
                                       f"{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:.0f}s for {what}:\n{self.logs()}")
            time.sleep(0.2)

    def run(self, command: list[str], check: bool = True, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """A client command (sinfo, sbatch, scontrol, ...) run on host 1."""
        result = subprocess.run(["nsenter", f"--net={self._namespace(1)}", *command], capture_output=True,
                                text=True, env=self.environment, timeout=timeout_s)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: exit {result.returncode}: {result.stderr.strip()}")
        return result

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job JOB`'s fields of the het job's first component (JobState, Reason, Restarts, ...)."""
        text = self.run(["scontrol", "-o", "show", "job", job_id]).stdout.splitlines()[0]
        fields = {}
        for item in text.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    def logs(self) -> str:
        parts = []
        for name in sorted(os.listdir(self.directory)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.directory, name), errors="replace") as f:
                    parts.append(f"--- {name}\n{f.read()[-2000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancels every job, then stops the daemons by pid (SIGTERM, then SIGKILL); their files stay in
        `directory` for the caller to remove."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self.run(["scancel", "--user=root"], check=False)
            deadline = time.monotonic() + 30  # the jobs' learners checkpoint on their SIGTERM
            while time.monotonic() < deadline and self.run(["squeue", "-h"], check=False).stdout.strip():
                time.sleep(0.5)
        for name in reversed(list(self.daemons)):
            process = self.daemons[name]
            if process.poll() is None:
                process.terminate()
        for process in self.daemons.values():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:  # a slurmd waiting for steps that are gone with their host
                process.kill()
                process.wait()
