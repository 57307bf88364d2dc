from __future__ import annotations

import threading

import numpy as np
import pytest

from softdeploy import LibraryNotFoundError, OpContractError
from softdeploy.ops import REGISTRY, Sample
from softdeploy.runtime import Session, library_path

OP = REGISTRY["TwoPassSoftmax"]


def _model():
    return OP.make_model(Sample("x", (np.zeros((2, 3), np.float32),)))


def test_missing_library_says_where_it_looked_and_how_to_fix(tmp_path, monkeypatch):
    import softdeploy.runtime.library as lib

    missing = tmp_path / "nope.so"
    monkeypatch.setattr(lib, "candidates", lambda: [missing])
    with pytest.raises(LibraryNotFoundError) as info:
        lib.library_path()
    message = str(info.value)
    assert f"{missing} (missing)" in message
    assert "cmake" in message and "SOFTDEPLOY_LIBRARY" in message


def test_unloadable_library_is_reported(tmp_path, monkeypatch):
    bogus = tmp_path / "libsoftdeploy_ops.so"
    bogus.write_bytes(b"not an ELF file")
    import softdeploy.runtime.library as lib

    monkeypatch.setattr(lib, "candidates", lambda: [bogus])
    with pytest.raises(LibraryNotFoundError, match="cannot load"):
        lib.library_path()
    s = Session(_model(), kernels="auto")  # auto falls back to the function bodies
    assert s.kernels == "portable"
    np.testing.assert_allclose(s.run({"X": np.zeros((2, 3), np.float32)})[0], 1 / 3, rtol=1e-6)
    with pytest.raises(LibraryNotFoundError):
        Session(_model(), kernels="native")


def test_native_and_portable_sessions():
    assert library_path().is_file()
    x = np.random.default_rng(0).standard_normal((4, 9)).astype(np.float32)
    native = Session(_model(), kernels="native")
    portable = Session(_model(), kernels="portable")
    assert native.kernels == "native" and portable.kernels == "portable"
    np.testing.assert_allclose(native.run({"X": x})[0], portable.run({"X": x})[0], rtol=1e-5)


def test_model_without_bodies_needs_the_library():
    model = OP.make_model(Sample("x", (np.zeros((2, 3), np.float32),)), with_function=False)
    from softdeploy import SoftdeployError

    with pytest.raises(SoftdeployError, match="TwoPassSoftmax"):
        Session(model, kernels="portable")


def test_contract_violation_is_a_typed_error():
    model = OP.make_model(Sample("x", (np.zeros((2, 3), np.float32),), {"axis": 2}))
    with pytest.raises(OpContractError, match=r"^TwoPassSoftmax: axis 2 is out of range"):
        Session(model).run({"X": np.zeros((2, 3), np.float32)})


def test_concurrent_runs_on_one_session():
    """Kernels are stateless: many threads calling run() on one session get their own results."""
    session = Session(_model(), threads=2)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((8, 1000)).astype(np.float32) for _ in range(8)]
    expected = [session.run({"X": x})[0] for x in inputs]
    errors = []

    def worker(i: int) -> None:
        for _ in range(20):
            got = session.run({"X": inputs[i]})[0]
            if not np.array_equal(got, expected[i]):
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_bound_run_repeats_the_model_on_fixed_buffers():
    session = Session(_model())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 1000)).astype(np.float32)
    bound = session.bind({"X": x})
    assert bound.inputs["X"] is not x  # a copy: the caller's array is never written or kept
    first = bound()
    np.testing.assert_array_equal(first[0], session.run({"X": x})[0])
    # new values written in place into the bound input; the outputs are the same arrays, overwritten
    x2 = rng.standard_normal((3, 1000)).astype(np.float32)
    bound.inputs["X"][...] = x2
    second = bound()
    assert second[0] is first[0]
    np.testing.assert_array_equal(second[0], session.run({"X": x2})[0])
    # a replaced input array would silently stop being the bound one: the mapping refuses it
    with pytest.raises(TypeError):
        bound.inputs["X"] = x2  # type: ignore[index]


