"""``python -m softdeploy.cli``: the console script's :func:`softdeploy.cli.entry`."""

from softdeploy.cli import entry

if __name__ == "__main__":
    entry()
