"""Routing agreement of routed (LoRA-Mixer) models between fp32 and int8, and the nodes that protect it.

A LoRAMixer node picks its top-k experts from ``Router . x`` in float, but ``x`` is the output of the layers before
it: in int8 their rounding noise moves the router logits, and where two experts' logits are close (a router as
created, or any router on ambiguous tokens) the top expert flips. One flip changes the delta of that projection and
so the input of every router after it: on MiniLM with three PEFT adapters the token cosine to fp32 fell from 0.987
(merged) to ~0.6 routed. Quantizing a model that routes therefore measures, per LoRAMixer node, the fraction of
tokens whose selected experts (as a set) are the same in int8 as in fp32 on the probe data, and past
``MAX_FLIP_RATE`` keeps in float as few candidate nodes on the flipping routers' input path as bring every node
within it (:func:`search_guard`): each candidate upstream of a flipping router's input (their noise is what reaches
its logits) and, in static mode, each candidate reading that input (their QuantizeLinear / DequantizeLinear pair
would be shared with the router) is quantized alone and ranked by its share of the all-int8 router-logit error, and
the fewest most harmful are kept in float. Where that search would take too many quantize + probe runs, two coarse
stages (:func:`guard_nodes`): the candidates nearest the routers' input, then all of them. The measure is repeated
on the model as written, so the report shows the agreement before and after and why each kept node was kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

# Past this fraction of probe tokens whose experts differ from fp32 at any LoRAMixer node, the router's input path
# stays in float. 2%: on the routed MiniLM the cosine to fp32 was 0.987 merged and fell with each flipped percent;
# a few flips per thousand tokens are what the int8 rounding of the float-kept model itself leaves.
MAX_FLIP_RATE = 0.02

# The routing guard's sensitivity search takes at most this many quantize + probe runs (search_evaluations: one per
# candidate on the flipping routers' input path, then a bisection): 43 for all-MiniLM-L6-v2 routed in any layer (36
# candidates), a few seconds each there; a model with more candidates on that path gets the coarse stages.
ROUTING_SEARCH_EVALUATIONS = 64

LORA_MIXER = "LoRAMixer"


@dataclasses.dataclass(frozen=True)
class NodeRouting:
    """One LoRAMixer node: the fraction of probe tokens whose selected experts (as a set) and whose top expert match
    fp32, the largest gate difference on the tokens that agree, and the number of tokens."""

    node: str
    agreement: float  # experts as a set, per token
    top1_agreement: float
    max_gate_diff: float
    tokens: int

    @property
    def flip_rate(self) -> float:
        """1 - agreement: the fraction of tokens routed to other experts than in fp32."""
        return 1.0 - self.agreement


@dataclasses.dataclass
class RoutingReport:
    """Routing agreement with fp32 per LoRAMixer node, before (all candidates int8) and as written, the nodes kept in
    float to protect it and why, the probe it was measured on and the flip-rate limit."""

    before: list[NodeRouting]
    after: list[NodeRouting]
    kept_float: list[str]
    reason: str
    probe: str
    max_flip_rate: float = MAX_FLIP_RATE
    search: GuardSearch | None = None  # the sensitivity search that chose kept_float (None: the coarse stages)

    @property
    def agreement(self) -> float:
        """The lowest per-node agreement of the model as written."""
        return min((r.agreement for r in self.after), default=1.0)

    @property
    def agreement_before(self) -> float:
        """The lowest per-node agreement with every candidate int8."""
        return min((r.agreement for r in self.before), default=1.0)

    def line(self) -> str:
        """One line for the quantize text report and compare's quantization section."""
        worst = min(self.after, key=lambda r: r.agreement, default=None)
        where = f" at {worst.node}" if worst is not None else ""
        text = (
            f"routing agreement with fp32 ({len(self.after)} LoRAMixer nodes, {self.probe}): lowest "
            f"{self.agreement:.1%}{where}, mean {np.mean([r.agreement for r in self.after]):.1%}"
        )
        if self.kept_float:
            text += (
                f"; {len(self.kept_float)} node(s) kept in float to protect routing (all candidates int8: lowest "
                f"{self.agreement_before:.1%}): {self.reason}"
            )
        else:
            text += f"; nothing kept in float for routing ({self.reason})"
        return text

    def to_json(self) -> dict[str, Any]:
        """The ``routing`` entry of the quantize report."""
        return {
            "agreement": self.agreement,
            "agreement_all_int8": self.agreement_before,
            "max_flip_rate": self.max_flip_rate,
            "probe": self.probe,
            "kept_float": self.kept_float,
            "reason": self.reason,
            "nodes": [dataclasses.asdict(r) | {"agreement_all_int8": b.agreement} for r, b in _paired(self)],
            "search": self.search.to_json() if self.search is not None else None,
            "summary": self.line(),
        }


