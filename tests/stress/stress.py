#!/usr/bin/env python3
"""Stress test: many threads of random operations on a reshardfs view,
every byte read checked against the numpy oracle.

    tests/stress/stress.py [--seconds 60] [--threads 64] [--bin build/reshardfs]
                           [--verify bytes|none] [--model layers=8,hidden=1024,ffn=4096]
                           [--src-tp 2] [--tp 8] [--cache-size 256M]
                           [--dir /tmp/reshardfs-stress] [--json FILE]

Setup (kept in --dir and reused while the model is the same): a tp=2
checkpoint written by scripts/make_sample_checkpoint.py --fast (by default
the model of scripts/bench_zarr with 8 layers: a 2.5 GB view) and the
oracle's copy of the view (tests/mount/oracle.py ExpectedView, written out
array by array as plain files).  Then the daemon is mounted with -f and
every thread loops over random operations until the time is up:

  pread    a random range (1 B to 4 MiB, log-uniform; a tenth across the
           end of the file; a quarter O_DIRECT) of a random file
  mmap     a random range of a read-only mapping of a random file
  whole    a whole file, in 1 MiB reads
  drop     the kernel's cached pages of a random file (POSIX_FADV_DONTNEED),
           so that buffered reads and mappings reach the daemon again
  readdir  a random directory: the names the oracle lists
  stat     a random file or directory: its type and size
  xattr    user.reshardfs.sources of a random file: the source files the
           oracle says it is built from

With --verify bytes (the default) every byte read is compared with the same
range of the oracle's copy; --verify none only reads (for throughput).

The daemon runs with ASAN_OPTIONS, TSAN_OPTIONS and UBSAN_OPTIONS that
write sanitizer reports to DIR/logs/san.* (the caller's options are kept,
log_path is added), so the same run serves sanitizer builds (scripts/sanitize);
under ASan the mapped gathers read with pread (ASan owns SIGBUS).

Exit status 0 when there were no mismatches and no errors, the daemon
unmounted cleanly (fusermount3 -u) and exited 0, and no sanitizer report
was written.  The figures are printed and, with --json, written as JSON.
"""

import argparse
import errno
import json
import mmap
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests" / "mount"))
import venv_python  # noqa: E402

if __name__ == "__main__":
    venv_python.reexec_if_needed()

import make_sample_checkpoint as msc  # noqa: E402
from oracle import ExpectedView  # noqa: E402

DEFAULT_MODEL = "layers=8,hidden=1024,ffn=4096,heads=16,groups=4,vocab=32000"
XATTR = "user.reshardfs.sources"
MAX_READ = 4 << 20
OPS = (("pread", 40), ("mmap", 15), ("whole", 5), ("drop", 5),
       ("readdir", 10), ("stat", 15), ("xattr", 15))


def log(msg):
    print(f"[stress {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr,
          flush=True)


def parse_model(text):
    model = dict(heads=16, groups=4, vocab=32000, divisor=128, seed=1)
    for item in filter(None, text.split(",")):
        k, v = item.split("=")
        model[k] = int(v)
    return model


# ------------------------------------------------------------ the data

def prepare(base, model, src_tp, tp):
    """(source dir, oracle copy dir, ExpectedView), made once per model."""
    want = dict(model, src_tp=src_tp, tp=tp, version=1)
    marker = base / "prepared.json"
    src, ref = base / "src", base / "expected"
    if marker.exists() and json.loads(marker.read_text()) == want:
        return src, ref, ExpectedView(src, tp)
    for d in (src, ref):
        shutil.rmtree(d, ignore_errors=True)
    marker.unlink(missing_ok=True)
    t0 = time.monotonic()
    msc.make_checkpoint(str(src), src_tp, fast=True, **model)
    exp = ExpectedView(src, tp)
    log(f"checkpoint tp={src_tp} written in {time.monotonic() - t0:.1f}s; "
        f"writing the oracle's tp={tp} view "
        f"({exp.total_bytes() / 1e9:.2f} GB)")
    for rel in exp.files:    # sorted: each array is assembled once
        p = ref / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(exp.read(rel))
    marker.write_text(json.dumps(want))
    log(f"ready in {time.monotonic() - t0:.1f}s")
    return src, ref, exp


