"""NystromGaussianAttention (B=1, H=8, d=64, m=64 landmarks, fp32, 1 thread) -- time against sequence
length, and against onnxruntime's MultiHeadAttention (softmax, MLAS flash path: non-causal, unmasked).

    python -m bench.nystrom_gaussian_attention [--T 1024,2048,4096,8192,16384] [--m 64] [--quick]

Peers, interleaved per T (both through softdeploy.runtime.Session):
  nystrom   com.softdeploy NystromGaussianAttention, our native kernel (20 Newton-Schulz steps)
  mha       com.microsoft.MultiHeadAttention, Q = K (SOFT shares the projection), same V
  avx2      nystrom forced to its AVX2 variant (SOFTDEPLOY_ISA=avx2)
  body      the op's function body in stock onnxruntime (library not registered); `body/avx2` = body
            time / avx2 time (issue 13's floor: >= 1 at every T)
Landmarks: average pools of T / m consecutive query rows (SOFT's parameter-free choice), computed
outside the timed call. Floors of issue 15: time(T = 16384) <= 9x time(T = 2048) for nystrom (linear
in T: 8x); faster than mha from T = 4096 up; the crossover reported.
"""

from __future__ import annotations

from bench.harness import (
    Avx2VsBody,
    avx2_session,
    base_parser,
    body_session,
    fmt_num,
    fmt_time,
    header,
    int_list,
    md_table,
    quiet_bench,
    sync_print,
    threads,
)

# isort: split
import numpy as np

B, H, D = 1, 8, 64


def main() -> None:
    from softdeploy.ops import REGISTRY, Sample
    from softdeploy.runtime import Session
    from softdeploy_cases.attention_variants import mha_model

    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--T", type=int_list, default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--m", type=int, default=64)
    p.set_defaults(threads=[1], rounds=7)
    a = p.parse_args()
    header("NystromGaussianAttention vs MultiHeadAttention")
    sync_print("Shared, noisy machine: read the ratios of peers measured in the same interleaved rounds.\n")
    Avx2VsBody.print_variant()
    vs_body = Avx2VsBody("NystromGaussianAttention")
    op = REGISTRY["NystromGaussianAttention"]
    tiny = np.zeros((1, 1, 1, 1), np.float32)
    model = op.make_model(Sample("bench", (tiny, tiny, tiny)))
    mha = mha_model(heads=H, head_dim=D)  # the attention_variants case's peer (one definition)
    rows, times = [], {}
    for nt in a.threads:
        with threads(nt):
            ours = Session(model, kernels="native", threads=nt)
            mha_session = Session(mha, kernels="portable", threads=nt)
            avx2, body = avx2_session(model, nt), body_session(model, nt)
            for t in a.T:
                rng = np.random.default_rng(t)
                q = (rng.standard_normal((B, H, t, D)) * 0.5).astype(np.float32)
                v = rng.standard_normal((B, H, t, D)).astype(np.float32)
                lm = q.reshape(B, H, a.m, t // a.m, D).mean(axis=3).astype(np.float32)
                qm = q.transpose(0, 2, 1, 3).reshape(B, t, H * D).copy()
                vm = v.transpose(0, 2, 1, 3).reshape(B, t, H * D).copy()
                fns = {
                    "nystrom": lambda q=q, v=v, lm=lm: ours.run({"Q": q, "V": v, "Landmarks": lm}),
                    "mha": lambda qm=qm, vm=vm: mha_session.run({"q": qm, "k": qm, "v": vm}),
                    "avx2": lambda q=q, v=v, lm=lm: avx2.run({"Q": q, "V": v, "Landmarks": lm}),
                    "body": lambda q=q, v=v, lm=lm: body.run({"Q": q, "V": v, "Landmarks": lm}),
                }
                # each is held to the op's float32 tolerance (2e-4, 2e-4) of the float64 reference: twice it apart
                want = fns["body"]()[0]
                for peer in ("nystrom", "avx2"):
                    np.testing.assert_allclose(fns[peer]()[0], want, rtol=4e-4, atol=4e-4, err_msg=peer)
                timing, bg = quiet_bench(
                    fns, rounds=3 if a.quick else a.rounds, batch_ms=a.batch_ms, max_tries=a.tries, wait_s=a.quiet_wait
                )
                times[t] = {k: x.median for k, x in timing.items()}
                sync_print(f"  T={t}: " + ", ".join(f"{k} {fmt_time(x)}" for k, x in times[t].items()))
                rows.append(
                    [
                        str(t),
                        fmt_time(times[t]["nystrom"]),
                        fmt_time(times[t]["mha"]),
                        fmt_num(times[t]["mha"] / times[t]["nystrom"], 2),
                        fmt_time(times[t]["avx2"]),
                        fmt_time(times[t]["body"]),
                        vs_body.add(f"{nt} thr T={t}", times[t]["body"], times[t]["avx2"]),
                        fmt_num(bg, 2),
                    ]
                )
    sync_print(f"\n## {a.threads[0]} thread(s), m = {a.m}: time per call\n")
    sync_print(md_table(["T", "nystrom", "mha", "mha / nystrom", "avx2", "body", "body/avx2", "bg load"], rows))
    vs_body.print_summary()
    ts = sorted(times)
    if 2048 in times and 16384 in times:
        sync_print(
            f"\ntime(T=16384) / time(T=2048), nystrom: {times[16384]['nystrom'] / times[2048]['nystrom']:.2f}x "
            f"(linear: 8x); mha: {times[16384]['mha'] / times[2048]['mha']:.2f}x (quadratic: 64x)"
        )
    faster = [t for t in ts if times[t]["nystrom"] < times[t]["mha"]]
    sync_print(
        f"nystrom faster than mha at T in {faster} (crossover: first T where it is: {faster[0] if faster else '-'})"
    )


if __name__ == "__main__":
    main()
