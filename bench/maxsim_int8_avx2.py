"""MaxSim int8 on an AVX2 CPU without VNNI against onnxruntime's int8, speed and ranking in one run.

    python -m bench.maxsim_int8_avx2 --emulate-avx2 [--N 10000] [--Lq 32] [--Ld 180] [--dim 128] [--queries 5]
                                     [--real-ranking]

Shape of the issue: one query of Lq = 32 tokens against N = 10,000 documents of Ld = 180 tokens, dim 128, 1 thread.
Peers (interleaved rounds, medians; the documents stored ahead in each peer's own form):
  ort_int8              MatMulInteger(D u8 zp 128, Q^T s8) -> ReduceMax -> Cast -> ReduceSum -> Mul(scale), per-tensor
                        symmetric codes (bench/maxsim.py's peer); under --emulate-avx2 MLAS runs its u8s8 AVX2 kernel
  softdeploy_int8       MaxSim, quantize_tokens 8-bit codes (per-token scales): the sign-table tile (|D| x Q * sign(D))
  softdeploy_int8_7bit  8-bit queries, 7-bit documents: the vpmaddubsw tile on Q + 128
  softdeploy_int8_q7d7  7-bit queries and documents: the paired vpmaddubsw tile
  softdeploy_q7d7_rerank  softdeploy.models.retrieval.RerankedMaxSim: every document on 7-bit codes (the q7d7 tile),
                        the --candidates best re-scored in float32, the top 10 returned (selection included)
  softdeploy_fp32       MaxSim float32 (yardstick)
Ranking: top-10 overlap with the float64 scores (numpy) of each of --queries queries (seeds --first-seed on) against the same
documents, mean and minimum over the queries; the floor wants 100% at N = 10,000 with int8 >= 1.3x ort_int8.
--real-ranking adds bench/maxsim.py's top-10 agreement of each of our int8 forms with fp32 on real MiniLM token
vectors (chatterbot questions against their answers; the models extra).
"""

from __future__ import annotations

import numpy as np

from bench.harness import base_parser, header, md_table, ort_session, quiet_bench, sync_print, threads
from bench.maxsim import kernel_variants, make_data, onnx_models, quant_sym, softdeploy_session


def peers_for(Q: np.ndarray, D: np.ndarray, models: dict[str, bytes], coded: dict) -> dict:
    from softdeploy.ops import Sample
    from softdeploy.ops.max_sim import quantize_tokens

    Q8, sq = quant_sym(Q)
    sd, Du8 = coded["ort"]
    s = ort_session(models["ort_int8"], 1)
    feeds = {"Q8": Q8, "D8": Du8, "SCALE": np.array(sd * sq, np.float32)}
    out = {"ort_int8": lambda: s.run(None, feeds)[0]}
    reranked = coded["rerank"]

    def rerank() -> np.ndarray:  # the top 10 with their float32 scores, as a score vector for the overlap
        ids, scores = reranked.search(Q, 10)
        full = np.full(reranked.corpus.count, -np.inf, np.float32)
        full[ids] = scores
        return full

    (q8, qs), (q7, qs7) = quantize_tokens(Q[None]), quantize_tokens(Q[None], bits=7)
    (d8, ds), (d7, ds7) = coded["d8"], coded["d7"]
    for name, inputs in (
        ("softdeploy_int8", (q8, d8, None, None, qs, ds)),
        ("softdeploy_int8_7bit", (q8, d7, None, None, qs, ds7)),
        ("softdeploy_int8_q7d7", (q7, d7, None, None, qs7, ds7)),
        ("softdeploy_fp32", (Q[None], D)),
    ):
        sess, op = softdeploy_session(inputs, 1)
        f = op.feeds(Sample(name, inputs))
        out[name] = lambda s=sess, f=f: s.run(f)[0][0]
    out["softdeploy_q7d7_rerank"] = rerank
    return out


def main() -> None:
    from softdeploy.models.retrieval import RerankedMaxSim, TokenBank
    from softdeploy.ops.max_sim import quantize_tokens, unit_tokens

    p = base_parser(__doc__)
    p.add_argument("--N", type=int, default=10000)
    p.add_argument("--Lq", type=int, default=32)
    p.add_argument("--Ld", type=int, default=180)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--queries", type=int, default=5)
    p.add_argument("--candidates", type=int, default=100, help="the re-ranked peer's float32 candidates")
    p.add_argument("--first-seed", type=int, default=1, help="the ranking queries' seeds: this one and the next ones")
    p.add_argument("--real-ranking", action="store_true", help="also the top-10 agreement on MiniLM token vectors")
    args = p.parse_args()
    header("MaxSim int8 on AVX2 vs onnxruntime int8")
    f32_variant, i8_variant, _, _ = kernel_variants()
    sync_print(f"- our kernels: float {f32_variant}; int8 {i8_variant}")
    models = onnx_models(args.Lq, args.Ld, args.dim)
    Q, D = make_data(args.N, args.Lq, args.Ld, args.dim)
    D8, sd = quant_sym(D)
    coded = {
        "ort": (sd, (D8.astype(np.int16) + 128).astype(np.uint8)),
        "d8": quantize_tokens(D),
        "d7": quantize_tokens(D, bits=7),
        "rerank": RerankedMaxSim(TokenBank.from_ragged(list(D)), bits=7, candidates=args.candidates),
    }
    with threads(1):
        peers = peers_for(Q, D, models, coded)
        t, bg = quiet_bench(peers, rounds=args.rounds if not args.quick else 5, batch_ms=args.batch_ms, max_tries=1)
        ms = {k: v.median * 1e3 for k, v in t.items()}
        overlaps: dict[str, list[float]] = {k: [] for k in peers}
        D64 = D.reshape(-1, args.dim).astype(np.float64)
        for seed in range(args.first_seed, args.first_seed + args.queries):
            q = unit_tokens(np.random.default_rng(seed), args.Lq, args.dim)
            ref = (D64 @ q.astype(np.float64).T).reshape(args.N, args.Ld, args.Lq).max(1).sum(1)
            top = set(np.argsort(-ref)[:10])
            for k, f in peers_for(q, D, models, coded).items():
                overlaps[k].append(len(top & set(np.argsort(-np.asarray(f(), np.float64))[:10])) / 10)
    rows = []
    for k in peers:
        o = overlaps[k]
        rows.append(
            [
                k,
                f"{ms[k]:.2f}",
                f"{ms['ort_int8'] / ms[k]:.2f}x",
                f"{np.mean(o):.0%} (min {min(o):.0%})",
            ]
        )
    sync_print(f"\nN = {args.N}, Lq {args.Lq}, Ld {args.Ld}, dim {args.dim}, 1 thread; bg load {bg:.2f} cores\n")
    sync_print(md_table(["peer", "ms/call", "vs ort_int8", f"top-10 overlap with fp64 ({args.queries} queries)"], rows))
    if args.real_ranking:
        from bench.maxsim import ranking_agreement

        sync_print("\n" + ranking_agreement())


if __name__ == "__main__":
    main()
