"""Loading a hostile file in a child under an address-space limit (RLIMIT_AS): a loader that allocates what a tiny
file claims fails there with an allocation error instead of taking the machine's memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

_CHILD = """
import resource, sys
{imports}

def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no VmSize")

# about 3 GiB above what the interpreter and the imported libraries hold already: far below what the file asks for
limit = vm_bytes() + 3 * 2**30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    {call}(sys.argv[1])
except {error} as e:
    print("{error}:", e)
    raise SystemExit(0)
except BaseException as e:
    print("other:", type(e).__name__, str(e)[:300])
    raise SystemExit(3)
print("loaded")
raise SystemExit(4)
"""


def load_under_memory_limit(path: Path, *, imports: str, call: str, error: str) -> subprocess.CompletedProcess[str]:
    """Runs ``call(path)`` in a child that has run ``imports`` and then limited its address space; exit 0 and
    ``"<error>: message"`` when it raised ``error``, 3 for any other exception, 4 when the file loaded."""
    code = _CHILD.format(imports=textwrap.dedent(imports).strip(), call=call, error=error)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, timeout=300, check=False
    )
