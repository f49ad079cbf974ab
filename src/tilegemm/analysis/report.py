"""``tilegemm explain``: traced memory counts + compiled resources + occupancy + roofline.

The trace runs on numba's CUDA simulator and the resources come from compiling the real
kernel with nvJitLink; one process cannot do both (the simulator replaces ``numba.cuda``),
so :func:`explain` traces in a child process unless it is already running under the
simulator, in which case it skips the compiled resources and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tilegemm.analysis.memory import SECTOR
from tilegemm.analysis.occupancy import ARCH_LIMITS, occupancy
from tilegemm.analysis.roofline import bound, get_gpu
from tilegemm.errors import InvalidValueError


def explain(kernel: str, m: int, n: int, k: int, *, params: Mapping[str, int] | None = None,
            dtype: str = "float32", batch: int = 1, beta: float = 0.0, gpu: str = "h100",
            samples: int = 2, full: bool = False, full_limit: int = 16,
            backend: str = "cuda", resources: bool = True) -> dict[str, Any]:
    """Everything ``tilegemm explain`` shows, as a JSON-ready dict."""
    from tilegemm import registry, simulator
    from tilegemm.backends import get_backend

    if not get_backend(backend).traceable:
        raise InvalidValueError(f"explain analyses CUDA rungs only (got backend {backend!r})")
    spec = registry.get(kernel, backend)
    resolved = spec.resolve(params)
    from tilegemm.backends.cuda import check_for_any_gpu

    check_for_any_gpu(spec, resolved, dtype)
    if resolved.get("SPLIT_K", 1) > 1:
        # the launch is then two kernels (K slices into a workspace, then a sum of the
        # slices): tracing the first alone as if it wrote C counted one slice, unverified
        raise InvalidValueError(
            f"explain traces one kernel; SPLIT_K={resolved['SPLIT_K']} runs two (the K slices "
            "into a workspace, then their sum into C): pass SPLIT_K=1 (--sass counts the "
            "k-tile of any SPLIT_K)")
    if np.dtype(dtype).kind in "iu" and not float(beta).is_integer():
        # the product would take int(beta): 0.5 traced as 0, with C's read counted as needed
        raise InvalidValueError(f"beta must be an integer for a {dtype} product, got {beta}")
    _check_beta_range(beta, np.dtype(dtype))
    g = get_gpu(gpu)
    kw = dict(params=resolved, dtype=dtype, batch=batch, beta=beta, samples=samples,
              full_limit=full_limit, backend=backend)
    if simulator.enabled():
        from tilegemm.analysis.trace import trace_rung

        trace = trace_rung(kernel, m, n, k, full=full or None, **kw)
    else:
        from tilegemm.analysis.trace import trace_in_subprocess

        trace = trace_in_subprocess(kernel, m, n, k, full=full, **kw)

    itemsize = trace["itemsize"]
    flops = 2.0 * m * n * k * batch
    t = trace["totals"]
    load_bytes = t["global_load"]["sectors"] * SECTOR
    store_bytes = t["global_store"]["sectors"] * SECTOR
    ideal = {
        "A": m * k * batch * itemsize, "B": k * n * batch * itemsize,
        "C_write": m * n * batch * itemsize,
        "C_read": m * n * batch * itemsize if beta != 0 else 0,
    }
    ideal_bytes = sum(ideal.values())
    traced_bytes = load_bytes + store_bytes
    sh = t["shared_load"], t["shared_store"]
    memory = {
        "flops": flops,
        "global_load_requests": t["global_load"]["requests"],
        "global_load_sectors": t["global_load"]["sectors"],
        "global_store_requests": t["global_store"]["requests"],
        "global_store_sectors": t["global_store"]["sectors"],
        "traced_bytes": traced_bytes, "ideal_bytes": ideal_bytes, "ideal_breakdown": ideal,
        "traffic_ratio": traced_bytes / ideal_bytes if ideal_bytes else None,
        "flop_per_traced_byte": flops / traced_bytes if traced_bytes else None,
        "flop_per_ideal_byte": flops / ideal_bytes if ideal_bytes else None,
        "shared_requests": sh[0]["requests"] + sh[1]["requests"],
        "shared_wavefronts": sh[0]["wavefronts"] + sh[1]["wavefronts"],
        "shared_ideal_wavefronts": sh[0]["ideal_wavefronts"] + sh[1]["ideal_wavefronts"],
        "shared_conflicted_requests": sh[0]["conflicted"] + sh[1]["conflicted"],
        "shared_max_degree": max(sh[0]["max_degree"], sh[1]["max_degree"]),
    }
    launch = trace["launch"]
    memory["barriers_per_block"] = launch["barriers_per_block"]
    memory["warp_barriers"] = launch["warp_barriers"]
    memory["flop_per_warp_barrier"] = (flops / launch["warp_barriers"]
                                       if launch["warp_barriers"] else None)
    memory["shared_excess_wavefronts"] = (memory["shared_wavefronts"]
                                          - memory["shared_ideal_wavefronts"])

    declared_smem = spec.smem(resolved, itemsize) if spec.smem else trace["traced_shared_bytes"]
    threads = trace["threads_per_block"]
    res_rows: list[dict[str, Any]] = []
    note = ""
    if resources and not simulator.enabled():
        from tilegemm.analysis.resources import archs_for, cuda_resources

        for arch in (a for a in ARCH_LIMITS if a in archs_for(spec)):  # wgmma: sm_90 only
            r = cuda_resources(spec, resolved, dtype, arch).as_dict()
            occ = occupancy(threads, r["registers"], declared_smem, arch)
            res_rows.append({**r, "occupancy": occ.as_dict()})
    elif resources:
        note = ("compiled resources skipped: this process runs the CUDA simulator, which "
                "cannot compile PTX")

    # A tensor-core rung is bounded by the tensor cores' peak (a third of TF32's for 3xTF32,
    # three mma a term), not the FMA units'. An empty product does no arithmetic: a roofline
    # bound would be meaningless (0/0).
    passes = int(resolved.get(spec.precision_param, 1)) if spec.precisions else 0
    roof = {} if flops == 0 else {
        name: bound(g, trace["dtype"], flops, nbytes, passes).__dict__
        for name, nbytes in (("traced", traced_bytes), ("compulsory", ideal_bytes))}
    return {
        "trace": trace, "memory": memory, "static_smem_per_block": declared_smem,
        "resources": res_rows, "resources_note": note,
        "gpu": g.as_dict(), "roofline": roof,
        "peak": g.peak_label(trace["dtype"], passes),
        # integer products do integer operations: counted as OP, not FLOP
        "unit": "OP" if np.dtype(trace["dtype"]).kind in "iu" else "FLOP",
    }


# -- rendering ----------------------------------------------------------------------------

def _n(v: float | int | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not float(v).is_integer():
        return f"{v:,.{digits}g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return f"{int(v):,}"


def _si(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


def render(ex: Mapping[str, Any]) -> list[Any]:
    """Rich renderables for an :func:`explain` result (printed in order)."""
    from rich.table import Table
    from rich.text import Text

    tr, mem = ex["trace"], ex["memory"]
    shown = " ".join(f"{k}={v}" for k, v in tr["params"].items())
    head = Text()
    head.append(f"{tr['backend']}:{tr['kernel']} {shown}  {tr['dtype']}  "
                f"M={tr['m']} N={tr['n']} K={tr['k']}"
                f"{'  batch=' + str(tr['batch']) if tr['batch'] > 1 else ''}"
                f"{'  beta=' + str(tr['beta']) if tr['beta'] else ''}\n", style="bold")
    head.append(f"grid {'×'.join(map(str, tr['grid']))} blocks of "
                f"{'×'.join(map(str, tr['block']))} threads; {tr['sampling']['text']}\n")
    if tr.get("not_counted"):
        head.append(f"not counted: {tr['not_counted']}\n", style="bold")
    if tr["verified"] is not None:
        head.append(f"traced launch verified against float64 NumPy: "
                    f"{'yes' if tr['verified'] else 'NO'}\n")
    out: list[Any] = [head]

    files = sorted({s["where"].split(":")[0] for s in tr["sites"]})
    sites = Table(title="memory instructions, counted per warp request, per launch",
                  caption=f"line numbers in {', '.join(files)}" if files else None)
    for col in ("line", "access", "kind", "requests", "lanes", "sectors/req", "wavefr./req",
                "conflicted"):
        sites.add_column(col, justify="left" if col in ("line", "access", "kind") else "right",
                         no_wrap=col == "access")
    for s in tr["sites"]:
        req = s["requests"] or 1
        shared = s["kind"].startswith("shared")
        space, op = s["kind"].split()
        conflict = ""
        if shared:
            conflict = _n(s["conflicted"])
            if s["max_degree"] > 1:
                conflict += f" ({s['max_degree']}-way)"
        sites.add_row(
            s["where"].split(":")[1], Text(s["text"]), f"{space} {'ld' if op == 'load' else 'st'}",
            _n(s["requests"]), f"{s['accesses'] / req:.3g}",
            "" if shared else f"{s['sectors'] / req:.3g}",
            f"{s['wavefronts'] / req:.3g}" if shared else "", conflict,
        )
    out.append(sites)

    tot = Table(title="totals per launch")
    tot.add_column("quantity", overflow="fold")
    tot.add_column("value", justify="right", overflow="fold")
    unit = ex.get("unit", "FLOP")
    rows = [
        (f"{unit}s (2·M·N·K)", _n(mem["flops"])),
        ("global load requests / 32-byte sectors (the optimisation note's 'transactions')",
         f"{_n(mem['global_load_requests'])} / {_n(mem['global_load_sectors'])}"),
        ("global store requests / sectors",
         f"{_n(mem['global_store_requests'])} / {_n(mem['global_store_sectors'])}"),
        ("global bytes in sectors vs compulsory (inputs once, output once)",
         f"{_si(mem['traced_bytes'], 'B')} vs {_si(mem['ideal_bytes'], 'B')} "
         f"(×{_n(mem['traffic_ratio'])})"),
        (f"arithmetic intensity: {unit}/sector byte, {unit}/compulsory byte",
         f"{_n(mem['flop_per_traced_byte'])}, {_n(mem['flop_per_ideal_byte'])}"),
        ("shared requests / wavefronts (ideal)",
         f"{_n(mem['shared_requests'])} / {_n(mem['shared_wavefronts'])} "
         f"({_n(mem['shared_ideal_wavefronts'])})"),
        ("shared bank-conflicted requests, extra wavefronts, worst degree",
         f"{_n(mem['shared_conflicted_requests'])}, {_n(mem['shared_excess_wavefronts'])}, "
         f"{mem['shared_max_degree']}-way" if mem["shared_requests"] else "-"),
        ("barriers (syncthreads) per block; warp-barriers per launch; "
         f"{unit}s per warp-barrier",
         f"{_n(mem['barriers_per_block'])}; {_n(mem['warp_barriers'])}; "
         + (_n(mem["flop_per_warp_barrier"]) if mem["warp_barriers"] else "none (no barrier)")),
    ]
    for r in rows:
        tot.add_row(*r)
    out.append(tot)

    if ex["resources"]:
        res = Table(title=f"compiled with nvJitLink; occupancy for {tr['threads_per_block']} "
                          f"threads and {_n(ex['static_smem_per_block'])} B shared per block",
                    caption="ptxas's smem on sm_90 includes the 1 KiB the driver reserves per "
                            "block; the occupancy adds that reservation on both")
        for col in ("arch", "regs", "spill B", "smem B", "blocks/SM by warps·blocks·regs·smem",
                    "occupancy", "limited by"):
            res.add_column(col, justify="left" if col in ("arch", "limited by") else "right",
                           overflow="fold")
        notes = []
        for r in ex["resources"]:
            o = r["occupancy"]
            res.add_row(r["arch"], str(r["registers"]), str(r["spill_stores"] + r["spill_loads"]),
                        str(r["smem"]),
                        f"{o['by_warps']}·{o['by_blocks']}·{o['by_registers']}·{o['by_smem']}",
                        f"{o['occupancy']:.0%} ({o['warps_per_sm']} warps)",
                        ", ".join(o["limited_by"]))
            if o["note"]:
                notes.append(f"{r['arch']}: {o['note']}")
        out.append(res)
        for note in notes:
            out.append(Text(note, style="bold red"))
    elif ex["resources_note"]:
        out.append(Text(ex["resources_note"]))

    out += _roofline_items(ex)
    return out


def _roofline_items(ex: Mapping[str, Any]) -> list[Any]:
    """The roofline table, or one line saying why there is none (an empty product)."""
    from rich.table import Table
    from rich.text import Text

    g = ex["gpu"]
    if not ex["roofline"]:
        return [Text("no roofline: the product does no arithmetic (M, N or K is 0) to bound")]
    unit = ex.get("unit", "FLOP")
    peak = ex.get("peak") or f"{g['fp32_tflops']} TFLOP/s FP32, {g['fp64_tflops']} FP64"
    roof = Table(title=f"roofline on {g['name']} ({peak}, {g['bandwidth_tbs']} TB/s)")
    for col in ("bytes counted", "bytes", f"{unit}/byte", "bound", "limited by"):
        roof.add_column(col, overflow="fold")
    for name, b in ex["roofline"].items():
        label = ("every traced sector from DRAM" if name == "traced"
                 else "compulsory (perfect cache)")
        roof.add_row(label, _si(b["bytes"], "B"), _n(b["intensity"]),
                     _si(b["flops_per_s"], f"{unit}/s"), b["limited_by"])
    return [roof]


def to_json(ex: Mapping[str, Any]) -> dict[str, Any]:
    """The result with NumPy scalars turned into plain numbers."""
    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if isinstance(v, np.generic):
            return v.item()
        return v
    return clean(dict(ex))


def _check_beta_range(beta: float, dtype: np.dtype) -> None:
    """Refuse a beta the kernel's scalar cannot hold: an integer beyond the dtype failed
    inside the tracer (reported as a bug), and a float beyond it became infinity, so the
    traced launch was reported as computing a wrong result. Only whether beta is zero
    matters to the trace, so the advice is a small one."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not info.min <= beta <= info.max:
            raise InvalidValueError(f"beta {beta:g} does not fit {dtype.name} "
                                    f"({info.min}..{info.max}); only whether beta is zero "
                                    "matters to the trace: pass 1")
        return
    scalar = np.float32 if dtype.itemsize <= 2 else dtype.type  # 16-bit: float32 scalars
    with np.errstate(over="ignore"):
        finite = bool(np.isfinite(scalar(beta)))
    if not finite:
        raise InvalidValueError(f"beta {beta:g} overflows {np.dtype(scalar).name}; only "
                                "whether beta is zero matters to the trace: pass 1")
