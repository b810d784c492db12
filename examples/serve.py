"""The WebSocket server now lives in the package: ``python -m mimi_py.serve`` (mimi_py/serve.py)."""

from mimi_py.serve import main

main()
