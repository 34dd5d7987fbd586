#!/usr/bin/env python3
"""Check the PD request bodies our router sends against SGLang's and vLLM's REAL code.

    "$PY" tests/pd/check_bodies.py BODIES.json      # PY from tests/kv_events/setup_venv.sh

One PASS/FAIL line per check; exit 0 iff all pass. See tests/pd/README.md. Importing the
engines without torch: every package __init__ under vllm/, sglang/ (and openai/) is a lazy
module that resolves names from its own `from .x import name` lines or submodules, so only
the real files the checks need load (a real __init__ runs only as a fallback, listed on the
`note:` line); STUBBED modules are placeholders (any attribute is a class accepting anything,
pydantic: Any) that the checks never call, except the real definitions `_sglang_fixups`
executes into them; `regex` is the stdlib `re`; vLLM's current_platform is a CUDA placeholder.
"""

from __future__ import annotations

import __future__
import ast, copy, dataclasses, enum, functools, json, logging, os, re, sys, traceback, types, typing  # noqa: E401
import importlib.abc, importlib.machinery, importlib.metadata, importlib.util  # noqa: E401
from pathlib import Path
from types import SimpleNamespace as NS
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kv_events"))
from engine_events import SGLANG_VERSION, exec_defs_from_file  # noqa: E402

VLLM_VERSION = "0.33.0"
U63 = 2**63 - 1
STUBBED = [  # third-party packages absent from the venv (those the import path needs) ...
    "torch", "torchaudio", "numpy", "scipy", "PIL", "cv2", "av", "soundfile", "transformers", "huggingface_hub",
    "safetensors", "triton", "tqdm", "requests", "IPython", "httpx", "anyio", "sniffio", "aiohttp", "pybase64",
    "xxhash", "cachetools", "cloudpickle", "cpuinfo", "openai_harmony", "uvloop", "packaging",
    # ... and engine modules whose import drags in the GPU runtime
    "vllm.platforms", "vllm.outputs", "vllm.v1.outputs", "vllm.v1.metrics", "vllm.compilation",
    "vllm.utils.torch_utils", "vllm.config.model", "vllm.config.speculative", "vllm.config.structured_outputs",
    "sglang.srt.utils.common", "sglang.srt.managers.schedule_batch", "sglang.srt.multimodal.mm_utils",
    "sglang.srt.utils.cuda_ipc_transport_utils",
]
USED_STUBS: list[str] = []
RAN_INITS: list[str] = []


# ----------------------------------------------------------------------------- import machinery
def _decorator_or(a, k, other):
    return a[0] if len(a) == 1 and callable(a[0]) and not k else other()

class _Meta(type):
    def __getattr__(cls, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return _placeholder(k, cls.__module__)

    __getitem__ = __or__ = __ror__ = lambda cls, _: cls

    def __call__(cls, *a, **k):
        return _decorator_or(a, k, super().__call__)

def _placeholder(name, mod):
    from pydantic_core import core_schema
    return _Meta(name, (), {
        "__module__": mod, "__getattr__": lambda s, a: _placeholder(a, mod),
        "__call__": lambda s, *a, **k: _decorator_or(a, k, _placeholder(name, mod)),
        "__get_pydantic_core_schema__": classmethod(lambda c, s, h: core_schema.any_schema())})

class _StubModule(types.ModuleType):
    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        setattr(self, k, v := _placeholder(k, self.__name__))
        return v

class _LazyPackage(types.ModuleType):
    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        d, me = object.__getattribute__(self, "__dict__"), self.__name__
        if "_imap" not in d:
            d["_imap"] = imap = {"*": []}
            for n in ast.parse(Path(d["__file__"]).read_text()).body:
                if isinstance(n, ast.ImportFrom):
                    base = importlib.util.resolve_name("." * n.level + (n.module or ""), me)
                    for a in n.names:
                        imap["*"].append(base) if a.name == "*" else imap.__setitem__(a.asname or a.name, (base, a.name))
        imap = d["_imap"]
        if k in imap:
            base, name = imap[k]
            m = None if base == me else importlib.import_module(base)
            v = getattr(m, name) if hasattr(m, name) else importlib.import_module(f"{base}.{name}")
        elif any(hasattr(m := importlib.import_module(b), k) for b in imap["*"]):
            v = getattr(m, k)
        elif any((Path(p) / f"{k}.py").exists() or (Path(p) / k).is_dir() for p in d["__path__"]):
            v = importlib.import_module(f"{me}.{k}")
        elif not d.get("_ran"):
            d["_ran"] = True
            RAN_INITS.append(me)
            exec(compile(Path(d["__file__"]).read_text(), d["__file__"], "exec"), d)
            return getattr(self, k)
        else:
            raise AttributeError(f"module {me} has no attribute {k}")
        setattr(self, k, v)
        return v

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in STUBBED):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if name.split(".")[0] in ("vllm", "sglang") or name == "openai":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec and spec.submodule_search_locations and spec.origin:
                spec.loader = self
                return spec
        return None

    def create_module(self, spec):
        if spec.origin is not None:
            return _LazyPackage(spec.name)
        USED_STUBS.append(spec.name)
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass

