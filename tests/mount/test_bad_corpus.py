"""The malformed-checkpoint corpus (tests/bad) against the real daemon.

The corpus is built once per session (tests/bad/make_corpus.py, numpy only;
its torch_dist base is a copy of a torch_dist view of a zarr sample).  For
each case (tests/bad/cases.py says what is wrong and what must happen):

* Refused: the daemon exits 1 within the timeout, never mounts, and its
  stderr is a summary line ("reshardfs: <SOURCE>: refused: ... (N
  problems below)") and then exactly the expected lines, each
  "reshardfs: <SOURCE>/...", each holding its expected substrings.  No crash (a signal), no hang, no
  other output.
* Mounts: the mount comes up; the files the case names give EIO; every
  other file reads exactly its expected bytes - the numpy oracle of the
  case's own source for zarr views, the torch_dist base (which a tp=2 view
  reproduces byte for byte) for torch_dist views - and the view lists
  exactly the expected files.
"""

import errno
import itertools
import os
import sys
import zipfile

import pytest

from conftest import REPO, run_failing_mount
from oracle import ExpectedView

sys.path.insert(0, str(REPO / "tests" / "bad"))
import cases as corpus_cases  # noqa: E402
import edit  # noqa: E402
import make_corpus  # noqa: E402

CASES = corpus_cases.CASES
REFUSE_TIMEOUT = 10.0


@pytest.fixture(scope="session")
def corpus(reshardfs_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("bad") / "corpus"
    make_corpus.make_corpus(out, reshardfs_bin)
    return make_corpus.Context(out)


def _files(root):
    """Relative paths of every file under root (symlinks to files too)."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for f in filenames:
            out.add(f if rel == "." else os.path.join(rel, f))
    return out


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _assert_eio(path):
    with pytest.raises(OSError) as ei:
        data = _read(path)
        pytest.fail(f"{path}: read {len(data)} bytes, expected EIO")
    assert ei.value.errno == errno.EIO, f"{path}: {ei.value}"


def _zip_records(data):
    """{record: bytes} of a torch.save zip (the archive prefix dropped)."""
    import io
    z = zipfile.ZipFile(io.BytesIO(data))
    return {n.split("/", 1)[1]: z.read(n) for n in z.namelist()}


def check_refused(case, src, rc, stderr):
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    want = case.expect.lines
    assert rc == 1, f"daemon exit status {rc} (expected 1)\n{stderr}"
    assert all(ln.startswith("reshardfs: ") for ln in lines), \
        f"output other than 'reshardfs:' lines:\n{stderr}"
    # Every refusal leads with one summary line that counts the rest.
    summary = lines.pop(0) if lines else ""
    assert summary.startswith(f"reshardfs: {src}: refused: ") and \
        summary.endswith(f"({len(lines)} problem{'' if len(lines) == 1 else 's'} below)"), \
        f"no summary line counting the problems:\n{stderr}"
    assert len(lines) == len(want), \
        f"{len(lines)} lines, expected {len(want)}:\n{stderr}"
    assert all(str(src) in ln for ln in lines), \
        f"a line does not name a file of {src}:\n{stderr}"
    assert any(all(all(n in ln for n in needles)
                   for ln, needles in zip(perm, want))
               for perm in itertools.permutations(lines)), \
        f"lines do not hold {want}:\n{stderr}"


def check_zarr_view(case, src, mnt, tp):
    exp = ExpectedView(src, tp)
    got = _files(mnt)
    assert got == set(exp.files) | set(case.expect.extra), \
        f"view lists {sorted(got ^ (set(exp.files) | set(case.expect.extra)))}" \
        " unexpectedly (or misses them)"
    for rel in sorted(got):
        if rel in case.expect.eio:
            _assert_eio(mnt / rel)
        elif rel in case.expect.extra:
            assert _read(mnt / rel) == _read(src / rel), rel
        else:
            assert _read(mnt / rel) == exp.read(rel), rel


def check_td_view(case, src, mnt, base):
    want = _files(base)
    got = _files(mnt)
    assert got == want, f"view differs in files: {sorted(got ^ want)}"
    for rel in sorted(got):
        data = None if rel in case.expect.eio else _read(mnt / rel)
        if rel in case.expect.eio:
            _assert_eio(mnt / rel)
        elif rel in case.expect.source and rel == ".metadata":
            # Same objects; Python's pickler memoizes where reshardfs
            # does not, so compare what they unpickle to.
            assert repr(edit.loads(data)) == \
                repr(edit.loads(_read(src / rel))), rel
        elif rel in case.expect.source:
            assert data == _read(src / rel), rel
        else:
            assert data == _read(base / rel), rel


def check_zarr_view_of_td(case, mnt, base_zarr):
    """A zarr view of a td case at tp=2 is the zarr base, but for
    re-wrapped ShardedObjects (same records, another zip layout)."""
    want = _files(base_zarr)
    got = _files(mnt)
    assert got == want, f"view differs in files: {sorted(got ^ want)}"
    for rel in sorted(got):
        if rel in case.expect.eio:
            _assert_eio(mnt / rel)
            continue
        data = _read(mnt / rel)
        expect = _read(base_zarr / case.expect.same_as.get(rel, rel))
        if "/shard_" in rel and rel.endswith(".pt"):
            assert _zip_records(data) == _zip_records(expect), rel
        else:
            assert data == expect, rel


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bad_checkpoint(case, corpus, reshardfs_bin, mount, tmp_path):
    src = corpus.out / case.name
    opts = case.options()
    if isinstance(case.expect, corpus_cases.Refused):
        rc, err = run_failing_mount(reshardfs_bin, src, tmp_path / "mnt",
                                    opts, tmp_path, REFUSE_TIMEOUT)
        check_refused(case, src, rc, err)
        return
    m = mount(src, opts)
    tp = int(next(o for o in opts if o.startswith("tp="))[3:])
    view = next((o[7:] for o in opts if o.startswith("format=")), None)
    if case.base == "zarr":
        assert view in (None, "zarr"), "zarr cases are checked as zarr views"
        check_zarr_view(case, src, m.mnt, tp)
    elif view in (None, "torch_dist"):
        assert tp == 2, "the td base is its own view at tp=2 only"
        check_td_view(case, src, m.mnt, corpus.td)
    else:
        assert tp == 2
        check_zarr_view_of_td(case, m.mnt, corpus.zarr)
    m.unmount()


def test_corpus_manifest(corpus):
    """make_corpus.py's manifest lists every case, at least 30, each with
    what is wrong and its outcome."""
    import json
    man = json.loads((corpus.out / "cases.json").read_text())
    assert [c["name"] for c in man] == [c.name for c in CASES]
    assert len(man) >= 30
    for c in man:
        assert c["what"] and c["expect"]["kind"] in ("Refused", "Mounts")
