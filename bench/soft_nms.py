"""SoftNMS kernel vs a NumPy Soft-NMS and onnxruntime's own (hard) NonMaxSuppression, same run.

    python -m bench.soft_nms [--N 100,1000,5000] [--threads 1] [--quick]

Peers (started from shared/notes/perf/soft_nms.py):
  numpy_soft_nms   Gaussian Soft-NMS (sigma 0.5, score threshold 1e-3), the classic loop with the IoU of one
                   box against the rest vectorised per step (O(N^2) work, N numpy steps)
  ort_hard_nms     ai.onnx.NonMaxSuppression in stock onnxruntime (IoU 0.5, score threshold 0, no limit)
  sd_gaussian      softdeploy SoftNMS, method="gaussian", sigma 0.5, score threshold 1e-3 (the numpy peer's job)
  sd_linear        softdeploy SoftNMS, method="linear", IoU 0.3 (the op's default)
  sd_hard          softdeploy SoftNMS, method="hard", IoU 0.5 (ort_hard_nms's job; checked to select the same boxes)
  sd_*_avx2        the same kernel forced to its AVX2 variant (SOFTDEPLOY_ISA=avx2), each method
  sd_*_body        the same model's function body in stock onnxruntime (library not registered); issue 13's
                   floor: body / avx2 >= 1 at every N and method
Boxes: N boxes in N/20 clusters (jitter 10 px, sides 20..100 px) on a 1000x1000 image, uniform scores; seed 0.
One (batch, class): the kernel threads over (batch, class) pairs, so a single pair runs on one thread.
Floors (issue): sd_gaussian >= 50x faster than numpy_soft_nms; sd_gaussian within 3x of ort_hard_nms at N >= 1000.
"""

from __future__ import annotations

import numpy as np

from bench.harness import (
    Avx2VsBody,
    avx2_session,
    base_parser,
    fmt_num,
    header,
    int_list,
    md_table,
    ort_session,
    quiet_bench,
    sync_print,
    threads,
    wait_quiet,
)

SIGMA = 0.5
SCORE_THRESHOLD = 1e-3
HARD_IOU = 0.5


