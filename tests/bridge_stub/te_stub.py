"""A stand-in for NVIDIA Transformer Engine that answers exactly one import:
Megatron-Bridge's module-level `import transformer_engine.pytorch as te` in
megatron/bridge/peft/lora_layers.py (isinstance checks and annotations:
te.Linear, te.LayerNormLinear, te.ops.*), for the Megatron-Bridge oracle
(tests/mount/bridge_oracle.py) and nothing else.

    sys.path.insert(0, "tests/bridge_stub")
    import te_stub
    with te_stub.for_bridge():
        import megatron.bridge

While the block runs, an import of transformer_engine(.anything) made from
the module named in ANSWERS gets the stub; every other one (megatron-core's
`import transformer_engine` tests for HAVE_TE, Megatron-Bridge's own in its
model providers) goes to the real import system and fails as it does
without TE.  The stub never enters sys.modules, so nothing imported later
sees it either: megatron-core keeps HAVE_TE=False and runs on its local
(torch) spec.  check_no_te() says so, or names the flags that are True.
"""
import builtins
import contextlib
import sys
import types

# The importing modules the stub answers.
ANSWERS = {"megatron.bridge.peft.lora_layers"}


class _Absent:
    """A TE class: nothing is an instance of it and it cannot be made."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__}: Transformer Engine is a "
                           "stub here (tests/bridge_stub/te_stub.py)")


class _Names(types.ModuleType):
    """A module whose every public name not set on it is an _Absent
    subclass, made on first use."""

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        cls = type(name, (_Absent,), {"__module__": self.__name__})
        setattr(self, name, cls)
        return cls


transformer_engine = types.ModuleType("transformer_engine")
transformer_engine.__version__ = "0.0.0+reshardfs.stub"
pytorch = _Names("transformer_engine.pytorch")
pytorch.ops = _Names("transformer_engine.pytorch.ops")
transformer_engine.pytorch = pytorch


@contextlib.contextmanager
def for_bridge():
    real = builtins.__import__

    def hook(name, globals=None, locals=None, fromlist=(), level=0):
        if (level == 0 and name.split(".")[0] == "transformer_engine" and
                (globals or {}).get("__name__") in ANSWERS):
            mod = transformer_engine
            if fromlist:  # from transformer_engine.x import y: the x
                for part in name.split(".")[1:]:
                    mod = getattr(mod, part)
            return mod
        return real(name, globals, locals, fromlist, level)

    builtins.__import__ = hook
    try:
        yield
    finally:
        builtins.__import__ = real


def check_no_te():
    """The HAVE_TE* flags of the loaded megatron.core modules that are True
    (an empty list when megatron-core runs without TE), and
    transformer_engine if it is in sys.modules.  (Megatron-Bridge's peft
    and Gemma-4 modules set HAVE_TE* from whether megatron-core's
    extensions module defines TE wrapper class names, which it does
    without TE too; those flags are not about TE being here.)"""
    true = []
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("megatron.core"):
            continue
        for attr, val in list(vars(mod).items()):
            if attr.startswith("HAVE_TE") and val is True:
                true.append(f"{name}.{attr}")
    true += [n for n in sys.modules if n.split(".")[0] == "transformer_engine"]
    return true
