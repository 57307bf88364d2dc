"""``softdeploy serve``: a model behind HTTP on Ray Serve (the ``serve`` extra), and its Python client.

:mod:`softdeploy.serve.app` builds the Ray Serve application (replicas that open
:class:`softdeploy.runtime.Session`, dynamic batching, ``/healthz``, ``/metadata``, ``/stats``);
:mod:`softdeploy.serve.client` talks to it. Neither is imported here: ``import softdeploy.serve`` does
not import Ray (the app module imports it only when an application is built or started).
"""

from __future__ import annotations