def test_bound_run_errors_are_typed():
    bad_axis = OP.make_model(Sample("x", (np.zeros((2, 3), np.float32),), {"axis": 2}))
    with pytest.raises(OpContractError, match=r"^TwoPassSoftmax: axis 2 is out of range"):
        Session(bad_axis).bind({"X": np.zeros((2, 3), np.float32)})


def test_bound_run_refuses_an_output_that_changes_shape():
    """SoftNMS keeps a data-dependent number of boxes: the bound output cannot take a new count."""
    from softdeploy import RuntimeFailure

    op = REGISTRY["SoftNMS"]
    boxes = np.array([[[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7]]], np.float32)
    session = Session(op.make_model(Sample("x", (boxes, scores))))
    bound = session.bind({"Boxes": boxes, "Scores": scores})
    assert bound()[0].shape == (3, 3)
    bound.inputs["Scores"][0, 0, 2] = 0.0  # below the score threshold: two boxes are kept
    with pytest.raises(
        RuntimeFailure, match=r"output 'SelectedIndices' has shape \[2,3\] on this call, the bound buffer \[3,3\]"
    ):
        bound()


def test_bound_run_of_a_subset_of_the_outputs():
    op = REGISTRY["SoftmaxTopK"]
    x = np.random.default_rng(1).standard_normal((4, 100)).astype(np.float32)
    session = Session(op.make_model(Sample("x", (x,), {"k": 5}), outputs=3))
    values, indices, lse = session.run({"X": x})
    (bound_indices,) = session.bind({"X": x}, outputs=["Indices"])()
    assert bound_indices.dtype == np.int64
    np.testing.assert_array_equal(bound_indices, indices)
    bound_lse, bound_values = session.bind({"X": x}, outputs=["LogSumExp", "Values"])()
    np.testing.assert_array_equal(bound_lse, lse)
    np.testing.assert_array_equal(bound_values, values)


# ---- error types: only our ops' reports are OpContractError ---------------------------------------


