"""Soft thinking end to end: the generation loop on onnxruntime against torch eager, fp32 against int8, soft against
discrete decoding, and the loop's own overhead per step.

Model: softdeploy_cases.soft_thinking's QA decoder (a 3-layer LlamaForCausalLM trained here on chatterbot-corpus,
``<bos> q <think> #topic keys </think> answer <eos>``; cached after the first run). Prompts: every 32nd question of
the corpus (64 questions; the first 8 for the agreement and speed runs).

    python bench/generate.py [--quick] [--rounds 5] [--out bench/results/generate.md]

Prints markdown (and writes it to --out). Timings are medians over interleaved rounds (peers run in turn each round);
per-step graph / loop times are medians over the steps of a run, then over rounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle workers must not spin on the 2 shared cores

import numpy as np


def cpu_line() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    isa = [
        name for flag, name in (("avx512f", "AVX-512 F"), ("avx512_vnni", "VNNI"), ("avx2", "AVX2")) if flag in flags
    ]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{model} ({' + '.join(isa[:2]) if isa else 'no AVX-512'}), {os.cpu_count()} cores shared with other jobs "
        f"(load average {load:.1f} at the start)"
    )


def first_divergence(a: list[int], b: list[int]) -> int:
    """The first step at which two traces differ (len of the shorter when one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else -1


def agreement(a, b) -> tuple[int, int, str]:
    """(identical rows, rows, first divergence steps of the others)."""
    firsts = [first_divergence(x, y) for x, y in zip(a.tokens, b.tokens, strict=True)]
    same = sum(f == -1 for f in firsts)
    return same, len(firsts), ", ".join(str(f) for f in firsts if f != -1) or "-"


class _Recorder:
    """Wraps a runtime call (a Session's ``run`` or a bound op run): records copies of its outputs."""

    def __init__(self, fn) -> None:
        self.fn, self.outputs = fn, []

    def __call__(self, *args):
        out = self.fn(*args)
        self.outputs.append([np.array(a, copy=True) for a in out])
        return out


class _Player:
    """Stands in for a recorded runtime call: returns the recorded outputs in order, computing nothing."""

    def __init__(self, outputs) -> None:
        self.outputs, self.i = outputs, 0

    def __call__(self, *args):
        self.i += 1
        return self.outputs[self.i - 1]


def replay_backend(base):
    """An OrtBackend whose runtime calls can be recorded once and then replayed: the replayed run does all of the
    loop's and the backend's own work (feeds, copies, bookkeeping, noise) but no graph."""
    from softdeploy.generate import OrtBackend

    class Replay(OrtBackend):
        def __init__(self) -> None:
            self.__dict__.update(base.__dict__)
            self.mode_ = "record"
            self.rec: dict[str, list] = {}

        def _wrap(self, name, fn):
            if self.mode_ == "record":
                r = _Recorder(fn)
                self.rec[name] = r.outputs
                return r
            return _Player(self.rec[name])

        def configure(self, attrs, batch, with_noise):
            noise = super().configure(attrs, batch, with_noise)
            real = self._bound
            wrapped = self._wrap("op", real)

            class Bound:
                inputs = real.inputs

                def __call__(self):
                    return wrapped()

            self._bound = Bound()
            return noise

        def prefill(self, *a):
            sess = self._prefill
            self._prefill = type("S", (), {"run": staticmethod(self._wrap("prefill", sess.run))})()
            try:
                return super().prefill(*a)
            finally:
                self._prefill = sess

        def start_steps(self):
            self._real_step = getattr(self, "_real_step", self._step)
            self._step = type("S", (), {"run": staticmethod(self._wrap("step", self._real_step.run))})()

    return Replay()


def loop_overhead(base, prompts, soft, dec, seed: int, rounds: int) -> tuple[float, float]:
    """(median seconds per decode step of the real run, of the replayed run): interleaved rounds, medians over the
    steps of each run, then over rounds."""
    from softdeploy.generate import generate

    rb = replay_backend(base)
    real, replay = [], []
    for _ in range(rounds):
        rb.mode_ = "record"
        rb.start_steps()
        r = generate(rb, prompts, soft_thinking=soft, decoding=dec, seed=seed)
        real.append(float(np.median(r.step_graph_seconds + r.step_loop_seconds)))
        rb.mode_ = "replay"
        rb.start_steps()
        q = generate(rb, prompts, soft_thinking=soft, decoding=dec, seed=seed)
        assert q.tokens == r.tokens  # the replay made the same decisions
        replay.append(float(np.median(q.step_graph_seconds + q.step_loop_seconds)))
    return statistics.median(real), statistics.median(replay)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer rounds and seeds (smoke test)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--out", default=None, help="also write the markdown here")
    args = p.parse_args()
    rounds = 2 if args.quick else args.rounds
    seeds = (0, 1) if args.quick else (0, 1, 2, 3, 4)

    import torch

    torch.set_num_threads(1)
    from softdeploy.cache import cache_root
    from softdeploy.export.decoder import DecoderExport, export_decoder
    from softdeploy.generate import Decoding, OrtBackend, SoftThinking, TorchBackend, generate
    from softdeploy.quant.quantize import quantize
    from softdeploy.runtime import library_status
    from softdeploy_cases.soft_thinking import EOS, THINK_END, trained_model

    lines: list[str] = []

    def out(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    out("# Soft thinking: generation loop on onnxruntime vs torch eager, fp32 vs int8, soft vs discrete")
    out()
    status = library_status()
    variant = status.info.isa_summary() if status.info is not None else "library not found"
    out(f"CPU: {cpu_line()}; onnxruntime 1 thread, torch 1 thread; kernel variant: {variant}.")
    out(f"Command: `python bench/generate.py{' --quick' if args.quick else ''}` ({time.strftime('%Y-%m-%d')}).")
    out()
    t0 = time.perf_counter()
    model, data, cached = trained_model()
    out(
        f"Model: 3-layer LlamaForCausalLM (width 128, vocab {len(data.vocab)}), trained on chatterbot-corpus "
        f"({'from the cache' if cached else f'trained in {time.perf_counter() - t0:.0f} s'}). "
        "`</think>` is token id 4 of its vocabulary."
    )
    folder = cache_root() / "soft_thinking" / "bench-export"
    if (folder / "decoder.json").is_file():
        export = DecoderExport.load(folder)
    else:
        export = export_decoder(model, folder, overwrite=True)
    worst = max(export.max_error.values())
    out(
        f"Decoder export: prefill + step graphs, worst |onnxruntime - torch| at validation {worst:.2g} (logits, cache)."
    )
    int8_step = folder / "step.int8.onnx"
    made = quantize(export.step, int8_step)
    out(
        f"int8 step graph: `softdeploy quantize` dynamic per-channel, {len(made.quantized_nodes)} MatMul nodes int8 "
        f"(target {made.target or 'default'}); the prefill graph stays fp32."
    )
    out()

    questions = data.triples[::32][:64]
    prompts8 = [data.prompt(q) for _, q, _ in questions[:8]]
    ort32 = OrtBackend(export)
    ort8 = OrtBackend(export, step=int8_step)
    eager = TorchBackend(model, threads=1)

    soft_plain = SoftThinking(think_end_id=THINK_END, early_stopping_length=0)
    soft_gumbel = SoftThinking(think_end_id=THINK_END, noise="gumbel", tau=0.5, early_stopping_length=0)
    no_eos = Decoding(max_new_tokens=args.steps)  # every row runs all steps
    sampled = Decoding(max_new_tokens=args.steps, sample=True, temperature=0.8)
    configs = [
        ("discrete greedy", None, no_eos, (0,)),
        ("soft, no noise, greedy answer", soft_plain, no_eos, (0,)),
        ("soft, Gumbel tau 0.5, greedy answer", soft_gumbel, no_eos, seeds),
        ("soft, Gumbel tau 0.5, sampled answer (T 0.8)", soft_gumbel, sampled, seeds),
    ]

    out(f"## onnxruntime (native kernels) vs torch eager: {args.steps} steps, 8 rows, fp32, end-of-sequence off")
    out()
    out("Same loop, same noise stream (seeded numpy Generator): identical ids expected while the logits agree.")
    out()
    out("| decoding | seeds | identical rows | first divergence (step) of the others |")
    out("|---|---|---|---|")
    floor_same = floor_rows = 0
    for name, soft, dec, ss in configs:
        same = rows = 0
        divs = []
        for s in ss:
            a = generate(ort32, prompts8, soft_thinking=soft, decoding=dec, seed=s)
            b = generate(eager, prompts8, soft_thinking=soft, decoding=dec, seed=s)
            k, n, d = agreement(a, b)
            same, rows = same + k, rows + n
            if d != "-":
                divs.append(d)
        floor_same, floor_rows = floor_same + same, floor_rows + rows
        out(f"| {name} | {len(ss)} | {same}/{rows} | {'; '.join(divs) or '-'} |")
    out()

    out(f"## fp32 vs int8 step graph (onnxruntime): {args.steps} steps, 8 rows, end-of-sequence off")
    out()
    out("| decoding | seeds | identical rows | first divergence (step) of the others |")
    out("|---|---|---|---|")
    for name, soft, dec, ss in configs:
        same = rows = 0
        divs = []
        for s in ss:
            a = generate(ort32, prompts8, soft_thinking=soft, decoding=dec, seed=s)
            b = generate(ort8, prompts8, soft_thinking=soft, decoding=dec, seed=s)
            k, n, d = agreement(a, b)
            same, rows = same + k, rows + n
            if d != "-":
                divs.append(d)
        out(f"| {name} | {len(ss)} | {same}/{rows} | {'; '.join(divs) or '-'} |")
    out()

    out("## The task the model was trained on (64 training questions; memorisation, not reasoning)")
    out()
    out(
        "Topic: the first thinking token is the question's `#topic` tag. Answer: the ids after `</think>` up to "
        "`<eos>` equal the corpus answer. Greedy answers, end-of-sequence on, 48 steps."
    )
    out()
    out("| variant | decoding | topic tag | answer exact | thinking ended by `</think>` |")
    out("|---|---|---|---|---|")
    ids = data.ids
    from softdeploy_cases.soft_thinking import words

    all_prompts = [data.prompt(q) for _, q, _ in questions]
    refs = [[ids[w] for w in words(a)] + [EOS] for _, _, a in questions]
    topics = [ids["#" + t] for t, _, _ in questions]
    dec48 = Decoding(max_new_tokens=48, eos_token_ids=(EOS,))
    for label, backend in (("fp32", ort32), ("int8 step", ort8)):
        for name, soft in (("discrete", None), ("soft, no noise", soft_plain), ("soft, Gumbel tau 0.5", soft_gumbel)):
            r = generate(backend, all_prompts, soft_thinking=soft, decoding=dec48, seed=0)
            topic = exact = ended = 0
            for toks, ref, tag in zip(r.tokens, refs, topics, strict=True):
                topic += bool(toks) and toks[0] == tag
                if THINK_END in toks:
                    ended += 1
                    exact += toks[toks.index(THINK_END) + 1 :] == ref
            n = len(all_prompts)
            out(f"| {label} | {name} | {topic}/{n} | {exact}/{n} | {ended}/{n} |")
    out()

    out(f"## Speed: decode tokens/s and the loop's own time per step ({args.steps} steps, end-of-sequence off)")
    out()
    out(
        "Graph: time inside the runtime calls (step graph + SoftTokenEmbedding), median per step. Loop: the rest of "
        "a step (bookkeeping, embedding gathers, mask, noise draw, the backends' Python around their calls), median "
        f"per step. Medians over {rounds} interleaved rounds. Overhead = loop / (graph + loop)."
    )
    out()
    out("| batch | backend | decoding | tokens/s | graph ms/step | loop us/step | overhead | noise us/step |")
    out("|---|---|---|---|---|---|---|---|")
    peers = [
        ("onnxruntime fp32", ort32),
        ("onnxruntime int8 step", ort8),
        ("torch eager", eager),
    ]
    modes = [("discrete", None), ("soft", soft_plain), ("soft + Gumbel", soft_gumbel)]
    floor_overhead = inrun_overhead = None
    for batch in (1, 8):
        prompts = [data.prompt(q) for _, q, _ in questions[:batch]]
        stats: dict[tuple[str, str], list] = {}
        for r_i in range(rounds):
            order = [(pn, pb, mn, ms) for pn, pb in peers for mn, ms in modes]
            order = order[r_i % len(order) :] + order[: r_i % len(order)]
            for pn, pb, mn, ms in order:
                if pn == "torch eager" and r_i >= 2:
                    continue  # the slow peer: two rounds
                r = generate(pb, prompts, soft_thinking=ms, decoding=no_eos, seed=r_i)
                stats.setdefault((pn, mn), []).append(
                    (
                        r.new_tokens / r.decode_seconds,
                        float(np.median(r.step_graph_seconds)),
                        float(np.median(r.step_loop_seconds)),
                        r.noise_seconds / r.steps,
                    )
                )
        for pn, _ in peers:
            for mn, _ in modes:
                v = stats[(pn, mn)]
                tps = statistics.median(x[0] for x in v)
                g = statistics.median(x[1] for x in v)
                lp = statistics.median(x[2] for x in v)
                nz = statistics.median(x[3] for x in v)
                share = lp / (g + lp)
                if batch == 1 and pn == "onnxruntime fp32" and mn == "soft + Gumbel":
                    inrun_overhead = share
                out(
                    f"| {batch} | {pn} | {mn} | {tps:.0f} | {g * 1e3:.3f} | {lp * 1e6:.0f} | {share:.1%} | "
                    f"{nz * 1e6:.0f} |"
                )
    out()
    out("## The loop's own overhead per step (graphs replayed)")
    out()
    out(
        "Each round runs the loop for real, recording every runtime call's outputs, then runs it again with the runtime "
        "calls replaced by the recorded outputs (same decisions, checked): the replayed step costs everything except "
        "the graphs -- bookkeeping, feeds and copies, the backend's Python, noise (softdeploy.runtime.Session.run's own few microseconds of Python are replayed with the graph). Medians over the steps of a run, "
        f"then over {max(rounds, 5)} rounds; 8 prompts of the corpus."
    )
    out()
    out("| batch | decoding | step (real) us | step (replayed) us | overhead |")
    out("|---|---|---|---|---|")
    for batch in (1, 8):
        prompts = [data.prompt(q) for _, q, _ in questions[:batch]]
        for mn, ms in modes:
            real, replay = loop_overhead(ort32, prompts, ms, no_eos, 0, max(rounds, 5))
            share = replay / real
            if batch == 1 and mn == "soft + Gumbel":
                floor_overhead = share
            out(f"| {batch} | {mn} | {real * 1e6:.0f} | {replay * 1e6:.1f} | {share:.1%} |")
    out()
    out("## Floors")
    out()
    out("| floor | value | target | met |")
    out("|---|---|---|---|")
    out(
        f"| onnxruntime and torch eager: same token trace, {args.steps} steps, fp32 | {floor_same}/{floor_rows} rows "
        f"identical | all | {'yes' if floor_same == floor_rows else 'no'} |"
    )
    if floor_overhead is not None:
        out(
            f"| loop overhead per step, batch 1 (soft + Gumbel, fp32), graphs replayed | {floor_overhead:.1%} | <= 5% | "
            f"{'yes' if floor_overhead <= 0.05 else 'no'} |"
        )
    if inrun_overhead is not None:
        out(
            f"| loop overhead per step, batch 1 (soft + Gumbel, fp32), split in the real run | {inrun_overhead:.1%} | "
            f"<= 5% | {'yes' if inrun_overhead <= 0.05 else 'no'} |"
        )
    out()
    out(
        "What this case cannot show: SofT-GRPO's and Soft Thinking's accuracy claims are about reasoning LLMs on math "
        "and code benchmarks. This 1.2 M-parameter model memorised a Q/A corpus with a short, checkable thinking "
        "section (topic tag + key words); it has no reasoning for soft tokens to improve, so the tables above "
        "measure agreement and speed, not the method's accuracy."
    )
    if args.out:
        from softdeploy.files import write_text

        write_text(args.out, "\n".join(lines) + "\n", "bench results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
