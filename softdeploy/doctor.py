"""The environment check behind ``softdeploy doctor``: is the kernel library found and loadable, do its version
and kernel variant match this package and this CPU, which versions of onnxruntime, onnx and Python run."""

from __future__ import annotations


def doctor_report() -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """What ``softdeploy doctor`` prints: (rows, warnings, failures). A failure is anything that keeps
    softdeploy's kernels from running here: no usable library (missing, unloadable, not softdeploy's,
    from other sources), an op of REGISTRY the library does not register, an op failing its smoke run
    (first sample, model without function bodies, so only the kernel can run it). A SOFTDEPLOY_ISA
    request the CPU cannot honour is a warning."""
    import platform

    import numpy as np
    import onnx
    import onnxruntime

    from softdeploy.cpu import cpuinfo
    from softdeploy.domain import __version__
    from softdeploy.ops import REGISTRY
    from softdeploy.runtime import Session, library_status

    status = library_status()
    info = status.info
    rows = [
        ("softdeploy", __version__),
        ("python", platform.python_version()),
        ("onnxruntime", onnxruntime.__version__),
        ("onnx", onnx.__version__),
        ("cpu", cpuinfo()[0]),
    ]
    from softdeploy.quant.formats import format_lines

    rows += [("int8 format", line) for line in format_lines()]  # softdeploy.quant.formats' table, for this CPU
    warnings: list[str] = []
    failures: list[str] = []
    if info is None:
        rows.append(("library", "NOT USABLE"))
        failures.append(f"library: {status.error}")
        return rows, warnings, failures
    rows += [
        ("library", str(info.path)),
        ("library version", info.version),
        (
            "built against",
            f"onnxruntime C API version {info.ort_api_version} headers; compiled by {info.compiler or 'unknown'}",
        ),
        ("kernel variant", info.isa_summary()),
        ("cuda kernels", info.cuda_summary()),
    ]
    if info.cuda_compiled:
        from softdeploy.runtime.library import cuda_device_count

        rows.append(("cuda devices", f"{cuda_device_count(info)} visible"))
    if info.version != __version__:
        failures.append(f"library version {info.version} is not this package's {__version__}: rebuild it")
    if info.isa_requested is not None and info.isa_request_valid and not info.isa_honoured:
        warnings.append(f"SOFTDEPLOY_ISA not honoured: {info.isa_note}")
    if info.isa_cpu_limit is not None and info.isa_request_valid:
        warnings.append(f"SOFTDEPLOY_TEST_CPU={info.isa_cpu_limit}: detection reports at most that (a test setting)")
    if not info.isa_request_valid:
        failures.append(f"no kernel can be created: {info.isa_note}")
        rows.append(("kernels run", "none tried (SOFTDEPLOY_ISA)"))
        return rows, warnings, failures
    missing = sorted(set(REGISTRY) - set(info.ops))
    if missing:
        failures.append(f"the library registers no kernel for {missing}")
    ran = 0
    for d in REGISTRY.values():
        if d.name in missing:
            continue
        sample = next(iter(d.samples(np.random.default_rng(0))))
        try:
            Session(d.make_model(sample, with_function=False), kernels="native").run(d.feeds(sample))
            ran += 1
        except Exception as e:
            text = str(e)
            failures.append(text if text.startswith(f"{d.name}: ") else f"{d.name}: {text}")
    rows.append(("kernels run", f"{ran} of {len(REGISTRY)} ops"))
    return rows, warnings, failures
