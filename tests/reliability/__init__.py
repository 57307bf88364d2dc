"""The standing reliability suite (issue 11), in CI with fixed profiles and bounded time:

* test_fuzz.py: every registry op through onnxruntime, hypothesis cases derived from the op's own samples
  (shapes incl. empty, dtypes, special values, attribute values), the native kernel on every ISA this CPU
  runs against the float64 reference within op.tolerance; refusals must be OpContractError naming the op.
  One summary line per op. ~1 min on the 2-core dev machine.
* test_huge_empty.py: 2**40-but-empty inputs return at once (child process per op, 10 s per variant).
* test_attribute_types.py: wrong-typed and misspelled attributes, kernel and function body.
* test_concurrency.py: 8 threads x 1000 runs on one session per op at 1 and 2 intra-op threads, on
  shapes the kernels split into >= 2 tasks, bit-identical to serial. ~25 s.
* test_hostile_files.py: hostile files for every CLI verb that reads one and for Session; overwrite
  refusals; no unpickling anywhere. ~1.5 min (CLI cases run concurrently).
* .ci/sanitize (run by .ci/run): the op tests and test_fuzz.py on an ASan + UBSan build of the kernels.
"""