def _method(path: Path, cls: str, name: str, ns: dict):
    """One method of a class in a real engine file, as a plain function (self passed in)."""
    c = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls)
    f = next(n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[f], type_ignores=[]), str(path), "exec",
                 flags=__future__.annotations.compiler_flag, dont_inherit=True), ns)
    return ns[name]

def _sglang_fixups(sr: Path):
    """Real definitions the checks call, put into the placeholder modules that own them."""
    import sglang.srt.managers.schedule_batch as sb
    import sglang.srt.multimodal.mm_utils as mm
    import sglang.srt.utils.common as common
    from sglang.srt.multimodal.modality import Modality

    exec_defs_from_file(sr / "utils/common.py", ["flatten_nested_list"], common.__dict__)
    mm.flatten_nested_list = common.flatten_nested_list
    exec_defs_from_file(sr / "multimodal/mm_utils.py", ["has_valid_data"], mm.__dict__)
    sb.__dict__.update(Union=typing.Union, Literal=typing.Literal, List=typing.List, IntEnum=enum.IntEnum,
                       total_ordering=functools.total_ordering, Modality=Modality)
    exec_defs_from_file(sr / "model_executor/forward_batch_info.py", ["CaptureHiddenMode"], sb.__dict__)
    exec_defs_from_file(sr / "managers/schedule_batch.py",
                        ["ReturnHiddenStatesMode", "SamplingLogprobsMode", "get_return_hidden_states_mode"], sb.__dict__)

