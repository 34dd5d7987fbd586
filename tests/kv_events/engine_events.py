"""Import SGLang's and vLLM's REAL KV-event modules without their heavy deps.

Used by ``tests/kv_events/publisher.py`` (live publisher driver) and by
``tests/fixtures/kv_events/gen_wire_fixtures.py`` (wire golden fixtures).

Only imports unrelated to KV events are stubbed; the event classes, the
publishers and the recorder come from the installed packages' own files:

* ``sglang.srt.disaggregation.kv_events``  (EventBatch, KVEventBatch,
  BlockStored, BlockRemoved, AllBlocksCleared, ZmqEventPublisher)  -- real
* ``sglang.srt.mem_cache.events``           (KVCacheEventRecorder)    -- real
* ``vllm.distributed.kv_events``           (same names)              -- real
* ``vllm.config.kv_events`` / ``vllm.config.utils`` / ``vllm.envs`` /
  ``vllm.utils.network_utils`` / ``vllm.utils.hashing``               -- real

Stubs (every one of them; nothing else is replaced)
---------------------------------------------------
SGLang
  * ``sglang``, ``sglang.srt.utils``: bare package modules pointing at the
    installed directories, so their ``__init__`` (torch, HF patches, frontend)
    does not run; submodules load from the real files.
  * ``sglang.srt.runtime_context``: ``get_parallel`` only (used by
    ``is_kv_publisher_rank``, never called here; the real module pulls in the
    server-args machinery).
  * recorder only (``load_sglang(with_recorder=True)``):
    ``sglang.kernels.ops.kvcache.mla_buffer`` names set to None (GPU kernels
    imported by ``mem_cache/utils.py``); SGLang's C++ page-hash extension
    (``mem_cache/cpp_utils/hash_binding.cpp``, normally JIT-built through
    torch) is compiled with g++ from the installed sglang's own source and put
    in place of ``native_hash._load_native_hash_module``; ``RadixKey`` and
    ``TreeNode`` are executed alone (via ``ast``) from the real
    ``mem_cache/radix_cache.py`` whose module imports torch.
vLLM
  * ``vllm``, ``vllm.config``, ``vllm.utils``, ``vllm.v1``, ``vllm.v1.core``,
    ``vllm.distributed``: bare package modules (their ``__init__`` imports
    torch / every config class / the parallel-state machinery).
  * ``vllm.logger``: ``init_logger = logging.getLogger`` (the real one imports
    ``vllm.logging_utils`` whose ``__init__`` imports a torch tensor printer).
  * ``torch`` (ONLY if torch is not installed): a module with a dummy
    ``dtype`` class. ``vllm/config/utils.py`` does ``import torch`` at module
    level and touches only ``torch.dtype`` (inside a hashing helper that the
    events code never calls).
  * ``vllm.v1.core.kv_cache_utils``: the real module imports the whole v1
    engine (torch, multimodal, request). Its definitions that the events code
    and the fixtures need -- ``BlockHash``, ``ExternalBlockHash``,
    ``maybe_convert_block_hash``, ``hash_block_tokens``,
    ``to_event_extra_keys``, ``init_none_hash`` and the NONE_HASH seed helpers
    -- are executed alone (via ``ast``) from the real file.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

SGLANG_VERSION = "0.5.23"


def _stub(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__kv_events_stub__ = True
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def _bare_package(name: str, path: Path) -> types.ModuleType:
    """A package module whose __init__ is not executed."""
    return _stub(name, __path__=[str(path)], __file__=str(path / "__init__.py"))


def _pkg_root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{name} is not installed (pip install --no-deps {name})")
    return Path(list(spec.submodule_search_locations)[0])


def exec_defs_from_file(path: Path, names: list[str], namespace: dict) -> dict:
    """Execute only the named top-level defs/classes/assignments of a real file.

    For names defined several times (``@overload``), all of them run in file
    order, so the last (real) definition wins, as in the module itself.
    """
    tree = ast.parse(path.read_text())
    body = []
    found = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            body.append(node)
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            tgts = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if any(t in names for t in tgts):
                body.append(node)
                found.update(tgts)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id in names:
                found.add(node.target.id)
                if node.value is not None:
                    body.append(node)
    missing = set(names) - found
    if missing:
        raise RuntimeError(f"{path}: definitions not found: {sorted(missing)}")
    import __future__

    code = compile(
        ast.Module(body=body, type_ignores=[]),
        str(path),
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    exec(code, namespace)
    return namespace


# --------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------


def _no_parallel():  # pragma: no cover - never called by the events code
    raise RuntimeError("get_parallel is stubbed (not needed for KV events)")


def build_sglang_hash_extension(root: Path, build_dir: Path, avx2: bool) -> types.ModuleType:
    import pybind11

    src = root / "srt" / "mem_cache" / "cpp_utils" / "hash_binding.cpp"
    name = "hicache_hash_cpp"
    build_dir.mkdir(parents=True, exist_ok=True)
    out = build_dir / (name + sysconfig.get_config_var("EXT_SUFFIX"))
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        # Same flags as native_hash._load_native_hash_module passes to torch's loader.
        cflags = ["-O3", "-std=c++17", "-DNDEBUG"] + (["-mavx2"] if avx2 else [])
        cmd = [
            os.environ.get("CXX", "g++"), *cflags, "-shared", "-fPIC",
            "-Wno-deprecated-declarations",
            f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
            f"-DTORCH_EXTENSION_NAME={name}", str(src), "-o", str(out), "-lcrypto",
        ]
        print("building", src.name, "with g++ ...", file=sys.stderr)
        subprocess.run(cmd, check=True)
    loader = importlib.machinery.ExtensionFileLoader(name, str(out))
    spec = importlib.util.spec_from_file_location(name, str(out), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _bind_event_types(handles, kv) -> None:
    """The event module and the classes both engines name alike."""
    handles.kv = kv
    for name in ("EventBatch", "KVEventBatch", "BlockStored", "BlockRemoved", "AllBlocksCleared",
                 "ZmqEventPublisher"):
        setattr(handles, name, getattr(kv, name))


class SGLang:
    """Handles to SGLang's real KV-event code."""

    def __init__(self, with_recorder: bool = False, build_dir: Path | None = None,
                 check_version: bool = True):
        self.version = importlib.metadata.version("sglang")
        if check_version and self.version != SGLANG_VERSION:
            raise ImportError(f"need sglang=={SGLANG_VERSION}, found {self.version}")
        root = _pkg_root("sglang")
        self.root = root
        if "sglang" not in sys.modules or not getattr(sys.modules["sglang"], "__kv_events_stub__", False):
            _bare_package("sglang", root)
            _stub("sglang.srt.runtime_context", get_parallel=_no_parallel)
            _bare_package("sglang.srt.utils", root / "srt" / "utils")
        import sglang.srt.utils.network  # noqa: F401  (real; psutil + zmq)
        import sglang.srt.disaggregation.kv_events as kv

        _bind_event_types(self, kv)
        self.StorageMedium = kv.StorageMedium
        if with_recorder:
            self._load_recorder(build_dir or Path("/tmp/kv-events-sglang-ext"))

    def _load_recorder(self, build_dir: Path) -> None:
        root = self.root
        _stub(
            "sglang.kernels.ops.kvcache.mla_buffer",
            **{n: None for n in (
                "get_mla_kv_buffer_kernel", "get_mla_kv_buffer_triton",
                "set_mla_kv_buffer_dcp_sharded_triton", "set_mla_kv_buffer_fp8_quant_kernel",
                "set_mla_kv_buffer_kernel", "set_mla_kv_buffer_triton",
                "set_mla_kv_buffer_triton_fp8_quant", "set_mla_kv_scale_buffer_kernel",
                "set_mla_kv_scale_buffer_triton",
            )},
        )
        import sglang.srt.mem_cache.cpp_utils.native_hash as native_hash

        ext = build_sglang_hash_extension(root, build_dir, native_hash._cpu_supports_avx2())
        native_hash._load_native_hash_module = lambda: ext
        import sglang.srt.mem_cache.events as events
        import sglang.srt.mem_cache.utils as mc_utils

        self.events = events
        self.mc_utils = mc_utils
        self.KVCacheEventRecorder = events.KVCacheEventRecorder
        self.KvEventLoraNames = events.KvEventLoraNames

        import time
        from array import array
        from collections import defaultdict
        from typing import Any, Iterator, List, Optional, Tuple, Union

        ns = dict(array=array, defaultdict=defaultdict, time=time, Any=Any, Iterator=Iterator,
                  List=List, Optional=Optional, Tuple=Tuple, Union=Union,
                  __name__="sglang.srt.mem_cache.radix_cache")
        exec_defs_from_file(root / "srt" / "mem_cache" / "radix_cache.py", ["RadixKey", "TreeNode"], ns)
        self.RadixKey = ns["RadixKey"]
        self.TreeNode = ns["TreeNode"]


