"""Byte-level tools the malformed-checkpoint corpus is built with.

Nothing here needs torch.  Pickles (DCP ``.metadata``, torch.save
``data.pkl``) are loaded with inert stand-ins for every class outside a few
builtin modules, edited as plain objects, and pickled back with the same
GLOBAL names, so the result is what torch would have written for the edited
object.  Zip items inside ``.distcp`` files are edited in place, at the
offsets their headers give.
"""

import copyreg
import io
import json
import pickle
import struct
import zipfile

# Modules whose globals are unpickled as the real thing.
_REAL = {"builtins", "collections", "copyreg", "_codecs", "codecs"}


class Stub:
    """An instance of a class reshardfs' pickles name (torch's, mcore's).
    NEWOBJ(cls, args) + BUILD(state) and REDUCE(cls, args) [+ BUILD] both
    round-trip; a dict state is reachable as attributes."""

    _rs_module = _rs_name = None

    def __new__(cls, *args):
        o = object.__new__(cls)
        o.__dict__["_rs"] = {"args": args, "kind": "new", "state": None}
        return o

    def __init__(self, *args):      # only REDUCE calls the class
        self.__dict__["_rs"]["kind"] = "reduce"

    def __setstate__(self, state):
        self.__dict__["_rs"]["state"] = state

    def __reduce_ex__(self, proto):
        r = self.__dict__["_rs"]
        if r["kind"] == "reduce":
            return (type(self), r["args"], r["state"])
        return (copyreg.__newobj__, (type(self),) + r["args"], r["state"])

    @property
    def args(self):
        return self.__dict__["_rs"]["args"]

    @args.setter
    def args(self, value):
        self.__dict__["_rs"]["args"] = tuple(value)

    @property
    def state(self):
        return self.__dict__["_rs"]["state"]

    @state.setter
    def state(self, value):
        self.__dict__["_rs"]["state"] = value

    def __getattr__(self, key):
        st = self.__dict__["_rs"]["state"]
        if isinstance(st, dict) and key in st:
            return st[key]
        raise AttributeError(key)

    def __setattr__(self, key, value):
        st = self.__dict__["_rs"]["state"]
        if key in ("args", "state") or not isinstance(st, dict):
            object.__setattr__(self, key, value)
        else:
            st[key] = value

    def __repr__(self):
        r = self.__dict__["_rs"]
        return f"<{self._rs_module}.{self._rs_name} {r['kind']} " \
               f"args={r['args']!r} state={r['state']!r}>"


_classes = {}


def stub_class(module, name):
    """The stand-in class for GLOBAL module.name (one per name)."""
    key = (module, name)
    if key not in _classes:
        _classes[key] = type(name, (Stub,), {
            "_rs_module": module, "_rs_name": name, "__module__": module,
            "__qualname__": name})
    return _classes[key]


class PersId:
    """A BINPERSID value (torch.save's storage reference)."""

    def __init__(self, pid):
        self.pid = pid


class DupDict(list):
    """Pickled as a dict whose (key, value) pairs are these, duplicates
    included (a pickle may repeat a key; Python keeps the last)."""


class _Unpickler(pickle._Unpickler):
    def find_class(self, module, name):
        if module in _REAL:
            return super().find_class(module, name)
        return stub_class(module, name)

    def persistent_load(self, pid):
        return PersId(pid)


