"""Helpers for the test suite, one module per concern (``import support.<module>``; pytest puts
``tests/`` on ``sys.path``, see ``pythonpath`` in pyproject.toml):

* ``paths``: the repository, ``tests/`` and the reference data folders;
* ``reference``: the reference data in ``tests/data`` (the transformer cases, the rule results
  are compared with);
* ``ondevice``: the device the device-independent suites run on, and its tolerances;
* ``models``: the small transformer config and the fixtures' small codec, and their factories;
* ``real_size``: the real-size seeded weights (the benches' recipe) in both checkpoint layouts,
  and the reference moshi computed from them;
* ``hub_cache``: a Hugging Face cache folder laid out as huggingface_hub lays it out;
* ``hostile``: the hypothesis budget, strategies and outcome checks of the hostile-input tests;
* ``extras``: the optional extras the suites need, and the ``extra`` marker's checks;
* ``servers``: the real server in a subprocess, TLS certificates, the count of late frames,
  and waiting on a condition;
* ``browser``: a headless Chromium driven over the DevTools protocol.
"""
