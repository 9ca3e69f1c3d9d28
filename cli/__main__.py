"""``python -m cli``: the same as the ``perfmodel`` command."""

from .app import run

run()
