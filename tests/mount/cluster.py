"""Simulated nodes on one machine, for jobs of -o group=mpi (fs/group.h).

A Cluster makes:
- a bridge (the cluster network) in the root network namespace;
- a "store" network namespace serving a directory over SFTP (OpenSSH's
  sshd), its link rate-limited with tc: the shared storage;
- n "node" network namespaces, each with its own link (tc rate) and its
  own mount namespace, in which the node mounts the store with sshfs (so
  nodes share no page cache) and runs its reshardfs daemon.

Bytes the store served are read at the store: its interface's tx_bytes.
A job is either one mpirun over the nodes (-o group=mpi; MPI's TCP
transport over the bridge) or n independent daemons; or, with
`mount_stores`, no daemon at all: the nodes' sshfs mounts of the store
alone, for jobs that read the source themselves.  Commands run inside a
node with `node_run` (nsenter into the network and mount namespaces of
the node's daemon, or of its sshfs).

Needs root, iproute2 (ip netns, tc), OpenSSH's sshd and ssh-keygen, sshfs
and, for group jobs, mpirun; `missing()` says what is absent.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

MTU = 9000   # frame headers under 1% of what crosses a link


_MISSING = []


def missing():
    """Why simulated nodes cannot be made here, or None."""
    if not _MISSING:
        _MISSING.append(_probe())
    return _MISSING[0]


def _probe():
    for tool in ("ip", "tc", "nsenter", "sshfs", "ssh-keygen", "mpirun",
                 "fusermount3"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if not Path("/usr/sbin/sshd").exists():
        return "/usr/sbin/sshd not found (openssh-server)"
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    # What start() does, once: a namespace, a veth into it, a tc rate.
    ns, host = f"r{os.urandom(3).hex()}p", f"r{os.urandom(3).hex()}p"
    try:
        for argv in (("ip", "netns", "add", ns),
                     ("ip", "link", "add", host, "type", "veth", "peer",
                      "name", "eth0", "netns", ns),
                     ("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev",
                      "eth0", "root", "tbf", "rate", "1gbit", "burst", "1mb",
                      "latency", "200ms")):
            r = sh(*argv, check=False)
            if r.returncode:
                return f"{' '.join(argv[:4])}: {r.stderr.strip()[:200]}"
    finally:
        sh("ip", "link", "del", host, check=False)
        sh("ip", "netns", "del", ns, check=False)
    return None


def sh(*argv, check=True, ns=None, **kw):
    if ns:
        argv = ("ip", "netns", "exec", ns) + argv
    return subprocess.run([str(a) for a in argv], check=check,
                          capture_output=True, text=True, **kw)


# Run first in each mount namespace the cluster starts (`ip netns exec`
# makes a new one, a copy of the host's mounts that keeps receiving the
# host's new mounts): take no more of them, and let go of the FUSE mounts
# copied in.  A copy of another view held here would keep its daemon
# alive after its owner unmounts it on the host (the owner's unmount
# waits for a daemon that never hears the end), so tests and benchmarks
# that run beside a cluster would hang in teardown.
LET_GO = ("mount --make-rprivate / 2>/dev/null\n"
          "awk '{split($0, a, \" - \"); split(a[2], t, \" \");"
          " if (t[1] ~ /^fuse/) print $5}' /proc/self/mountinfo |"
          " sort -r | while read -r m; do umount -l \"$m\"; done\n")


class Cluster:
    def __init__(self, base, n, store_dir, store_rate="800mbit",
                 link_rate="4gbit"):
        self.base, self.n = Path(base), n
        self.store_dir = Path(store_dir)
        self.store_rate, self.link_rate = store_rate, link_rate
        # Short unique names: interface names are at most 15 bytes.
        self.tag = f"r{os.urandom(3).hex()}"
        self.bridge = f"{self.tag}br"
        self.store_ns = f"{self.tag}st"
        self.node_ns = [f"{self.tag}n{k}" for k in range(n)]
        self.sshd = None
        self.procs = []
        self.stores_only = False

    # ------------------------------------------------------------ network
    def _link(self, ns, host_if, addr, rate):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name",
           "eth0", "netns", ns)
        sh("ip", "link", "set", host_if, "master", self.bridge, "mtu", MTU,
           "up")
        sh("ip", "link", "set", "lo", "up", ns=ns)
        sh("ip", "link", "set", "eth0", "mtu", MTU, "up", ns=ns)
        sh("ip", "addr", "add", f"{addr}/24", "dev", "eth0", ns=ns)
        # What leaves through eth0, at the link's rate.
        sh("tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate,
           "burst", "1mb", "latency", "200ms", ns=ns)

    def start(self):
        self.base.mkdir(parents=True, exist_ok=True)
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "addr", "add", "10.78.0.254/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "mtu", MTU, "up")
            self._link(self.store_ns, f"{self.tag}s", "10.78.0.100",
                       self.store_rate)
            for k, ns in enumerate(self.node_ns):
                self._link(ns, f"{self.tag}v{k}", f"10.78.0.{k + 1}",
                           self.link_rate)
            self._start_sshd()
        except BaseException:
            self.close()
            raise
        return self

    def _start_sshd(self):
        d = self.base / "ssh"
        d.mkdir(exist_ok=True)
        for name in ("key", "hostkey"):
            if not (d / name).exists():
                sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                   d / name)
        (d / "sshd_config").write_text(
            f"ListenAddress 10.78.0.100\nHostKey {d}/hostkey\n"
            f"PidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/key.pub\n"
            "PermitRootLogin prohibit-password\nUsePAM no\n"
            "StrictModes no\nSubsystem sftp internal-sftp\n")
        Path("/run/sshd").mkdir(exist_ok=True)
        self.sshd = subprocess.Popen(
            ["ip", "netns", "exec", self.store_ns, "sh", "-c",
             LET_GO + f"exec /usr/sbin/sshd -D -f {d / 'sshd_config'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL)

    def store_tx(self):
        """Bytes the store has sent since its link came up."""
        return int(sh("cat", "/sys/class/net/eth0/statistics/tx_bytes",
                      ns=self.store_ns).stdout)

    # ---------------------------------------------------------------- jobs
    def _node_script(self, opts, binary):
        """node.sh K: node K mounts the store, then runs the daemon
        (binary None: the script is sshfs, mounting the store alone)."""
        d = self.base / "ssh"
        script = self.base / "node.sh"
        sshfs = ("sshfs -f -o ro,IdentityFile=" + str(d / "key") +
                 ",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,"
                 "Ciphers=aes128-gcm@openssh.com "
                 f"root@10.78.0.100:{self.store_dir} $store ")
        head = ("#!/bin/sh\n" + LET_GO +
                "k=${1:-$OMPI_COMM_WORLD_RANK}\n"
                f"store={self.base}/store$k mnt={self.base}/mnt$k\n"
                "mkdir -p $store $mnt\n")
        if binary is None:
            script.write_text(head + "exec " + sshfs +
                              f">{self.base}/sshfs$k.log 2>&1 </dev/null\n")
        else:
            script.write_text(
                head + sshfs +
                # not the job's output: mpirun waits for its end
                f">{self.base}/sshfs$k.log 2>&1 </dev/null &\n"
                "i=0; until mountpoint -q $store; do\n"
                "  i=$((i + 1)); [ $i -gt 300 ] && exit 3; sleep 0.05; done\n"
                f"exec {binary} -f $store $mnt -o {opts}\n")
        script.chmod(0o755)
        return script

    def launch(self, opts, group, binary, env=None):
        """Starts the job's daemons: one mpirun (group) or n daemons."""
        self.stop_job()
        script = self._node_script(opts, binary)
        env = dict(os.environ, **(env or {}))
        log = open(self.base / "job.log", "w")
        if group:
            launcher = self.base / "in_node.sh"
            launcher.write_text(
                "#!/bin/sh\n"
                f"exec ip netns exec {self.tag}n$OMPI_COMM_WORLD_RANK "
                f"{script}\n")
            launcher.chmod(0o755)
            # PMIx's server (in mpirun) answers the members on the bridge,
            # and MPI's messages go over the nodes' links.
            env.update(PMIX_MCA_ptl_tcp_if_include=self.bridge,
                       PMIX_MCA_ptl_tcp_remote_connections="1",
                       PMIX_MCA_ptl_tcp_disable_ipv6_family="1")
            self.procs = [subprocess.Popen(
                ["mpirun", "--allow-run-as-root", "--oversubscribe",
                 "--enable-recovery", "-np", str(self.n),
                 "-x", "PMIX_MCA_ptl_tcp_if_include",
                 "--mca", "btl", "tcp,self",
                 "--mca", "btl_tcp_if_include", "10.78.0.0/24",
                 "--mca", "oob_tcp_if_include", "10.78.0.0/24",
                 str(launcher)],
                stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True)]
        else:
            self.procs = [subprocess.Popen(
                ["ip", "netns", "exec", ns, str(script), str(k)],
                stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
                for k, ns in enumerate(self.node_ns)]
        log.close()
        self.stores_only = False
        self.pids = self._wait_mounted()
        return self

    def mount_stores(self):
        """No daemon: every node mounts the store with sshfs, afresh (its
        page cache cold), at store(k).  node_run runs in the node's
        namespaces; stop_job unmounts."""
        self.stop_job()
        script = self._node_script(None, None)
        log = open(self.base / "job.log", "w")
        self.procs = [subprocess.Popen(
            ["ip", "netns", "exec", ns, str(script), str(k)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True) for k, ns in enumerate(self.node_ns)]
        log.close()
        self.stores_only = True
        self.pids = self._wait_mounted()
        return self

    def log(self):
        try:
            return (self.base / "job.log").read_text(errors="replace")
        except OSError:
            return ""

    def mnt(self, k):
        return self.base / f"mnt{k}"

    def store(self, k):
        """Node k's sshfs mount of the store (in its mount namespace)."""
        return self.base / f"store{k}"

    def _mountpoint(self, k):
        return self.store(k) if self.stores_only else self.mnt(k)

    def _daemon_pids(self):
        """The daemons' pids by node (mount_stores: the sshfs ones)."""
        name, where = (("sshfs", "store") if self.stores_only else
                       ("reshardfs", "mnt"))
        out = sh("pgrep", "-a", "-f", f"{self.base}/{where}",
                 check=False).stdout
        pids = {}
        for line in out.splitlines():
            pid, cmd = line.split(" ", 1)
            argv = cmd.split()
            if not Path(argv[0]).name.startswith(name):
                continue
            for k in range(self.n):
                if str(self._mountpoint(k)) in argv:
                    pids[k] = int(pid)
        return pids

    def _wait_mounted(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self._daemon_pids()
            if len(pids) == self.n and all(
                    self._mounted(pids[k], k) for k in range(self.n)):
                return pids
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.1)
        raise RuntimeError("the nodes did not mount:\n" + self.log())

    def _mounted(self, pid, k):
        try:
            info = Path(f"/proc/{pid}/mountinfo").read_text()
        except OSError:
            return False
        fstype = "sshfs" if self.stores_only else "reshardfs"
        return re.search(rf" {re.escape(str(self._mountpoint(k)))} .* - "
                         rf"fuse\.{fstype} ", info) is not None

    def node_run(self, k, argv, **kw):
        """Popen of argv inside node k: its network and mount namespaces."""
        return subprocess.Popen(
            ["nsenter", "-t", str(self.pids[k]), "-m", "-n", "--",
             *map(str, argv)], **kw)

    def node_stats(self, k):
        p = self.node_run(k, ["cat", self.mnt(k) / ".reshardfs" / "stats"],
                          stdout=subprocess.PIPE, text=True)
        out, _ = p.communicate(timeout=30)
        return json.loads(out)

    def stop_job(self, timeout=60):
        """Unmounts every node's view; the daemons exit.  0 when all did
        so cleanly."""
        if not self.procs:
            return 0
        for k, pid in getattr(self, "pids", {}).items():
            subprocess.run(["nsenter", "-t", str(pid), "-m", "--",
                            "fusermount3", "-u", str(self._mountpoint(k))],
                           capture_output=True)
        rcs = []
        for p in self.procs:
            try:
                rcs.append(p.wait(timeout))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                rcs.append(p.wait())
        # sshfs, left behind in each node's mount namespace, and its ssh
        sh("pkill", "-f", f"{self.base}/store", check=False)
        sh("pkill", "-f", f"{self.base}/ssh/key", check=False)
        self.procs, self.pids = [], {}
        return max(rcs) if rcs else 0

    def close(self):
        try:
            self.stop_job(timeout=30)
        finally:
            if self.sshd:
                self.sshd.kill()
                self.sshd.wait()
            for ns in [self.store_ns, *self.node_ns]:
                sh("ip", "netns", "del", ns, check=False)
            # A namespace outlives its name while a process is in it;
            # its links go with their host ends.
            for k in range(self.n):
                sh("ip", "link", "del", f"{self.tag}v{k}", check=False)
            sh("ip", "link", "del", f"{self.tag}s", check=False)
            sh("ip", "link", "del", self.bridge, check=False)

    def __enter__(self):
        return self.start()

    def __exit__(self, *a):
        self.close()
