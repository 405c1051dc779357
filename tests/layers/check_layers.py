#!/usr/bin/env python3
"""The layering rules of docs/ARCHITECTURE.md, checked on the source tree.

Usage: check_layers.py REPO.  Prints one line per broken rule and exits 1,
or exits 0 when every rule holds.  Run by ctest (tests/unit/CMakeLists.txt).

Rules, for every project #include "dir/..." in a file under a layer:
  planner/             planner/ only
  gpu/                 gpu/, planner/
  formats/codec/       formats/codec/, planner/
  formats/<format>/    itself, formats/codec/, formats/checkpoint.h,
                       formats/model.h,
                       planner/  (never another format, never the table)
  formats/ (top)       formats/, planner/
  fs/                  anything
and: <fuse*.h> only in fs/, never in the FUSE-free fs/blocks.*, fs/cache.*,
fs/log.* or fs/snapshot.*; `RS_HAVE_CUDA` tested in gpu/executor.c alone.
"""
import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)
LAYERS = ("planner", "formats", "gpu", "fs")
FUSE_FREE = ("fs/blocks.", "fs/cache.", "fs/log.", "fs/snapshot.")


def allowed(rel, target):
    """Whether the file at rel (posix path) may include target."""
    top = rel.split("/")[0]
    if top == "fs":
        return True
    if target.startswith("planner/"):
        return True
    if top == "planner":
        return False
    if top == "gpu":
        return target.startswith("gpu/")
    parts = rel.split("/")
    if len(parts) == 2:                       # formats/checkpoint.c, open.c
        return target.startswith("formats/")
    own = "/".join(parts[:2]) + "/"
    if target.startswith(own) or target.startswith("formats/codec/"):
        return True
    return parts[1] != "codec" and target in ("formats/checkpoint.h",
                                              "formats/model.h")


def main(repo):
    bad = []
    for layer in LAYERS:
        for path in sorted((repo / layer).rglob("*")):
            if path.suffix not in (".c", ".h", ".cu"):
                continue
            rel = path.relative_to(repo).as_posix()
            text = path.read_text()
            for kind, target in INCLUDE.findall(text):
                if kind == "<" and target.startswith("fuse") and (
                        not rel.startswith("fs/") or
                        rel.startswith(FUSE_FREE)):
                    bad.append(f"{rel}: includes <{target}> outside the "
                               "FUSE layer")
                if kind == '"' and target.split("/")[0] in LAYERS and \
                        not allowed(rel, target):
                    bad.append(f"{rel}: includes \"{target}\" across layers")
            if rel != "gpu/executor.c" and re.search(
                    r"#\s*if(def|ndef)?\b.*RS_HAVE_CUDA", text):
                bad.append(f"{rel}: tests RS_HAVE_CUDA (gpu/executor.c alone "
                           "may)")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
