"""Hostile calls: the findings of issue 17 that are not a file to check but something done
to the checker or the guards while they work (a file swapped between two system calls, a
FIFO as the base config, a guarded cache stored into every way Python allows, a copied
pool, shapes that are not shapes, two threads, a bogus mode variable).

Each attack is a Python body run in its own child process (``tests/test_hostile.py``) under
an address-space limit and a deadline; it prints what the user was told with ``answer(...)``
and every string of ``says`` must be in it. A body that cannot run here (no torch, not
root) answers ``SKIP <why>``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Attack:
    name: str
    finding: str
    """The finding of issue 17, in its words."""
    says: tuple[str, ...]
    """What the answer must hold: the code (or the exception's class) and its words."""
    body: str
    memory_mib: int = 1024
    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


PRELUDE = textwrap.dedent("""
    import os, sys, resource, pathlib, threading, copy, itertools
    _limit = int(sys.argv[2]) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (_limit, _limit))
    tmp = pathlib.Path(sys.argv[1])
    sys.path.insert(0, sys.argv[3])
    import lora_guard as lg
    from hostile.corpus import adapter, config

    def answer(text):
        print("ANSWER", str(text).replace("\\n", " "))

    def refused(call):
        try:
            call()
        except lg.LoRAGuardError as exc:
            return f"{exc.code} {exc}"
        except (TypeError, ValueError, OSError) as exc:
            return f"{type(exc).__name__} {exc}"
        return "accepted"

    def codes(report):
        return " | ".join(f"{v.code} {v.message}" for v in report.violations) or "clean"

    class Meta:  # tensor metadata: what the guards read
        def __init__(self, shape, dtype="float32"):
            self.shape, self.dtype = shape, dtype

    def cli(*argv):
        import contextlib, io
        from lora_guard._frontends.cli import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            status = main(list(argv))
        return f"exit {status} {out.getvalue()}"
""")

_SWAP = """
folder = adapter(tmp)
real_open, swapped = os.open, []
def swapping_open(path, flags, *args, **kwargs):
    if str(path).endswith("adapter_model.safetensors") and not swapped:
        swapped.append(path)
        os.remove(path)
        {swap}
    return real_open(path, flags, *args, **kwargs)
os.open = swapping_open
said = codes(lg.check_adapters(folder))
answer(f"swapped={{bool(swapped)}} {{said}}")
"""

_CACHE = """
import numpy as np
old, new = np.zeros((16, 64), np.float32), np.zeros((8, 64), np.float32)
store = {{"k": old}}
cache = lg.GuardedCache(store)
def attempt():
    {call}
said = refused(attempt)
answer(f"{{said}} unchanged={{list(store) == ['k'] and store['k'] is old}}")
"""

_POOL = """
class Pool:
    @lg.shapes(a="slots rank", frozen=("rank",))
    def set_lora(self, a):
        pass
pool = Pool()
pool.set_lora(Meta((2, 8)))
twin = copy.{how}(pool)
starts = lg.frozen_dims(twin)
lg.unfreeze(twin)
twin.set_lora(Meta((2, 16)))
answer(f"twin started {{starts}}, now {{lg.frozen_dims(twin)}}; original "
       f"{{lg.frozen_dims(pool)}}; original given rank 16: "
       + refused(lambda: pool.set_lora(Meta((2, 16)))))
"""

_SHAPE = """
class Pool:
    @lg.shapes(a="slots rank", frozen=("rank",))
    def set_lora(self, a):
        pass
{make}
answer(refused(lambda: Pool().set_lora(weight)))
"""

_THREADS = """
registry = lg.LayoutRegistry()
weights = {"layers.0.mlp.experts.gate_up_proj.lora_A": (1, 32, 64)}
in_body, may_fail = threading.Event(), threading.Event()

@lg.guard_adapter_load(registry, adapter_id="name", weights="tensors")
def load(name, tensors, fail):
    if fail:
        in_body.set()
        may_fail.wait(10)
        raise OSError("disk full")

def failing():
    try:
        load("math", weights, True)
    except OSError:
        pass

worker = threading.Thread(target=failing)
worker.start()
in_body.wait(10)
load("math", weights, False)  # loads while the first load is still in its body
may_fail.set()
worker.join(10)
answer(f"kept={'math' in registry.adapters}")
"""

_BASE_CONFIG = """
folder = adapter(tmp / "a")
base = tmp / "config.json"
{make}
answer(cli("check", str(folder), "--base-config", str(base), "--no-progress"))
"""

_SHRINK = """
folder = adapter(tmp)
real_fstat, done = os.fstat, []
def shrinking_fstat(fd):
    info = real_fstat(fd)
    path = os.readlink(f"/proc/self/fd/{fd}") if isinstance(fd, int) else ""
    if path.endswith("adapter_model.safetensors") and not done:
        done.append(path)
        os.truncate(path, 12)  # another process truncates it right after the fstat
    return info
os.fstat = shrinking_fstat
said = codes(lg.check_adapters(folder))
answer(f"shrunk={bool(done)} {said}")
"""

_SHRINK_SCAN = """
folder = adapter(tmp)
weights = folder / "adapter_model.safetensors"
spec = lg.inspect_adapter(folder)
real_preadv, done = os.preadv, []
def shrinking_preadv(fd, buffers, offset):
    if not done:
        done.append(offset)
        os.truncate(weights, offset)  # truncated just before the values are read
    return real_preadv(fd, buffers, offset)
os.preadv = shrinking_preadv
said = codes(lg.check_adapters([spec], scan_values=True))
answer(f"shrunk={bool(done)} {said}")
"""

_UNREADABLE = """
top = tmp / "uploads"
adapter(top, name="good")
locked = top / "locked"
locked.mkdir()
adapter(locked, name="hidden")
if os.geteuid() == 0:  # root reads a mode-000 folder: make scandir fail as it does for a user
    real_scandir = os.scandir
    def scandir(path="."):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)
    os.scandir = scandir
else:
    locked.chmod(0)
report = lg.check_adapters(top)
answer(f"checked={len(report.ids)} " + codes(report))
"""

_HARD_LINK = """
if os.geteuid() != 0:
    answer("SKIP only root can give a file to another user (chown) here")
    raise SystemExit
source = adapter(tmp / "elsewhere")
secret = source / "adapter_model.safetensors"
os.chown(secret, 65534, 65534)  # a file of another user, outside the folder
folder = tmp / "upload"
folder.mkdir()
(folder / "adapter_config.json").write_bytes((source / "adapter_config.json").read_bytes())
os.link(secret, folder / "adapter_model.safetensors")
answer(codes(lg.check_adapters(folder)))
"""

_JAGGED = """
try:
    import torch
except ImportError:
    answer("SKIP torch is not installed")
    raise SystemExit
class Pool:
    @lg.shapes(a="slots n d", frozen=("n",))
    def set_lora(self, a):
        pass
jagged = torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(4, 3)], layout=torch.jagged)
answer(refused(lambda: Pool().set_lora(jagged)))
"""

_CACHE_CALLS = {
    "cache-setitem": 'cache["k"] = new',
    "cache-update-dict": 'cache.update({"k": new})',
    "cache-update-pairs": 'cache.update([("k", new)])',
    "cache-update-kwargs": "cache.update(k=new)",
    "cache-ior-operator": 'cache.__ior__({"k": new})',
    "cache-ior-statement": 'global cache\n    cache |= {"k": new}',
    "cache-setdefault": 'cache.setdefault("k", new)',
    "cache-same-key-twice": 'cache.update([("x", old), ("x", new)])',
}

_SHAPES = {
    "shape-float-dim": ("weight = Meta((2, 16.9))",
                        "LG004", "argument 'a': dim 1 of the shape is 16.9 (float)"),
    "shape-negative-dim": ("weight = Meta((2, -8))",
                           "LG004", "argument 'a': dim 1 of the shape is -8, a negative"),
    "shape-endless-iterator": ("weight = Meta(itertools.count())",
                               "LG004", "argument 'a': its shape has more than 64 dims"),
}

ATTACKS: list[Attack] = [
    Attack("base-config-fifo", "a FIFO given as --base-config hangs forever",
           ("exit 2", "not a regular file"), _BASE_CONFIG.format(make="os.mkfifo(base)")),
    Attack("base-config-duplicate-key", "duplicate keys in the base config.json",
           ("exit 2", "duplicate key 'hidden_size'"), _BASE_CONFIG.format(
               make="base.write_text('{\"hidden_size\": 64, \"hidden_size\": 4096, "
                    "\"num_hidden_layers\": 2}')")),
    Attack("swap-to-fifo-before-open", "lstat then open: the file swapped for a FIFO (hang)",
           ("swapped=True", "LG108", "not a regular file"),
           _SWAP.format(swap="os.mkfifo(path)")),
    Attack("swap-to-symlink-before-open",
           "lstat then open: the file swapped for a symlink (read outside the folder)",
           ("swapped=True", "LG108", "outside the adapter folder"),
           _SWAP.format(swap="os.symlink(adapter(tmp / 'outside') / "
                             "'adapter_model.safetensors', path)")),
    Attack("shrinks-after-fstat", "a file that shrinks while read: struct.error traceback",
           ("shrunk=True", "LG108"), _SHRINK),
    Attack("shrinks-during-value-scan", "a file that shrinks while its values are scanned",
           ("shrunk=True", "LG108"), _SHRINK_SCAN),
    Attack("unreadable-subfolder",
           "EACCES on a subfolder: a traceback, or skipped silently and reported clean",
           ("checked=2", "LG108", "locked", "Permission denied"), _UNREADABLE),
    Attack("hard-link-from-another-user",
           "a hard-linked file outside the folder, where that can be told",
           ("LG108", "hard link"), _HARD_LINK),
    *(Attack(name, "GuardedCache.update() twice-in-one-call, update(**kwargs) and |= bypass "
             "LG003; every mutating path checked, atomically", ("LG003", "unchanged=True"),
             _CACHE.format(call=call)) for name, call in _CACHE_CALLS.items()),
    *(Attack(f"pool-{how}", "copy.copy(pool) shares frozen dims with the original",
             ("twin started {'rank': 8}, now {'rank': 16}", "original {'rank': 8}",
              "given rank 16: LG001"), _POOL.format(how=how))
      for how in ("copy", "deepcopy")),
    *(Attack(name, "shape_of accepts 16.9 and negative dims; an endless .shape exhausts "
             "memory", (error, says), _SHAPE.format(make=make))
      for name, (make, error, says) in _SHAPES.items()),
    Attack("shape-jagged-tensor", "a nested jagged tensor raises AttributeError",
           ("LG004", "argument 'a': dim 1 of the shape is ragged"), _JAGGED,
           memory_mib=8192),
    Attack("threads-guard-adapter-load",
           "two threads loading through guard_adapter_load can lose a loaded adapter",
           ("kept=True",), _THREADS),
    Attack("mode-bogus-under-w-error",
           "LORA_GUARD_MODE=bogus makes import lora_guard fail under python -W error",
           ("raise", "LORA_GUARD_MODE must be one of"), "answer(lg.get_mode())",
           flags=("-W", "error"), env={"LORA_GUARD_MODE": "bogus"}),
]
