"""softdeploy's second compiler backend: Apache TVM (Relax), for whole models and for our ops.

    model.onnx --prepare--> standard ops + com.softdeploy nodes that have a TIR compute
               --import---> Relax IRModule (our nodes become one PrimFunc each, see ``tvm/ops/``)
               --tune-----> MetaSchedule records in a persistent JSON database (optional)
               --build----> a Relax VM executable for the host CPU (or an RPC device)

``import softdeploy.tvm`` does not import TVM; the submodules do, when they are used:

  frontend   pre-check (every op the importer cannot take, all at once), inlining of the function
             bodies of ops without a TIR compute, static shapes + constant folding, import
  ops/       one TIR (TE) compute per op, so TVM fuses and schedules each op as one kernel
  tuning     MetaSchedule with a persistent database; zero successful trials is an error
  records/   the tuned records shipped with the package (the benchmark shapes)
  build      compile with the shipped + user databases applied, dlight fallback for the rest
  session    TVMSession: a compiled model run with the surface of softdeploy.runtime.Session
  rpc        tracker/server helpers for tuning and measuring on other machines

Pinned for TVM 0.27 (``pip install "softdeploy[tvm]"``): apache-tvm 0.27.0.post1 with
apache-tvm-ffi 0.1.14.post0 (0.1.15 segfaults in save_json, which kills MetaSchedule) and psutil.
"""

from __future__ import annotations

SUPPORTED_TVM = "0.27"