def _session_2x3():
    from onnx import TensorProto, helper

    from softdeploy import DOMAIN

    graph = helper.make_graph(
        [helper.make_node("TwoPassSoftmax", ["X"], ["Y"], domain=DOMAIN)],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    return Session(model, kernels="native")


@pytest.mark.parametrize(
    ("feeds", "match"),
    [
        (
            {"Y": np.zeros((2, 3), np.float32)},
            r"missing input\(s\) \['X'\]; unknown input name\(s\) \['Y'\]: given \['Y'\]",
        ),
        ({}, r"missing input\(s\) \['X'\]: given \[\]"),
        ({"X": np.zeros((2, 3), np.float32), "Z": np.zeros(1)}, r"unknown input name\(s\) \['Z'\]"),
        ({"X": np.zeros((2, 3), np.float64)}, r"input 'X' is float64 \[2, 3\], the model expects float32"),
        (
            {"X": np.zeros((2, 3, 1), np.float32)},
            r"input 'X' has shape \[2, 3, 1\] \(rank 3\), the model expects rank 2",
        ),
        ({"X": np.zeros((2, 4), np.float32)}, r"input 'X' has shape \[2, 4\], .* \(dimension 1 is 4, not 3\)"),
    ],
    ids=["wrong-name", "missing", "extra", "dtype", "rank", "dimension"],
)
def test_feeds_that_do_not_fit_are_an_input_error(feeds, match):
    from softdeploy import InputError

    session = _session_2x3()
    with pytest.raises(InputError, match=match) as info:
        session.run(feeds)
    assert not isinstance(info.value, OpContractError)
    assert "the model's inputs: X: float32 [batch, 3]" in str(info.value)  # what the model expects
    with pytest.raises(InputError, match=match):  # the bound path says the same
        session.bind(feeds)


def test_unknown_output_name_is_an_input_error():
    from softdeploy import InputError

    with pytest.raises(InputError, match=r"unknown output name\(s\) \['Z'\]; the model's outputs: \['Y'\]"):
        _session_2x3().run({"X": np.zeros((2, 3), np.float32)}, outputs=["Z"])


def test_an_empty_model_is_a_load_error():
    import onnx

    from softdeploy import ModelLoadError

    with pytest.raises(ModelLoadError, match="holds no graph"):
        Session(onnx.ModelProto())
    with pytest.raises(ModelLoadError, match="empty bytes"):
        Session(b"")


def test_a_bad_option_is_a_value_error_listing_the_choices():
    from softdeploy import ArgumentError, SoftdeployError

    with pytest.raises(
        ArgumentError, match=r"optimization must be one of \['all', 'basic', 'none'\], not 'bogus'"
    ) as i:
        Session(_model(), optimization="bogus")
    assert isinstance(i.value, ValueError) and isinstance(i.value, SoftdeployError)
    with pytest.raises(ArgumentError, match=r"kernels must be one of \['native', 'portable', 'auto'\]"):
        Session(_model(), kernels="cuda")  # type: ignore[arg-type]


def test_a_missing_required_attribute_is_a_contract_error():
    model = REGISTRY["SoftmaxTopK"].make_model(Sample("x", (np.zeros((2, 8), np.float32),), {"k": 2}))
    for node in model.graph.node:
        if node.op_type == "SoftmaxTopK":
            del node.attribute[:]  # no k
    with pytest.raises(OpContractError, match=r"^SoftmaxTopK: attribute 'k' is required"):
        Session(model, kernels="native").run({"X": np.zeros((2, 8), np.float32)})


def test_an_element_type_our_op_has_no_kernel_for_lists_the_allowed_types():
    from onnx import TensorProto, helper

    from softdeploy import DOMAIN

    graph = helper.make_graph(
        [helper.make_node("TwoPassSoftmax", ["X"], ["Y"], domain=DOMAIN)],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    with pytest.raises(OpContractError, match=r"^TwoPassSoftmax: .*\['float32', 'float16'\].*given X: float64"):
        Session(model, kernels="native")


def test_a_standard_op_failing_is_not_a_contract_error():
    from onnx import TensorProto, helper

    from softdeploy import RuntimeFailure

    graph = helper.make_graph(
        [helper.make_node("Gather", ["X", "i"], ["Y"])],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("i", TensorProto.INT64, ["m"]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    # onnxruntime reports this as INVALID_ARGUMENT, as it does our kernels' contract violations
    with pytest.raises(RuntimeFailure, match="indices element out of data bounds") as info:
        Session(model, kernels="native").run({"X": np.zeros(3, np.float32), "i": np.array([7])})
    assert not isinstance(info.value, OpContractError)


def _hostile_files(tmp_path):
    good = _model().SerializeToString()
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(0).bytes(4096))
    (tmp_path / "truncated.onnx").write_bytes(good[: len(good) // 2])
    (tmp_path / "folder.onnx").mkdir()
    return {
        "missing": (tmp_path / "missing.onnx", "no such file"),
        "directory": (tmp_path / "folder.onnx", "is a directory"),
        "empty": (tmp_path / "empty.onnx", r"the file is empty \(0 bytes\)"),
        "random": (tmp_path / "random.onnx", "not an ONNX protobuf"),
        "truncated": (tmp_path / "truncated.onnx", r"truncated: \w+ needs \d+ bytes"),
    }


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "random", "truncated"])
def test_a_file_that_is_not_a_model_is_a_load_error_naming_path_and_problem(tmp_path, kind):
    from softdeploy import ModelLoadError
    from softdeploy.files import load_model

    path, match = _hostile_files(tmp_path)[kind]
    with pytest.raises(ModelLoadError, match=f"^model {path}: {match}"):
        Session(path)
    with pytest.raises(ModelLoadError, match=f"^model {path}: {match}"):
        load_model(path)
