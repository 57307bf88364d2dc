"""Experiments on the cases and the distillation recipe: how a case's floors hold across seeds and training steps,
which recipe gets the MiniLM student closest to its teacher, how the case's trained router fares in int8. They
measure cases, not the library's mechanisms (those are benchmarked in the repository's bench/).

Each runs as a module once the distribution is installed (``python -m pip install ./cases``), from any directory::

    python -m softdeploy_cases.experiments.NAME [--help]

and prints markdown; the results are committed under cases/results/experiments/.
"""