def _paired(report: RoutingReport) -> list[tuple[NodeRouting, NodeRouting]]:
    before = {r.node: r for r in report.before}
    return [(r, before.get(r.node, r)) for r in report.after]


def mixer_nodes(model: Any) -> list[Any]:
    """The model's LoRAMixer nodes (main graph), in graph order."""
    return [n for n in model.graph.node if n.op_type == LORA_MIXER]


def _with_routing_outputs(model: Any) -> tuple[Any, dict[str, tuple[str, str]]]:
    """A copy of ``model`` whose LoRAMixer nodes also output their Experts and Gates as graph outputs; node name ->
    (experts output, gates output)."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    outs = {o.name for o in m.graph.output}
    names: dict[str, tuple[str, str]] = {}
    for i, node in enumerate(mixer_nodes(m)):
        key = node.name or f"{LORA_MIXER}_{i}"
        while len(node.output) < 3:
            node.output.append("")
        for slot, suffix in ((1, "experts"), (2, "gates")):
            if not node.output[slot]:
                node.output[slot] = f"{key}__routing_{suffix}"
        for slot, dtype in ((1, TensorProto.INT64), (2, TensorProto.FLOAT)):
            if node.output[slot] not in outs:
                m.graph.output.append(helper.make_tensor_value_info(node.output[slot], dtype, None))
                outs.add(node.output[slot])
        names[key] = (node.output[1], node.output[2])
    return m, names


def _routing(
    model: Any, probe: Sequence[Mapping[str, np.ndarray]], *, logits: bool = False
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Per LoRAMixer node its experts and gates on ``probe`` (one row per token) and, with ``logits``, its router
    logits ``Router . x`` recomputed from the node's input and Router (float64; None where the Router is not a
    constant of the model)."""
    from onnx import numpy_helper

    from softdeploy.runtime import Session

    m, names = _with_routing_outputs(model)
    inits = {t.name: t for t in m.graph.initializer}
    routers: dict[str, np.ndarray] = {}
    inputs: dict[str, str] = {}
    if logits:
        from onnx import TensorProto, helper

        outs = {o.name for o in m.graph.output}
        known = {v.name: v.type.tensor_type.elem_type for v in list(m.graph.value_info) + list(m.graph.input)}
        for i, node in enumerate(mixer_nodes(m)):
            key = node.name or f"{LORA_MIXER}_{i}"
            if len(node.input) < 4 or node.input[3] not in inits:
                continue
            routers[key] = numpy_helper.to_array(inits[node.input[3]]).astype(np.float64)
            inputs[key] = node.input[0]
            if node.input[0] not in outs:
                dtype = known.get(node.input[0]) or TensorProto.FLOAT
                m.graph.output.append(helper.make_tensor_value_info(node.input[0], dtype, None))
                outs.add(node.input[0])
    session = Session(m, kernels="auto", threads=1)
    wanted = [name for pair in names.values() for name in pair] + list(dict.fromkeys(inputs.values()))
    runs = [dict(zip(wanted, session.run(dict(f), wanted), strict=True)) for f in probe]
    out: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
    for key, (e_name, g_name) in names.items():
        experts = np.concatenate([np.asarray(r[e_name]).reshape(-1, np.asarray(r[e_name]).shape[-1]) for r in runs])
        gates = np.concatenate([np.asarray(r[g_name]).reshape(-1, experts.shape[1]) for r in runs])
        lg = None
        if key in routers:
            router = routers[key]
            x = np.concatenate([np.asarray(r[inputs[key]], np.float64).reshape(-1, router.shape[1]) for r in runs])
            lg = x @ router.T
        out[key] = (experts, gates, lg)
    return out


def _compare(
    ref: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]],
    got: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]],
) -> list[NodeRouting]:
    out = []
    for key, (e_ref, g_ref, _) in ref.items():
        if key not in got:
            continue
        e_got, g_got, _ = got[key]
        order_ref, order_got = np.argsort(e_ref, 1), np.argsort(e_got, 1)
        same = (np.take_along_axis(e_ref, order_ref, 1) == np.take_along_axis(e_got, order_got, 1)).all(1)
        gates_ref = np.take_along_axis(g_ref, order_ref, 1)[same]
        gates_got = np.take_along_axis(g_got, order_got, 1)[same]
        out.append(
            NodeRouting(
                node=key,
                agreement=float(same.mean()) if same.size else 1.0,
                top1_agreement=float((e_ref[:, 0] == e_got[:, 0]).mean()) if same.size else 1.0,
                max_gate_diff=float(np.abs(gates_ref - gates_got).max()) if gates_ref.size else 0.0,
                tokens=int(same.size),
            )
        )
    return out


