"""Writes the torch.save fixtures of test_torchzip and their expected entries.

Run with a Python that has torch (the repo's .venv-mcore):
    python tests/unit/data/make_torchzip_fixtures.py

For each FIXTURE.pt it writes FIXTURE.txt:
    archive NAME
    NAME HEADER_OFFSET DATA_OFFSET SIZE CRC32     (one line per entry,
                                                   central directory order)
Offsets come from torch's own reader (PyTorchFileReader.get_record_offset)
and are cross-checked against zipfile and the local headers.
"""
import io
import os
import struct
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def expected(path):
    raw = open(path, "rb").read()
    reader = torch._C.PyTorchFileReader(path)
    lines = []
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        archive = infos[0].filename.split("/", 1)[0]
        lines.append("archive %s" % archive)
        for i in infos:
            assert i.compress_type == zipfile.ZIP_STORED
            assert i.compress_size == i.file_size
            nlen, xlen = struct.unpack_from("<HH", raw, i.header_offset + 26)
            data = i.header_offset + 30 + nlen + xlen
            record = i.filename.split("/", 1)[1]
            assert reader.get_record_offset(record) == data
            assert data % 64 == 0
            lines.append("%s %d %d %d %d" % (i.filename, i.header_offset,
                                              data, i.file_size, i.CRC))
    with open(os.path.splitext(path)[0] + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    torch.manual_seed(0)
    w = torch.randn(4, 8)
    tensors = {
        "w": w,
        "view": w[:, 1::2],            # non-contiguous, shares w's storage
        "bf": torch.arange(15, dtype=torch.bfloat16).reshape(3, 5),
        "empty": torch.empty(0),
        "i64": torch.arange(7),
        "p": torch.nn.Parameter(torch.ones(2, 3)),
        "meta": {"step": 3, "names": ["a", "b"]},
    }
    path = os.path.join(HERE, "torchzip_tensors.pt")
    torch.save(tensors, path)
    expected(path)

    buf = io.BytesIO()                 # archive name "archive"
    torch.save({"x": torch.arange(10, dtype=torch.float16), "n": [1, 2]}, buf)
    path = os.path.join(HERE, "torchzip_buffer.pt")
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    expected(path)


if __name__ == "__main__":
    main()