# --------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------

_KV_CACHE_UTILS_NAMES = [
    "BlockHash",
    "ExternalBlockHash",
    "maybe_convert_block_hash",
    "hash_block_tokens",
    "to_event_extra_keys",
    "DEFAULT_NONE_HASH_SEED",
    "_NON_CRYPTO_HASH_FUNCTIONS",
    "_NONE_HASH_SEED",
    "resolve_none_hash_seed",
    "init_none_hash",
]


class VLLM:
    """Handles to vLLM's real KV-event code."""

    def __init__(self):
        self.version = importlib.metadata.version("vllm")
        root = _pkg_root("vllm")
        self.root = root
        if "vllm" not in sys.modules or not getattr(sys.modules["vllm"], "__kv_events_stub__", False):
            _bare_package("vllm", root)
            for sub in ("config", "utils", "v1", "v1.core", "distributed"):
                _bare_package(f"vllm.{sub}", root.joinpath(*sub.split(".")))
            _stub("vllm.logger", init_logger=logging.getLogger)
            if importlib.util.find_spec("torch") is None:
                _stub("torch", dtype=type("dtype", (), {}))
            import vllm.envs as envs
            import vllm.utils.hashing as hashing

            from typing import Any, NewType, TypeAlias
            from collections.abc import Callable, Iterable, Sequence

            kcu = _stub(
                "vllm.v1.core.kv_cache_utils",
                __file__=str(root / "v1" / "core" / "kv_cache_utils.py"),
                os=os, envs=envs, Any=Any, NewType=NewType, TypeAlias=TypeAlias,
                Callable=Callable, Iterable=Iterable, Sequence=Sequence,
                xxhash=hashing.xxhash, xxhash_cbor=hashing.xxhash_cbor,
                logger=logging.getLogger("vllm.v1.core.kv_cache_utils"),
            )
            exec_defs_from_file(root / "v1" / "core" / "kv_cache_utils.py", _KV_CACHE_UTILS_NAMES, kcu.__dict__)
        import vllm.envs as envs
        import vllm.utils.hashing as hashing
        import vllm.v1.core.kv_cache_utils as kcu
        import vllm.distributed.kv_events as kv

        self.envs = envs
        self.hashing = hashing
        self.kv_cache_utils = kcu
        _bind_event_types(self, kv)