# ---------------------------------------------------------- the daemon

def mounted(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mnt for line in f)


def wait_until(pred, timeout, proc=None):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline or (proc and proc.poll() is not None):
            return pred()
        time.sleep(0.02)
    return True


def sanitizer_env(logs):
    env = dict(os.environ)
    prefix = str(logs / "san")
    for var in ("ASAN_OPTIONS", "TSAN_OPTIONS", "UBSAN_OPTIONS"):
        opts = [o for o in env.get(var, "").split(":")
                if o and not o.startswith("log_path=")]
        env[var] = ":".join(opts + [f"log_path={prefix}"])
    return env


class Daemon:
    def __init__(self, binary, src, mnt, opts, logs):
        self.mnt = mnt
        self.logs = logs
        self.log_path = logs / "daemon.log"
        mnt.mkdir(parents=True, exist_ok=True)
        if mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)])
        self.cmd = [binary, "-f", str(src), str(mnt), "-o", ",".join(opts)]
        with open(self.log_path, "wb") as f:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                         stdout=f, stderr=f,
                                         env=sanitizer_env(logs))
        if not wait_until(lambda: mounted(mnt), 120, self.proc):
            self.kill()
            raise SystemExit(f"mount did not appear: {' '.join(self.cmd)}\n"
                             f"{self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace")

    def vm_hwm_mib(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text() \
                .splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return None

    def unmount(self):
        """Strict: fusermount3 -u, then the daemon must exit 0."""
        r = subprocess.run(["fusermount3", "-u", str(self.mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.kill()
            return f"fusermount3 -u failed: {r.stderr.strip()}"
        try:
            rc = self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.kill()
            return "daemon did not exit after unmount"
        return None if rc == 0 else f"daemon exited {rc}"

    def kill(self):
        if mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)])
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------ the work

class Shared:
    def __init__(self, args, mnt, ref, exp):
        self.mnt, self.ref, self.exp = mnt, ref, exp
        self.verify = args.verify == "bytes"
        self.files = exp.files
        self.sizes = {rel: exp.size(rel) for rel in exp.files}
        self.dirs = [""] + exp.dirs
        self.listing = {d: set() for d in self.dirs}
        for rel in exp.files + exp.dirs:
            parent, _, name = rel.rpartition("/")
            self.listing[parent].add(name)
        self.deadline = time.monotonic() + args.seconds
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.problems = []           # (kind, text), the first 20
        self.totals = {}

    def done(self):
        return self.stop.is_set() or time.monotonic() >= self.deadline

    def problem(self, kind, text):
        with self.lock:
            if len(self.problems) < 20:
                self.problems.append((kind, text))
        log(f"{kind}: {text}")

    def merge(self, counts):
        with self.lock:
            for k, v in counts.items():
                self.totals[k] = self.totals.get(k, 0) + v

    def expected_sources(self, rel):
        kind = self.exp._kinds[rel]
        if kind[0] == "pass":
            return {rel}
        if kind[0] == "zarray":
            return set() if self.exp.arrays[kind[1]].changed else {rel}
        if not self.exp.arrays[kind[1]].changed:
            return {rel}
        return set(self.exp.source_chunks(rel))


class Worker:
    def __init__(self, sh, seed):
        self.sh = sh
        self.rnd = random.Random(seed)
        self.c = {"reads": 0, "bytes_verified": 0, "bytes_read": 0,
                  "mismatches": 0, "errors": 0}
        self.dbuf = mmap.mmap(-1, MAX_READ)

    def count(self, k, n=1):
        self.c[k] = self.c.get(k, 0) + n

    def expect(self, rel, off, n):
        with open(self.sh.ref / rel, "rb") as f:
            return os.pread(f.fileno(), n, off)

    def compare(self, what, rel, off, n, got):
        """Checks `got`, read at `off` asking for n bytes, against the
        oracle (reads across the end are short, exactly to the end)."""
        self.count("reads")
        self.count("bytes_read", len(got))
        if not self.sh.verify:
            return
        want = self.expect(rel, off, n)
        if got == want:
            self.count("bytes_verified", len(got))
            return
        self.count("mismatches")
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                  min(len(got), len(want)))
        self.sh.problem("mismatch", f"{what} {rel} [{off}, +{n}): got "
                        f"{len(got)} bytes, expected {len(want)}, first "
                        f"difference at +{at}")

    def pick_range(self, size):
        n = min(size, max(1, int(2 ** self.rnd.uniform(0, 22))))
        if self.rnd.random() < 0.1:          # across the end of the file
            off = max(0, size - self.rnd.randrange(1, n + 1))
            return off, n
        return self.rnd.randrange(0, size - n + 1), n

    def op_pread(self, rel, size):
        if size == 0:
            with open(self.sh.mnt / rel, "rb") as f:
                self.compare("pread", rel, 0, 1, os.pread(f.fileno(), 1, 0))
            return
        off, n = self.pick_range(size)
        if self.rnd.random() < 0.25:
            off &= ~4095
            n = min(MAX_READ, (n + 4095) & ~4095)
            fd = os.open(self.sh.mnt / rel, os.O_RDONLY | os.O_DIRECT)
            try:
                got = os.preadv(fd, [memoryview(self.dbuf)[:n]], off)
                data = self.dbuf[:got]
            finally:
                os.close(fd)
            self.compare("pread O_DIRECT", rel, off, n, data)
            return
        fd = os.open(self.sh.mnt / rel, os.O_RDONLY)
        try:
            data = os.pread(fd, n, off)
        finally:
            os.close(fd)
        self.compare("pread", rel, off, n, data)

    def op_mmap(self, rel, size):
        if size == 0:
            return self.op_stat(rel, size)
        off, n = self.pick_range(size)
        fd = os.open(self.sh.mnt / rel, os.O_RDONLY)
        try:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                data = m[off:off + n]
        finally:
            os.close(fd)
        self.compare("mmap", rel, off, n, data)

    def op_whole(self, rel, size):
        with open(self.sh.mnt / rel, "rb", buffering=0) as f:
            off = 0
            while True:
                data = f.read(1 << 20)
                self.compare("whole", rel, off, 1 << 20, data)
                if not data:
                    break
                off += len(data)
        if off != size:
            self.count("mismatches")
            self.sh.problem("mismatch", f"whole {rel}: {off} bytes, "
                            f"expected {size}")

    def op_drop(self, rel, size):
        fd = os.open(self.sh.mnt / rel, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def op_readdir(self, rel, size):
        d = self.rnd.choice(self.sh.dirs)
        names = set(os.listdir(self.sh.mnt / d))
        self.count("readdirs")
        if names != self.sh.listing[d]:
            self.count("mismatches")
            self.sh.problem("mismatch", f"readdir {d or '.'}: extra "
                            f"{sorted(names - self.sh.listing[d])[:3]}, "
                            f"missing {sorted(self.sh.listing[d] - names)[:3]}")

    def op_stat(self, rel, size):
        if self.rnd.random() < 0.2:
            d = self.rnd.choice(self.sh.dirs)
            ok = stat.S_ISDIR(os.stat(self.sh.mnt / d).st_mode)
            what = f"stat {d or '.'}: not a directory"
        else:
            st = os.stat(self.sh.mnt / rel)
            ok = stat.S_ISREG(st.st_mode) and st.st_size == size
            what = f"stat {rel}: mode {st.st_mode:o} size {st.st_size}, " \
                   f"expected a file of {size}"
        self.count("stats")
        if not ok:
            self.count("mismatches")
            self.sh.problem("mismatch", what)

    def op_xattr(self, rel, size):
        try:
            value = os.getxattr(self.sh.mnt / rel, XATTR)
        except OSError as e:
            if e.errno != errno.E2BIG:   # too many runs to list: allowed
                raise
            self.count("xattrs_too_big")
            return
        self.count("xattrs")
        want = self.sh.expected_sources(rel)
        got = {ln.split()[0] for ln in value.decode().splitlines()
               if ln.strip()}
        if want is not None and got != want:
            self.count("mismatches")
            self.sh.problem("mismatch", f"xattr {rel}: {sorted(got)[:3]}, "
                            f"expected {sorted(want)[:3]}")

    def run(self):
        names = [n for n, _ in OPS]
        weights = [w for _, w in OPS]
        try:
            while not self.sh.done():
                op = self.rnd.choices(names, weights)[0]
                rel = self.rnd.choice(self.sh.files)
                try:
                    getattr(self, "op_" + op)(rel, self.sh.sizes[rel])
                except OSError as e:
                    self.count("errors")
                    self.sh.problem("error", f"{op} {rel}: {e!r}")
                self.count("op_" + op)
        except BaseException as e:        # a bug of this script
            self.count("errors")
            self.sh.problem("error", f"worker crashed: {e!r}")
        finally:
            self.sh.merge(self.c)


def progress(sh, threads, t0):
    while not sh.done() and any(t.is_alive() for t in threads):
        sh.stop.wait(10)
        if not sh.done():
            log(f"{time.monotonic() - t0:.0f}s")


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--bin", default=os.environ.get(
        "RESHARDFS_BIN", str(REPO / "build" / "reshardfs")))
    ap.add_argument("--verify", choices=["bytes", "none"], default="bytes")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="make_sample_checkpoint sizes, k=v,...")
    ap.add_argument("--src-tp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--cache-size", default="256M")
    ap.add_argument("--dir", default="/tmp/reshardfs-stress")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)

    base = Path(args.dir).resolve()
    logs = base / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    src, ref, exp = prepare(base, parse_model(args.model), args.src_tp,
                            args.tp)
    daemon = Daemon(args.bin, src, base / "mnt",
                    [f"tp={args.tp}", f"cache_size={args.cache_size}"], logs)
    failures = []
    try:
        sh = Shared(args, daemon.mnt, ref, exp)
        log(f"{args.threads} threads for {args.seconds:g}s over "
            f"{len(exp.files)} files ({exp.total_bytes() / 1e9:.2f} GB), "
            f"daemon {args.bin}")
        t0 = time.monotonic()
        workers = [Worker(sh, i) for i in range(args.threads)]
        threads = [threading.Thread(target=w.run) for w in workers]
        for t in threads:
            t.start()
        progress(sh, threads, t0)
        for t in threads:
            t.join(timeout=args.seconds + 600)
        elapsed = time.monotonic() - t0
        if any(t.is_alive() for t in threads):
            failures.append("a worker hung")
            sh.stop.set()
        stats = json.loads((daemon.mnt / ".reshardfs" / "stats").read_bytes())
        hwm = daemon.vm_hwm_mib()
    except BaseException:
        daemon.kill()
        raise
    err = daemon.unmount()
    if err:
        failures.append(err)
    reports = sorted(p.name for p in logs.glob("san*"))
    if reports:
        failures.append(f"sanitizer reports: {reports} in {logs}")

    t = sh.totals
    result = {
        "threads": args.threads, "seconds": round(elapsed, 1),
        "view_bytes": exp.total_bytes(), "files": len(exp.files),
        "reads": t.get("reads", 0), "bytes_read": t.get("bytes_read", 0),
        "bytes_verified": t.get("bytes_verified", 0),
        "mismatches": t.get("mismatches", 0), "errors": t.get("errors", 0),
        "ops": {k[3:]: v for k, v in sorted(t.items())
                if k.startswith("op_")},
        "readdirs": t.get("readdirs", 0), "stats": t.get("stats", 0),
        "xattrs": t.get("xattrs", 0),
        "xattrs_too_big": t.get("xattrs_too_big", 0),
        "GB_per_s": round(t.get("bytes_read", 0) / elapsed / 1e9, 3),
        "daemon_vm_hwm_mib": hwm,
        "daemon_read_errors": stats.get("read_errors"),
        "daemon_cache_hits": stats.get("cache_hits"),
        "daemon_cache_misses": stats.get("cache_misses"),
        "problems": sh.problems, "failures": failures,
        "binary": args.bin, "verify": args.verify,
    }
    if result["mismatches"] or result["errors"]:
        failures.append(f"{result['mismatches']} mismatches, "
                        f"{result['errors']} errors")
    if stats.get("read_errors"):
        failures.append(f"daemon counted {stats['read_errors']} read errors")
    print(json.dumps({k: v for k, v in result.items() if k != "problems"},
                     indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if failures:
        log("FAILED: " + "; ".join(failures))
        tail = daemon.log()[-3000:]
        if tail:
            log("daemon log tail:\n" + tail)
        return 1
    log("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
