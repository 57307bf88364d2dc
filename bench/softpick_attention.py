"""SoftpickAttention (B=1, H=8, D=64, fp32) -- softdeploy's flash-style kernel against onnxruntime's
MultiHeadAttention (softmax) and against our own decomposed function body.

    python -m bench.softpick_attention [--T 512,2048] [--memory-T 2048,8192] [--threads 1] [--quick]

Peers, all in the same interleaved rounds (every onnxruntime contender through softdeploy.runtime.Session):
  ours       com.softdeploy SoftpickAttention, our native kernel (flash-style, never the [T, T] scores)
  mha        com.microsoft.MultiHeadAttention (softmax): MLAS's flash path when fp32, non-causal and
             unmasked; unfused (the [T, T] scores) with a key padding mask or unidirectional=1
  body_f32   our function body as stock onnxruntime runs it, but in float32 (the body's Casts to
             double retargeted to float): the decomposed MatMul -> Softpick ops -> MatMul graph
  body       our function body as shipped (float64, like the reference), stock onnxruntime
  avx2       ours forced to its AVX2 variant (SOFTDEPLOY_ISA=avx2); `body/avx2` = body time / avx2 time
             (issue 13's floor: >= 1 at every shape)
Modes: none (no mask), padding (the last 25% of keys masked: Mask [B, 1, 1, T] of 0 / -inf for ours,
key_padding_mask for MHA), causal (causal=1 / unidirectional=1).
Peak memory: growth of the process's max RSS over one call, in a fresh subprocess per peer and T.
Floors of issue 15 (1 thread, medians): ours >= 1.0x mha at T = 2048 non-causal, >= 3x its own
decomposed body, within 1.3x of mha with a padding mask or causal; peak memory growth from T = 2048
to 8192 <= 5x (not 16x).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.harness import (
    Avx2VsBody,
    avx2_session,
    base_parser,
    fmt_num,
    fmt_time,
    header,
    int_list,
    md_table,
    quiet_bench,
    str_list,
    sync_print,
    threads,
)

# isort: split
import numpy as np

B, H, D = 1, 8, 64
MODES = ("none", "padding", "causal")
PEERS = ("ours", "avx2", "mha", "body_f32", "body")


def _ours_model(mode: str, body_dtype: str | None = None):
    """One SoftpickAttention node (with its function body); body_dtype="float32" retargets the body's
    Casts to double (the float32 decomposed graph)."""
    from onnx import TensorProto

    from softdeploy.ops import REGISTRY, Sample

    op = REGISTRY["SoftpickAttention"]
    tiny = np.zeros((1, 1, 1, 1), np.float32)
    inputs = (tiny, tiny, tiny, tiny if mode == "padding" else None)
    model = op.make_model(Sample("bench", inputs, {"causal": int(mode == "causal")}))
    if body_dtype == "float32":

        def retarget(nodes) -> None:
            for node in nodes:
                for a in node.attribute:
                    if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.DOUBLE:
                        a.i = TensorProto.FLOAT
                    if a.g.node:
                        retarget(a.g.node)

        for f in model.functions:
            retarget(f.node)
    return model


def _mha_model(mode: str, t: int):
    # the same peer as the attention_variants compare case's latency sweep (one definition)
    from softdeploy_cases.attention_variants import mha_model

    return mha_model(mode, t, heads=H, head_dim=D)


def _feeds(mode: str, t: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, H, t, D)).astype(np.float32) for _ in range(3))
    ours = {"Q": q, "K": k, "V": v}
    mha = {n: x.transpose(0, 2, 1, 3).reshape(B, t, H * D).copy() for n, x in zip("qkv", (q, k, v), strict=True)}
    if mode == "padding":
        keep = np.ones((B, t), np.int32)
        keep[:, (3 * t) // 4 :] = 0
        ours["Mask"] = np.where(keep[:, None, None, :] == 1, 0.0, -np.inf).astype(np.float32)
        mha["kpm"] = keep
    return ours, mha


def _session(peer: str, mode: str, t: int, nt: int):
    from softdeploy.runtime import Session

    if peer == "ours":
        return Session(_ours_model(mode), kernels="native", threads=nt)
    if peer == "avx2":
        return avx2_session(_ours_model(mode), nt)
    if peer == "mha":
        return Session(_mha_model(mode, t), kernels="portable", threads=nt)
    if peer == "body_f32":
        return Session(_ours_model(mode, "float32"), kernels="portable", threads=nt)
    return Session(_ours_model(mode), kernels="portable", threads=nt)


_PEAK = """
import ctypes, json, sys
import bench.softpick_attention as b
def status_kb(key):  # from /proc/self/status (ru_maxrss would carry the parent's peak over fork)
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])
peer, mode, t = sys.argv[1], sys.argv[2], int(sys.argv[3])
sess = b._session(peer, mode, t, 1)
ours, mha = b._feeds(mode, t)
feeds = mha if peer == "mha" else ours
# The peak left by building the session and the feeds (freed temporaries) would hide the call's own
# allocations under the high-water mark: give free heap back to the kernel, reset VmHWM to the current
# RSS (Linux >= 4.0: "5" > /proc/PID/clear_refs), and count the call's peak above the RSS it starts from.
ctypes.CDLL("libc.so.6").malloc_trim(0)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status_kb("VmRSS:")
sess.run(feeds)
after = status_kb("VmHWM:")
print(json.dumps({"growth_mb": (after - before) / 1024, "peak_mb": after / 1024}))
"""


def peak_growth_mb(peer: str, mode: str, t: int) -> tuple[float, float] | None:
    """(growth of max RSS over the call, max RSS after it), MB."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # `python -c` imports bench from its cwd
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, peer, mode, str(t)], capture_output=True, text=True, env=env, cwd=root
    )
    if out.returncode != 0:
        sync_print(f"  (peak {peer} {mode} T={t} failed: {out.stderr.strip().splitlines()[-1:]})")
        return None
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["growth_mb"], r["peak_mb"]


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--T", type=int_list, default=[512, 2048])
    p.add_argument("--memory-T", type=int_list, default=[2048, 8192])
    p.add_argument("--modes", type=str_list, default=list(MODES))
    p.add_argument("--peers", type=str_list, default=list(PEERS))
    p.add_argument("--memory-only", action="store_true", help="only the peak-memory table")
    p.set_defaults(threads=[1], rounds=9)
    a = p.parse_args()
    header("SoftpickAttention vs MultiHeadAttention and the decomposed body")
    Avx2VsBody.print_variant()
    vs_body = Avx2VsBody("SoftpickAttention")
    sync_print(
        "The machine is shared and noisy (2 cores, several jobs): read the RATIOS of peers measured in the same "
        "interleaved rounds, not the absolute times.\n"
    )
    for nt in [] if a.memory_only else a.threads:
        rows = []
        with threads(nt):
            for t in a.T:
                for mode in a.modes:
                    ours_feeds, mha_feeds = _feeds(mode, t)
                    fns = {}
                    for peer in a.peers:
                        sess = _session(peer, mode, t, nt)
                        feeds = mha_feeds if peer == "mha" else ours_feeds
                        fns[peer] = lambda s=sess, f=feeds: s.run(f)
                    # agreement first: ours against our body (float64) -- the same op
                    if "body" in fns and t <= 2048:
                        np.testing.assert_allclose(fns["ours"]()[0], fns["body"]()[0], rtol=1e-4, atol=1e-4)
                    timings, bg = quiet_bench(
                        fns,
                        rounds=3 if a.quick else a.rounds,
                        batch_ms=a.batch_ms,
                        max_tries=a.tries,
                        wait_s=a.quiet_wait,
                    )
                    base = timings["ours"].median
                    cells = [str(t), mode]
                    for peer in PEERS:
                        tm = timings.get(peer)
                        cells.append("-" if tm is None else f"{fmt_time(tm.median)} (x{fmt_num(tm.median / base, 2)})")
                    if "body" in timings and "avx2" in timings:
                        label = f"{nt} thr T={t} {mode}"
                        cells.append(vs_body.add(label, timings["body"].median, timings["avx2"].median))
                    else:
                        cells.append("-")
                    cells.append(fmt_num(bg, 2))
                    rows.append(cells)
                    sync_print(f"  T={t} {mode}: " + ", ".join(f"{k} {fmt_time(v.median)}" for k, v in timings.items()))
        sync_print(f"\n## {nt} thread(s): time per call (x = time / ours; > 1 means ours is faster)\n")
        sync_print(md_table(["T", "mode", *PEERS, "body/avx2", "bg load"], rows))
    vs_body.print_summary()
    sync_print("\n## Peak memory: growth of max RSS over one call (MB), fresh process per cell\n")
    mem_rows = []
    for mode in ("none", "causal"):
        for peer in ("ours", "mha"):
            g = [peak_growth_mb(peer, mode, t) for t in a.memory_T]
            cells = ["-" if x is None else f"+{x[0]:.1f} (peak {x[1]:.0f})" for x in g]
            ok = None not in g and g[0][0] > 1.0
            growth = f"{g[-1][0] / g[0][0]:.1f}x" if ok else "-"
            mem_rows.append([peer, mode, *cells, growth])
    heads = [f"T={t}" for t in a.memory_T]
    sync_print(
        f"[T, T] float32 scores of one head: {', '.join(f'T={t}: {t * t * 4 / 2**20:.0f} MB' for t in a.memory_T)}; "
        f"all {H} heads: x{H}. '-' growth: the first call grew the RSS by <= 1 MB.\n"
    )
    sync_print(md_table(["peer", "mode", *heads, f"growth T={a.memory_T[0]}->{a.memory_T[-1]}"], mem_rows))


if __name__ == "__main__":
    main()