def make_boxes(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[N, 4] boxes (x1 y1 x2 y2) and [N] scores, as in shared/notes/perf/soft_nms.py."""
    rng = np.random.default_rng(seed)
    k = max(1, n // 20)
    centers = rng.uniform(50, 950, (k, 2))
    c = centers[rng.integers(0, k, n)] + rng.normal(0, 10, (n, 2))
    wh = rng.uniform(20, 100, (n, 2))
    boxes = np.concatenate([c - wh / 2, c + wh / 2], axis=1).astype(np.float32)
    scores = rng.uniform(0, 1, n).astype(np.float32)
    return boxes, scores


def numpy_soft_nms(boxes: np.ndarray, scores: np.ndarray, sigma: float = SIGMA, score_thresh: float = SCORE_THRESHOLD):
    """Returns (indices into the input, in selection order, and their decayed scores)."""
    b = boxes.astype(np.float32).copy()
    s = scores.astype(np.float32).copy()
    idx = np.arange(len(s))
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    i = 0
    while i < len(s):
        j = i + int(np.argmax(s[i:]))
        if j != i:  # swap the best remaining box into position i
            b[[i, j]] = b[[j, i]]
            s[[i, j]] = s[[j, i]]
            idx[[i, j]] = idx[[j, i]]
            area[[i, j]] = area[[j, i]]
        r = slice(i + 1, None)
        xx1 = np.maximum(b[i, 0], b[r, 0])
        yy1 = np.maximum(b[i, 1], b[r, 1])
        xx2 = np.minimum(b[i, 2], b[r, 2])
        yy2 = np.minimum(b[i, 3], b[r, 3])
        inter = np.clip(xx2 - xx1, 0, None) * np.clip(yy2 - yy1, 0, None)
        iou = inter / (area[i] + area[r] - inter)
        s[r] *= np.exp(-(iou * iou) / sigma)
        keep = s[r] >= score_thresh
        if not keep.all():  # drop boxes whose score fell under the threshold
            k = np.concatenate([np.ones(i + 1, bool), keep])
            b, s, idx, area = b[k], s[k], idx[k], area[k]
        i += 1
    return idx, s


def ort_nms_model(iou: float) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.array([2**31 - 1], np.int64), "MAXOUT"),
        numpy_helper.from_array(np.array([iou], np.float32), "IOU"),
        numpy_helper.from_array(np.array([0.0], np.float32), "ST"),
    ]
    g = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["B", "S", "MAXOUT", "IOU", "ST"], ["SEL"], center_point_box=0)],
        "nms",
        [
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [1, "N", 4]),
            helper.make_tensor_value_info("S", TensorProto.FLOAT, [1, 1, "N"]),
        ],
        [helper.make_tensor_value_info("SEL", TensorProto.INT64, ["K", 3])],
        initializer=inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def soft_nms_session(method: str, iou: float, score_threshold: float, n_threads: int, kernels: str = "native"):
    """A softdeploy session running SoftNMS with thresholds baked in as initializers: the native kernel
    (``kernels="native"``), its AVX2 variant (``"avx2"``) or its function body in stock onnxruntime
    (``"portable"``)."""
    from onnx import TensorProto, helper, numpy_helper

    from softdeploy import DOMAIN, OPSET_VERSION
    from softdeploy.ops.functions import attach_function_bodies
    from softdeploy.runtime import Session

    inits = [
        numpy_helper.from_array(np.array([0], np.int64), "MAXOUT"),
        numpy_helper.from_array(np.array([iou], np.float32), "IOU"),
        numpy_helper.from_array(np.array([score_threshold], np.float32), "ST"),
    ]
    node = helper.make_node(
        "SoftNMS", ["B", "S", "MAXOUT", "IOU", "ST"], ["SEL", "SCORES"], domain=DOMAIN, method=method, sigma=SIGMA
    )
    g = helper.make_graph(
        [node],
        "soft_nms",
        [
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [1, "N", 4]),
            helper.make_tensor_value_info("S", TensorProto.FLOAT, [1, 1, "N"]),
        ],
        [
            helper.make_tensor_value_info("SEL", TensorProto.INT64, ["K", 3]),
            helper.make_tensor_value_info("SCORES", TensorProto.FLOAT, ["K"]),
        ],
        initializer=inits,
    )
    model = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)],
        ir_version=10,
    )
    model = attach_function_bodies(model)
    if kernels == "avx2":
        return avx2_session(model, n_threads)
    return Session(model, kernels=kernels, threads=n_threads)


def iou_pairs(n_boxes: int, boxes: np.ndarray, scores: np.ndarray, method: str, iou: float, thr: float) -> int:
    """IoU evaluations the swap loop makes (sum over rounds of the rows left): the work measure."""
    from softdeploy.ops.soft_nms import box_areas, box_extents, decay_weights

    ext = box_extents(boxes[:, [1, 0, 3, 2]], 0)  # our convention is [y1, x1, y2, x2]
    area = box_areas(ext, np.float32(0))
    s = scores.copy()
    keep = np.flatnonzero(s >= np.float32(thr))
    e, a, s = ext[keep], area[keep], s[keep]
    pairs = 0
    while len(s):
        m = int(np.argmax(s))
        rest = np.ones(len(s), bool)
        rest[m] = False
        w = decay_weights(e[m], a[m], e[rest], a[rest], np.float32(0), method, np.float32(iou), np.float32(SIGMA))
        pairs += int(rest.sum())
        s_new = s[rest] * w
        alive = s_new >= np.float32(thr)
        e, a, s = e[rest][alive], a[rest][alive], s_new[alive]
    return pairs


def main() -> None:
    p = base_parser(__doc__ or "")
    p.set_defaults(threads=[1])
    p.add_argument("--N", type=int_list, default=[100, 1000, 5000])
    args = p.parse_args()
    rounds = 5 if args.quick else args.rounds
    header("SoftNMS vs NumPy Soft-NMS and onnxruntime NonMaxSuppression")
    Avx2VsBody.print_variant()
    vs_body = Avx2VsBody("SoftNMS")
    vs_rows = []
    nms_model = ort_nms_model(HARD_IOU)
    rows, checks, floors = [], [], []
    for nt in args.threads:
        bg = wait_quiet(args.quiet_wait)
        sync_print(f"- {nt} thread(s): other processes' load before block: {bg:.2f} cores")
        configs = {
            "sd_gaussian": ("gaussian", 0.3, SCORE_THRESHOLD),
            "sd_linear": ("linear", 0.3, SCORE_THRESHOLD),
            # score threshold just above 0: "hard" sets suppressed scores to 0, ORT's keeps score > 0
            "sd_hard": ("hard", HARD_IOU, 1e-30),
        }
        sd = {}
        for name, cfg in configs.items():
            for suffix, kernels in (("", "native"), ("_avx2", "avx2"), ("_body", "portable")):
                sd[name + suffix] = soft_nms_session(*cfg, nt, kernels)
        for n in args.N:
            boxes_xyxy, scores = make_boxes(n)
            boxes_yxyx = boxes_xyxy[:, [1, 0, 3, 2]]  # NonMaxSuppression / SoftNMS corner order
            nms_feeds = {"B": boxes_yxyx[None], "S": scores[None, None]}
            with threads(nt):
                ort_nms = ort_session(nms_model, nt)
                peers = {
                    "numpy_soft_nms": lambda b=boxes_xyxy, s=scores: numpy_soft_nms(b, s),
                    "ort_hard_nms": lambda s=ort_nms, f=nms_feeds: s.run(None, f),
                    **{name: (lambda s=sess, f=nms_feeds: s.run(f)) for name, sess in sd.items()},
                }
                np_idx, _ = peers["numpy_soft_nms"]()
                ort_sel = peers["ort_hard_nms"]()[0][:, 2]
                g_rows, _ = peers["sd_gaussian"]()
                h_rows, _ = peers["sd_hard"]()
                for name in configs:  # the AVX2 variant and the body select what the kernel selects
                    want_rows = peers[name]()[0]
                    for other in (f"{name}_avx2", f"{name}_body"):
                        if not np.array_equal(peers[other]()[0], want_rows):
                            raise SystemExit(f"{other} selects other boxes than {name} at N={n}")
                if nt == args.threads[0]:
                    same_set = len(set(np_idx.tolist()) ^ set(g_rows[:, 2].tolist()))
                    checks.append(
                        (
                            n,
                            len(g_rows),
                            len(np_idx),
                            f"{same_set} boxes differ" if same_set else "same boxes",
                            "identical" if np.array_equal(h_rows[:, 2], ort_sel) else "DIFFER",
                            fmt_num(iou_pairs(n, boxes_xyxy, scores, "gaussian", 0.3, SCORE_THRESHOLD) / 1e6, 2),
                        )
                    )
                t, bgc = quiet_bench(peers, rounds=rounds, batch_ms=args.batch_ms, max_tries=args.tries)
            for name, tm in t.items():
                rows.append([nt, n, name, fmt_num(tm.median * 1e3, 3), f"{tm.spread:.0%}", f"{bgc:.1f}"])
            g = t["sd_gaussian"].median
            vs_numpy = t["numpy_soft_nms"].median / g
            vs_ort = g / t["ort_hard_nms"].median
            floors.append(
                [
                    nt,
                    n,
                    f"{vs_numpy:.0f}x",
                    "met" if vs_numpy >= 50 else "NOT MET",
                    f"{vs_ort:.2f}x",
                    ("met" if vs_ort <= 3 else "NOT MET") if n >= 1000 else "(no floor)",
                    f"{t['sd_hard'].median / t['ort_hard_nms'].median:.2f}x",
                ]
            )
            vs_rows.append(
                [nt, n]
                + [
                    f"{fmt_num(t[name + '_body'].median * 1e3, 3)} / {fmt_num(t[name + '_avx2'].median * 1e3, 3)} = "
                    + vs_body.add(f"{nt} thr N={n} {name}", t[name + "_body"].median, t[name + "_avx2"].median)
                    for name in configs
                ]
            )
            sync_print(f"  done nt={nt} N={n}")
    sync_print("\n" + md_table(["thr", "N boxes", "peer", "ms/call", "spread", "bg load"], rows))
    sync_print(
        "\n"
        + md_table(
            [
                "thr",
                "N",
                "numpy Soft-NMS / sd_gaussian",
                "floor >= 50x",
                "sd_gaussian / ORT hard NMS",
                "floor <= 3x",
                "sd_hard / ORT hard NMS",
            ],
            floors,
        )
    )
    sync_print(
        "\n"
        + md_table(
            [
                "N",
                "sd_gaussian kept",
                "numpy kept",
                "gaussian: sd vs numpy",
                "sd_hard vs ORT NMS",
                "IoU pairs (M, gaussian)",
            ],
            checks,
        )
    )
    sync_print("\nIssue 13: function body in stock onnxruntime / AVX2 variant, ms per call (body / avx2 = ratio):\n")
    sync_print(md_table(["thr", "N", *[f"{name}: body / avx2" for name in configs]], vs_rows))
    vs_body.print_summary()


if __name__ == "__main__":
    main()