def measure(fp32: Any, int8: Any, probe: Sequence[Mapping[str, np.ndarray]]) -> list[NodeRouting]:
    """Per LoRAMixer node of ``fp32`` (ModelProto or path), its routing agreement in ``int8`` on ``probe``."""
    from softdeploy.quant.nodes import load_named

    return _compare(_routing(load_named(fp32), probe), _routing(load_named(int8), probe))


class RoutingProbe:
    """fp32's routing on the probe feeds, computed once, against which quantized models are measured: their routing
    agreement per LoRAMixer node and the mean squared error of their router logits (per token, summed over experts)."""

    def __init__(self, fp32: Any, probe: Sequence[Mapping[str, np.ndarray]]) -> None:
        from softdeploy.quant.nodes import load_named

        self.probe = list(probe)
        self.reference = _routing(load_named(fp32), self.probe, logits=True)
        self.runs = 0  # quantized models measured

    def evaluate(self, int8: Any) -> tuple[list[NodeRouting], dict[str, float]]:
        """``int8``'s routing agreement per node and its router-logit error per node (nodes whose Router is not a
        constant have none)."""
        from softdeploy.quant.nodes import load_named

        got = _routing(load_named(int8), self.probe, logits=True)
        self.runs += 1
        errors = {}
        for key, (_, _, ref) in self.reference.items():
            lg = got.get(key, (None, None, None))[2]
            if ref is not None and lg is not None:
                errors[key] = float(((lg - ref) ** 2).sum(1).mean())
        return _compare(self.reference, got), errors