def load_engines():
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    logging.getLogger().addHandler(logging.NullHandler())  # engines' import-time chatter
    sys.modules["regex"] = re
    sys.meta_path.insert(0, _Finder())
    for pkg, want in (("sglang", SGLANG_VERSION), ("vllm", VLLM_VERSION)):
        if (got := importlib.metadata.version(pkg)) != want:
            raise ImportError(f"need {pkg}=={want}, found {got}")
    import pydantic
    import vllm.platforms
    plat = vllm.platforms.current_platform = _placeholder("current_platform", "vllm.platforms")
    plat.device_type = "cuda"
    plat.get_nixl_supported_devices, plat.get_max_output_tokens = staticmethod(dict), staticmethod(lambda n: None)
    sr = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt"
    _sglang_fixups(sr)
    from sglang.srt.entrypoints import api_contract
    from sglang.srt.entrypoints.openai import protocol as sp
    from sglang.srt.environ import envs
    from sglang.srt.managers import io_struct
    from sglang.srt.utils.network import NetworkAddress

    sg = NS(contract_error=api_contract.generate_contract_error, GenerateReqInput=io_struct.GenerateReqInput,
            adapter=pydantic.TypeAdapter(io_struct.GenerateReqInput),
            Chat=sp.ChatCompletionRequest, Completion=sp.CompletionRequest)
    ns = {"GenerateReqInput": io_struct.GenerateReqInput, "logger": logging.getLogger("x"), "Any": typing.Any,
          "convert_json_schema_to_str": sp.convert_json_schema_to_str}
    f = sr / "entrypoints/openai/serving_completions.py"
    conv, build = (_method(f, "OpenAIServingCompletion", n, ns) for n in ("_convert_to_internal_request", "_build_sampling_params"))
    srv = NS(template_manager=NS(completion_template_name=None), extract_custom_labels=lambda r: None,
             extract_routed_dp_rank_from_header=lambda r, v: v, _resolve_lora_path=lambda m, p: p,
             extract_routing_key=lambda r: None)
    srv._build_sampling_params = functools.partial(build, srv)
    sg.completion_to_internal = lambda req: conv(srv, req, None)[0]
    sent: list = []
    ns = {"sock_send": lambda worker, req: sent.append(worker), "logger": logging.getLogger("x")}
    f = sr / "managers/data_parallel_controller.py"
    ext, follow = (_method(f, "DataParallelController", n, ns) for n in ("maybe_external_dp_rank_routing", "follow_bootstrap_room_scheduler"))

    def prefill_dp_dispatch(dp, req):  # prefill DP controller, load_balance_method=follow_bootstrap_room
        ctrl = NS(workers=list(range(dp)), _active_workers=list(range(dp)))
        ctrl.maybe_external_dp_rank_routing = functools.partial(ext, ctrl)
        follow(ctrl, req)
        return sent[-1]
    sg.prefill_dp_dispatch = prefill_dp_dispatch
    ns = {"NetworkAddress": NetworkAddress, "envs": envs, "Optional": typing.Optional}
    exec_defs_from_file(sr / "disaggregation/decode.py", ["_bootstrap_addr"], ns)
    resolve = _method(sr / "disaggregation/decode.py", "DecodePreallocQueue", "_resolve_prefill_dp_rank", ns)
    sg.decode_prefill_dp_rank = lambda dp, req: resolve(NS(kv_manager=NS(prefill_info_table=NS(
        get=lambda addr: NS(dp_size=dp, follow_bootstrap_room=True)))), req)

    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import pull_scheduler
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.v1.request import Request, RequestStatus
    vroot = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    ns = exec_defs_from_file(vroot / "entrypoints/serve/utils/api_utils.py", ["get_max_tokens"], {"current_platform": plat})
    vl = NS(Chat=ChatCompletionRequest, Completion=CompletionRequest, Request=Request, RequestStatus=RequestStatus,
            get_max_tokens=ns["get_max_tokens"], Scheduler=pull_scheduler.NixlPullConnectorScheduler,
            sched_logger=pull_scheduler.logger)
    return sg, vl


# ----------------------------------------------------------------------------- reporting
RESULTS: list[bool] = []

def check(name, fn, *args):
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - every failure is a FAIL line
        RESULTS.append(False)
        where = traceback.extract_tb(e.__traceback__)[-1]
        msg = " | ".join(str(e).splitlines()[:3]) or f"at {Path(where.filename).name}:{where.lineno}: {where.line}"
        print(f"FAIL {name}: {type(e).__name__}: {msg[:300]}")
        return None
    RESULTS.append(True)
    print(f"PASS {name}")
    return out

def need(cond, msg):
    if not cond:
        raise AssertionError(msg)

is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
as_list = lambda v: v if isinstance(v, list) else [v]  # noqa: E731


# ----------------------------------------------------------------------------- SGLang
PD_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room", "routed_dp_rank", "disagg_prefill_dp_rank", "rid")