class _Pickler(pickle._Pickler):
    dispatch = dict(pickle._Pickler.dispatch)

    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, PersId) else None

    def save_global(self, obj, name=None):
        if isinstance(obj, type) and issubclass(obj, Stub) and \
                obj._rs_module is not None:
            if self.proto >= 4:
                self.save(obj._rs_module)
                self.save(obj._rs_name)
                self.write(pickle.STACK_GLOBAL)
            else:
                self.write(pickle.GLOBAL + obj._rs_module.encode() + b"\n" +
                           obj._rs_name.encode() + b"\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)

    def save_dupdict(self, obj):
        self.write(pickle.EMPTY_DICT)
        self._batch_setitems(iter(obj))

    dispatch[DupDict] = save_dupdict


def loads(data):
    return _Unpickler(io.BytesIO(data)).load()


def dumps(obj, protocol=4, fast=False):
    """``fast``: no memo (smaller for data.pkl-sized pickles)."""
    buf = io.BytesIO()
    p = _Pickler(buf, protocol=protocol)
    p.fast = fast
    p.dump(obj)
    return buf.getvalue()


def G(module, name):
    """A GLOBAL as a value (e.g. a dtype: G("torch", "float32"))."""
    return stub_class(module, name)


def call(module, name, *args):
    """REDUCE(module.name, args), e.g. call("torch", "Size", (2, 3))."""
    o = stub_class(module, name).__new__(stub_class(module, name), *args)
    o.__dict__["_rs"]["kind"] = "reduce"
    return o


# ------------------------------------------------------------ DCP metadata

def read_metadata(ck):
    return loads((ck / ".metadata").read_bytes())


def write_metadata(ck, md):
    (ck / ".metadata").write_bytes(dumps(md, 4))


def storage_items(md):
    """[(MetadataIndex, _StorageInfo)] in stored order."""
    return list(md.storage_data.items())


def tensor_items(md, fqn):
    return [(k, v) for k, v in md.storage_data.items()
            if k.fqn == fqn and k.offset is not None]


def rename_fqn(md, old, new):
    """Renames a tensor or byte item everywhere .metadata names it."""
    md.state_dict_metadata = {(new if k == old else k): v
                              for k, v in md.state_dict_metadata.items()}
    for k in md.storage_data:
        if k.fqn == old:
            k.fqn = new


def size_of(v):
    """The tuple inside torch.Size((...))."""
    return tuple(v.args[0])


def set_size(v, dims):
    v.args = (tuple(dims),)


# -------------------------------------------------------- zips in .distcp

def zip_entries(blob):
    """{record: (header_offset, data_offset, size, cd_offset)} of a
    torch.save zip (offsets relative to the blob)."""
    z = zipfile.ZipFile(io.BytesIO(blob))
    out = {}
    cd = _central_offsets(blob)
    for info in z.infolist():
        ho = info.header_offset
        nlen, xlen = struct.unpack_from("<HH", blob, ho + 26)
        rec = info.filename.split("/", 1)[1]
        out[rec] = (ho, ho + 30 + nlen + xlen, info.file_size,
                    cd[info.filename])
    return out


def _central_offsets(blob):
    """Offsets of each central directory record, by name."""
    out = {}
    i = blob.find(b"PK\x01\x02")
    while i >= 0 and blob[i:i + 4] == b"PK\x01\x02":
        nlen, xlen, clen = struct.unpack_from("<HHH", blob, i + 28)
        out[blob[i + 46:i + 46 + nlen].decode()] = i
        i += 46 + nlen + xlen + clen
    return out


def end_records(blob):
    """(zip64 end record offset, zip64 locator offset, end record offset)."""
    eocd = len(blob) - 22
    assert blob[eocd:eocd + 4] == b"PK\x05\x06"
    loc = eocd - 20
    assert blob[loc:loc + 4] == b"PK\x06\x07"
    rec = struct.unpack_from("<Q", blob, loc + 8)[0]
    return rec, loc, eocd


def item_span(md, fqn, index=0):
    """(relative_path, offset, length) of chunk `index` of tensor fqn, or
    of the byte item fqn."""
    for k, v in md.storage_data.items():
        if k.fqn == fqn:
            if index == 0:
                return v.relative_path, v.offset, v.length
            index -= 1
    raise KeyError(fqn)


def patch(path, offset, data):
    """Overwrites bytes of a file in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def replace_pickle_in_place(path, at, size, new):
    """Puts pickle `new` where a zip entry of `size` bytes is, padded with
    zeros after its STOP (unpicklers stop there); it must fit."""
    if len(new) > size:
        raise ValueError(f"new pickle {len(new)} > {size} bytes")
    patch(path, at, new + b"\0" * (size - len(new)))


# ------------------------------------------------------------------ zarr

def zarray(path):
    return json.loads(path.read_text())


def write_zarray(path, meta):
    path.write_text(json.dumps(meta, indent=4, sort_keys=True))