def guard_nodes(
    model: Any, mixers: Sequence[str], candidates: Sequence[str], mode: str, *, nearest: bool = False
) -> list[str]:
    """The candidate nodes that protect the routing of ``mixers``: those upstream of each router's input and, in
    static mode, those that read that input (their Q/DQ pair would sit on it); in graph order. ``nearest``: only the
    first candidates met on each path up from the input (the ones whose output reaches the router without passing
    another candidate: in a transformer the residual stream's writers -- embeddings, attention output and FFN output
    projections -- not the projections behind them)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    cand = set(candidates)
    by_name = {n.name: n for n in mixer_nodes(model)}
    keep: set[str] = set()
    seen: set[str] = set()
    for name in mixers:
        node = by_name.get(name)
        if node is None:
            continue
        x = node.input[0]
        stack = [x]
        while stack:
            t = stack.pop()
            p = producer.get(t)
            if p is None or p.name in seen:
                continue
            seen.add(p.name)
            if p.name in cand:
                keep.add(p.name)
                if nearest:
                    continue
            stack.extend(i for i in p.input if i)
        if mode == "static":
            keep |= {n.name for n in model.graph.node if x in n.input and n.name in cand}
    return [n.name for n in model.graph.node if n.name in keep]


@dataclasses.dataclass(frozen=True)
class GuardEffect:
    """One candidate on a flipping router's input path, quantized alone (every other candidate in float): its share of
    the all-int8 model's router-logit error (mean over the flipping LoRAMixer nodes of its squared logit error over
    theirs; int8 noise of independent nodes adds up in variance, so the shares rank what each node contributes) and
    the worst flip rate it causes by itself; rank 1 = most harmful (by share, then by that flip rate: the share is 0
    where no flipping node's Router is a constant of the model, whose logits the probe cannot recompute)."""

    node: str
    logit_error_share: float
    flip_rate_alone: float
    rank: int


@dataclasses.dataclass(frozen=True)
class GuardTrial:
    """One model of the sensitivity search: the ``kept_float`` most harmful candidates in float, the worst per-node
    flip rate on the probe and whether every node is within the limit."""

    kept_float: int
    worst_flip_rate: float
    within_limit: bool


@dataclasses.dataclass
class GuardSearch:
    """The outcome of :func:`search_guard`: the candidates kept in float (most harmful first), the routing of the model
    that keeps them, that model (whatever ``with_float`` returned), every candidate's effect (most harmful first), the
    trials, how many quantize + probe runs it took and whether every node ended within the limit."""

    kept: list[str]
    after: list[NodeRouting]
    model: Any
    effects: list[GuardEffect]
    trials: list[GuardTrial]
    evaluations: int
    reached: bool
    from_hint: bool = False

    def to_json(self) -> dict[str, Any]:
        """The ``search`` part of the routing report."""
        kept = set(self.kept)
        return {
            "evaluations": self.evaluations,
            "candidates": len(self.effects),
            "reached": self.reached,
            "from_previous_search": self.from_hint,
            "kept_float": [dataclasses.asdict(e) for e in self.effects if e.node in kept],
            "ranking": [dataclasses.asdict(e) for e in self.effects],
            "trials": [dataclasses.asdict(t) for t in self.trials],
        }


def search_evaluations(candidates: int) -> int:
    """The most quantize + probe runs :func:`search_guard` takes for ``candidates`` candidates: one per candidate
    alone, then a bisection over their ranking (at most ceil(log2(n)) + 1 models)."""
    return candidates + max(1, candidates).bit_length() + 1


def search_guard(
    candidates: Sequence[str],
    flipped: Sequence[str],
    probe: RoutingProbe,
    all_int8_errors: Mapping[str, float],
    alone: Callable[[str], Any],
    with_float: Callable[[Sequence[str]], tuple[Any, Any]],
    max_flip_rate: float = MAX_FLIP_RATE,
    *,
    hint: GuardSearch | None = None,
) -> GuardSearch:
    """The fewest ``candidates`` to keep in float so that no LoRAMixer node flips more than ``max_flip_rate`` of the
    probe tokens, by sensitivity: each candidate quantized alone (``alone(node)`` -> the model's path) is measured by
    its share of the all-int8 router-logit error at the ``flipped`` nodes (``all_int8_errors``: their
    RoutingProbe.evaluate errors), and the k most harmful are kept in float (``with_float(nodes)`` -> (model's path,
    anything the caller wants back)) with k the smallest a bisection over k finds within the limit (the search
    assumes fewer flips as more stay in float; every trial is recorded). With every candidate in float and still past
    the limit it reports ``reached=False``. ``hint``: a previous search on the same model (a --max-drop trial keeps
    more nodes in float than the all-int8 model it ranked): its ranking is reused (no candidate quantized alone) and
    its kept set tried first."""
    cand = list(candidates)
    flipped_set = set(flipped)
    evaluations = 0
    effects: list[GuardEffect]
    if hint is not None:
        known = {e.node: e for e in hint.effects}
        in_cand = set(cand)
        order = [e.node for e in hint.effects if e.node in in_cand] + [n for n in cand if n not in known]
        effects = [
            dataclasses.replace(known[n], rank=i) if n in known else GuardEffect(n, 0.0, 0.0, i)
            for i, n in enumerate(order, 1)
        ]
    else:
        rows = []
        for index, node in enumerate(cand):
            routes, errors = probe.evaluate(alone(node))
            evaluations += 1
            shares = [
                errors[f] / all_int8_errors[f] for f in flipped if all_int8_errors.get(f, 0.0) > 0 and f in errors
            ]
            share = float(np.mean(shares)) if shares else 0.0
            worst = max((r.flip_rate for r in routes if r.node in flipped_set), default=0.0)
            rows.append((-share, -worst, index, node, share, worst))
        rows.sort()
        effects = [GuardEffect(r[3], r[4], r[5], i) for i, r in enumerate(rows, 1)]
        order = [e.node for e in effects]
    trials: list[GuardTrial] = []
    tried: dict[int, tuple[bool, list[NodeRouting], Any]] = {}

    def attempt(k: int) -> bool:
        nonlocal evaluations
        path, kept_model = with_float(order[:k])
        routes, _ = probe.evaluate(path)
        evaluations += 1
        worst = max((r.flip_rate for r in routes), default=0.0)
        ok = worst <= max_flip_rate
        trials.append(GuardTrial(k, worst, ok))
        tried[k] = (ok, routes, kept_model)
        return ok

    n = len(order)
    lo, hi = 0, n  # lo: known to fail (all int8 flipped); hi: assumed to hold until tried
    if hint is not None:
        hinted = set(hint.kept)
        k_hint = sum(1 for node in order if node in hinted)
        if 0 < k_hint <= n and attempt(k_hint):
            ok, routes, kept_model = tried[k_hint]
            return GuardSearch(order[:k_hint], routes, kept_model, effects, trials, evaluations, True, True)
        lo = max(lo, k_hint)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attempt(mid):
            hi = mid
        else:
            lo = mid
    if hi not in tried:
        attempt(hi)
    ok, routes, kept_model = tried[hi]
    return GuardSearch(order[:hi], routes, kept_model, effects, trials, evaluations, ok, hint is not None)


def synthetic_probe(model: Any, batches: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Probe feeds when no data was given (dynamic mode): token ids drawn within the vocabulary of the embedding
    Gather that reads them, masks of ones, type ids of zeros, float inputs standard normal; symbolic dimensions
    batch 2 and 32 tokens."""
    from onnx import TensorProto

    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    vocab: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[0] in inits:
            vocab.setdefault(n.input[1], int(inits[n.input[0]].dims[0]))
    feeds = []
    for _ in range(batches):
        f = {}
        for inp in model.graph.input:
            if inp.name in inits:
                continue
            t = inp.type.tensor_type
            dims = [d.dim_value if d.dim_value > 0 else (2 if i == 0 else 32) for i, d in enumerate(t.shape.dim)]
            if t.elem_type in (TensorProto.INT64, TensorProto.INT32):
                dtype = np.int64 if t.elem_type == TensorProto.INT64 else np.int32
                lname = inp.name.lower()
                if "mask" in lname:
                    v = np.ones(dims, dtype)
                elif "type" in lname:
                    v = np.zeros(dims, dtype)
                else:
                    v = rng.integers(0, vocab.get(inp.name, 2), size=dims).astype(dtype)
            elif t.elem_type == TensorProto.FLOAT16:
                v = rng.standard_normal(dims).astype(np.float16)
            else:
                v = rng.standard_normal(dims).astype(np.float32)
            f[inp.name] = v
        feeds.append(f)
    return feeds


def probe_for(
    model: Any,
    probe: Sequence[Mapping[str, np.ndarray]] | None,
    calibration: Sequence[Mapping[str, np.ndarray]] | None,
) -> tuple[list[Mapping[str, np.ndarray]], str]:
    """The feeds routing is measured on and their description: the probe, else the first calibration batches, else
    synthetic ones."""
    if probe:
        return list(probe), f"{len(probe)} probe batches"
    if calibration:
        chosen = list(calibration)[:8]
        return chosen, f"{len(chosen)} calibration batches"
    feeds = synthetic_probe(model)
    return feeds, f"{len(feeds)} synthetic batches (no data given)"


def flipping(routes: Sequence[NodeRouting], max_flip_rate: float = MAX_FLIP_RATE) -> list[NodeRouting]:
    """The nodes whose flip rate is past ``max_flip_rate``."""
    return [r for r in routes if r.flip_rate > max_flip_rate]


def describe_guard(
    bad: Sequence[NodeRouting], max_flip_rate: float, stage: str = "upstream", search: GuardSearch | None = None
) -> str:
    """Why the guard was kept: the flipping nodes, worst first (a few named), and which nodes were kept -- by the
    sensitivity ``search`` (``stage`` "search": the kept nodes' measured effect, a few named) or a coarse stage."""
    worst = sorted(bad, key=lambda r: r.agreement)
    named = ", ".join(f"{r.node} {r.flip_rate:.1%}" for r in worst[:3]) + (" ..." if len(worst) > 3 else "")
    if search is not None:
        head = (
            f"with every candidate int8, {len(bad)} LoRAMixer node(s) routed more than {max_flip_rate:.0%} of tokens "
            f"to other experts than fp32 ({named}); "
        )
        n, k = len(search.effects), len(search.kept)
        effect = {e.node: e for e in search.effects}
        shown = ", ".join(
            f"{node} {effect[node].logit_error_share:.0%} of the logit error, {effect[node].flip_rate_alone:.1%} "
            "flipped alone"
            for node in search.kept[:3]
        ) + (" ..." if k > 3 else "")
        how = (
            "the previous search's ranking (no candidate quantized alone again)"
            if search.from_hint
            else f"each of the {n} candidates on their routers' input path quantized alone"
        )
        verdict = (
            f"kept in float the {k} of {n} whose int8 noise moves those routers' logits most ({shown}); the other "
            f"{n - k} stay int8"
            if search.reached
            else f"even with all {n} in float a node still flips more than {max_flip_rate:.0%}"
        )
        return head + (
            f"a sensitivity search ({how}, then {len(search.trials)} model(s) bisecting how many to keep: "
            f"{search.evaluations} extra quantize + probe runs) {verdict}"
        )
    which = (
        "the candidates nearest their routers' input (the residual stream's writers) were kept in float"
        if stage == "nearest"
        else "keeping the nearest candidates in float was not enough, so every candidate upstream of their routers' "
        "input was kept in float"
    )
    return (
        f"with every candidate int8, {len(bad)} LoRAMixer node(s) routed more than {max_flip_rate:.0%} of tokens to "
        f"other experts than fp32 ({named}); {which}"
    )
