"""The server ships in the package: ``mimi-py serve`` or ``python -m mimi_py serve`` (docs/protocol.md)."""

from mimi_py.serve import main

main()