def sglang_fields(sg, e):
    """Parse like the server does, check the PD fields; return the per-request items."""
    path, body, src = e["path"], e["body"], copy.deepcopy(e["body"])
    if path == "/generate":
        err = sg.contract_error(src)  # http_server answers 400 before anything else
        need(err is None, f"sglang.api.v1 GenerateRequest contract: {err}")
        unknown = set(body) - {f.name for f in dataclasses.fields(sg.GenerateReqInput)}
        need(not unknown, f"keys GenerateReqInput lacks (FastAPI drops them silently): {sorted(unknown)}")
        obj = sg.adapter.validate_python(src)  # what FastAPI does with the dataclass body
    else:
        cls = sg.Chat if path == "/v1/chat/completions" else sg.Completion
        need(cls is sg.Chat or path == "/v1/completions", f"unexpected path {path}")
        req = cls.model_validate(src)
        known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        need(not (unknown := set(body) - known), f"keys {cls.__name__} ignores: {sorted(unknown)}")
        for k in PD_KEYS:
            need(getattr(req, k) == body.get(k), f"{cls.__name__}.{k} = {getattr(req, k)!r}, body had {body.get(k)!r}")
        if cls is sg.Completion:  # the real OpenAIServingCompletion._convert_to_internal_request
            obj = sg.completion_to_internal(req)
        else:  # serving_chat passes these fields through unchanged (the rest needs a tokenizer)
            obj = sg.GenerateReqInput(text="<chat>", sampling_params={"n": req.n}, rid=req.rid,
                                      **{k: getattr(req, k) for k in PD_KEYS if k != "rid"})
    obj.normalize_batch_and_arguments()
    for k in ("bootstrap_host", "bootstrap_room", "rid"):
        need(k in body, f"missing {k}")
    need(all(isinstance(h, str) and h for h in as_list(body["bootstrap_host"])), "bootstrap_host: str or list of str")
    need(all(p is None or is_int(p) for p in as_list(body.get("bootstrap_port"))), "bootstrap_port: int|null or list")
    need(all(is_int(r) and 0 <= r <= U63 for r in as_list(body["bootstrap_room"])), "bootstrap_room not in [0, 2^63-1]")
    need(all(isinstance(r, str) and r for r in as_list(body["rid"])), "rid: str or list of str")
    for k in ("routed_dp_rank", "disagg_prefill_dp_rank"):
        need(body.get(k) is None or is_int(body[k]), f"{k} must be an int")
    lists = [k for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room") if isinstance(body.get(k), list)]
    need(len(lists) in (0, 3), f"only {lists} are lists")
    need(not lists or not obj.is_single, "bootstrap lists on a single (non-batch) request")
    need(lists or obj.batch_size == 1, f"batch of {obj.batch_size} with scalar bootstrap fields (engine uses room+i)")
    for k in lists:
        need(len(body[k]) == obj.batch_size, f"len({k})={len(body[k])} != batch size {obj.batch_size}")
    items = [obj] if obj.is_single else [obj[i] for i in range(obj.batch_size)]
    for it in items:  # what each scheduler request ends up with
        need(isinstance(it.bootstrap_host, str) and is_int(it.bootstrap_room) and 0 <= it.bootstrap_room <= U63
             and (it.bootstrap_port is None or is_int(it.bootstrap_port)), f"item {it.rid}: bad bootstrap fields")
    rooms = [it.bootstrap_room for it in items]
    need(len(set(rooms)) == len(rooms), f"rooms repeat within one request: {rooms}")
    return items

def sglang_pair(sg, dp, p, d, p_items, d_items):
    need(d is not None, "no decode leg with the same bootstrap_room")
    need(p["path"] == d["path"], "legs went to different paths")
    need("routed_dp_rank" not in d["body"], "decode body carries routed_dp_rank")
    rest = {k: v for k, v in p["body"].items() if k != "routed_dp_rank"}
    diff = sorted(k for k in set(rest) | set(d["body"]) if rest.get(k) != d["body"].get(k))
    need(not diff, f"decode body != prefill body minus routed_dp_rank: {diff}")
    if dp <= 1:
        return
    r = p["body"].get("routed_dp_rank")
    need(is_int(r) and 0 <= r < dp, f"prefill routed_dp_rank={r!r}, dp_size={dp}")
    need(p["body"].get("disagg_prefill_dp_rank") == r == d["body"].get("disagg_prefill_dp_rank"),
         "disagg_prefill_dp_rank (both legs) != routed_dp_rank")
    need(p_items and len(p_items) == len(d_items), "legs did not parse")
    for pi, di in zip(p_items, d_items):
        got = sg.prefill_dp_dispatch(dp, NS(routed_dp_rank=pi.routed_dp_rank, bootstrap_room=pi.bootstrap_room))
        by_room = sg.prefill_dp_dispatch(dp, NS(routed_dp_rank=None, bootstrap_room=pi.bootstrap_room))
        need(got == r and by_room == r, f"room {pi.bootstrap_room}: dispatched to {got}, room % {dp} = {by_room}, want {r}")
        need((got := sg.decode_prefill_dp_rank(dp, di)) == r, f"decode resolves prefill dp rank {got}, want {r}")

def check_sglang(sg, entries, dp):
    items = [check(f"sglang#{i} {e['leg']} {e['path']}: real request class + normalize + PD fields",
                   sglang_fields, sg, e) for i, e in enumerate(entries)]
    room = lambda e: json.dumps(e["body"].get("bootstrap_room"))  # noqa: E731
    for i, p in enumerate(entries):
        j = next((j for j, d in enumerate(entries) if d["leg"] == "decode" and room(d) == room(p)), None)
        if p["leg"] == "prefill":
            check(f"sglang#{i} {p['path']}: decode leg #{j} same body, no routed_dp_rank, DP rule (dp_size={dp})",
                  sglang_pair, sg, dp, p, None if j is None else entries[j], items[i], items[j] if j is not None else None)
        elif not any(q["leg"] == "prefill" and room(q) == room(p) for q in entries):
            check(f"sglang#{i} decode {p['path']}: has a prefill leg", need, False, "no prefill leg with the same room")


# ----------------------------------------------------------------------------- vLLM
PROMPT_LEN = 40
PREFILL_REWRITTEN = {"max_tokens", "max_completion_tokens", "min_tokens", "stream", "stream_options", "kv_transfer_params"}

def nixl_scheduler(vl, engine_id):
    cfg = mock.MagicMock()
    cfg.parallel_config.tensor_parallel_size = cfg.parallel_config.decode_context_parallel_size = 1
    cfg.parallel_config.pipeline_parallel_size, cfg.parallel_config.data_parallel_index = 1, 0
    cfg.cache_config.block_size, cfg.num_prefill_lookahead_tokens = 16, 1
    cfg.kv_transfer_config.get_from_extra_config.side_effect = lambda key, default: default
    cfg.kv_transfer_config.kv_buffer_device = "cuda"
    cfg.scheduler_config.disable_hybrid_kv_cache_manager = False
    kcc = mock.MagicMock(transfer_groups=[], kv_cache_groups=[], has_mamba_layers=False)
    kcc.select_transfer_block_ids.side_effect = lambda b: b
    return vl.Scheduler(cfg, engine_id, kcc)

def vllm_engine_request(vl, e):
    """Body -> protocol model -> SamplingParams -> v1 Request, as the OpenAI server and engine do."""
    chat = e["path"] == "/v1/chat/completions"
    need(chat or e["path"] == "/v1/completions", f"unexpected path {e['path']}")
    req = (vl.Chat if chat else vl.Completion).model_validate(copy.deepcopy(e["body"]))
    need(not req.model_extra, f"keys vLLM ignores: {sorted(req.model_extra or ())}")
    mct = getattr(req, "max_completion_tokens", None)
    max_tokens = vl.get_max_tokens(4096, mct if mct is not None else req.max_tokens, PROMPT_LEN, {}, None,
                                   truncate_prompt_tokens=getattr(req, "truncate_prompt_tokens", None))
    sp = req.to_sampling_params(max_tokens, {})
    need((sp.extra_args or {}).get("kv_transfer_params") == e["body"].get("kv_transfer_params"),
         f"SamplingParams.extra_args lacks kv_transfer_params: {sp.extra_args}")
    r = vl.Request(f"{'chatcmpl' if chat else 'cmpl'}-{e.get('request_id')}-0badc0de", list(range(PROMPT_LEN)), sp, None)
    need(r.kv_transfer_params == e["body"]["kv_transfer_params"], "Request.kv_transfer_params differs")
    return sp, r

def vllm_prefill(vl, e):
    b = e["body"]
    need(b.get("max_tokens") == 1, f"max_tokens={b.get('max_tokens')!r}")
    need(b.get("max_completion_tokens", 1) == 1, f"max_completion_tokens={b.get('max_completion_tokens')!r}")
    need(b.get("min_tokens", 0) <= 1, f"min_tokens={b.get('min_tokens')!r}")
    need(b.get("stream") in (False, None) and "stream_options" not in b, "stream must be false/absent, no stream_options")
    kv = b.get("kv_transfer_params") or {}
    need(kv.get("do_remote_decode") is True and not kv.get("do_remote_prefill"), f"kv_transfer_params={kv}")
    sp, r = vllm_engine_request(vl, e)
    need(sp.max_tokens == 1, f"SamplingParams.max_tokens={sp.max_tokens}")
    s = nixl_scheduler(vl, "prefill-engine")  # the P-side connector scheduler
    s.on_new_request(r)
    need(s.get_num_new_matched_tokens(r, 0) == (0, False), "prefill would load external KV")
    s.update_state_after_alloc(r, None, 0)
    need(r.request_id in s._reqs_in_batch, "P scheduler did not take it as a remote-decode request")
    r.status = vl.RequestStatus.FINISHED_LENGTH_CAPPED
    delay, answer = s.request_finished(r, ([1, 2, 3],))
    need(delay and answer and answer["do_remote_prefill"] is True, f"request_finished -> {delay}, {answer}")
    return answer

def vllm_decode(vl, e, p_answer):
    kv = e["body"].get("kv_transfer_params")
    need(isinstance(kv, dict) and kv.get("do_remote_prefill") is True, f"kv_transfer_params={kv}")
    _, r = vllm_engine_request(vl, e)
    s = nixl_scheduler(vl, "decode-engine")  # the D-side connector scheduler
    blocks = NS(blocks=([],), get_unhashed_block_ids_all_groups=lambda: ([10, 11, 12],))
    with mock.patch.object(vl.sched_logger, "warning") as warning:
        s.on_new_request(r)
        n, is_async = s.get_num_new_matched_tokens(r, 0)
        need(n > 0 and is_async, f"get_num_new_matched_tokens -> ({n}, {is_async}): no remote prefill")
        s.update_state_after_alloc(r, blocks, n)
    need(not warning.called, f"scheduler warned: {[c.args[0] % c.args[1:] for c in warning.call_args_list]}")
    need(r.request_id in s._reqs_need_recv, "update_state_after_alloc queued no KV pull")
    need(kv.get("remote_engine_id") in s._heartbeat_by_engine, "no lease heartbeat registered (tp_size/host/port?)")
    missing = set(p_answer or {}) - set(kv)
    need(not missing, f"lacks keys the real P request_finished returns: {sorted(missing)}")

def vllm_pair(p, d):
    need(p["leg"] == "prefill" and d["leg"] == "decode", f"legs {p['leg']}, {d['leg']}: want prefill then decode")
    need(p.get("request_id") and p.get("request_id") == d.get("request_id"),
         f"X-Request-Id {p.get('request_id')!r} vs {d.get('request_id')!r}")
    need(p["path"] == d["path"], "legs went to different paths")
    pb, db = p["body"], d["body"]
    diff = sorted(k for k in (set(pb) | set(db)) - PREFILL_REWRITTEN if pb.get(k) != db.get(k))
    need(not diff, f"prefill and decode bodies differ outside the PD rewrite: {diff}")

def check_vllm(vl, entries):
    for i in range(0, len(entries), 2):
        p, d = entries[i], (entries[i + 1:] or [{"leg": "missing", "body": {}, "path": "?"}])[0]
        tag = f"vllm#{i}/{i + 1} {p['path']} {p.get('request_id')}"
        check(f"{tag}: prefill then decode, same X-Request-Id, same client body", vllm_pair, p, d)
        answer = None
        if p["leg"] == "prefill":
            answer = check(f"{tag}: prefill parses, max_tokens 1, no stream, do_remote_decode, SamplingParams "
                           "extra_args, NIXL P scheduler", vllm_prefill, vl, p)
        if d["leg"] == "decode":
            check(f"{tag}: decode parses, SamplingParams extra_args, NIXL D scheduler pulls, no warning",
                  vllm_decode, vl, d, answer)

def main(argv):
    if len(argv) != 2:
        print("usage: check_bodies.py BODIES.json", file=sys.stderr)
        return 2
    data = json.loads(Path(argv[1]).read_text())
    engines = check("import SGLang/vLLM request code", load_engines)
    if engines is None:
        return 1
    top = sorted({next(s for s in STUBBED if m == s or m.startswith(s + ".")) for m in USED_STUBS})
    print(f"note: placeholders: {', '.join(top)}; real __init__ run: {', '.join(RAN_INITS) or 'none'}")
    check_sglang(engines[0], data.get("sglang", []), int(data.get("sglang_prefill_dp_size", 1)))
    check_vllm(engines[1], data.get("vllm", []))
    print(f"{RESULTS.count(True)} passed, {RESULTS.count(False)} failed")
    return 0 if RESULTS and all(RESULTS) else 1

if __name__ == "__main__":
    sys.exit(main(sys.argv))
