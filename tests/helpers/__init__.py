"""Helpers shared by the tests (imported as ``helpers.<module>``); the pytest fixtures built
on them live in ``tests/conftest.py``.

* :mod:`helpers.api_models` -- plain torch models the Python API tests wrap by reference;
* :mod:`helpers.baseline` -- small FC models and tiny task sequences, an engine over them;
* :mod:`helpers.deploy` -- a tiny residual network, short runs through the CLI and the API,
  and killing a run at a chosen step;
* :mod:`helpers.images` -- fake raw CIFAR-shaped datasets and random task sub-networks;
* :mod:`helpers.mnist` -- synthetic MNIST-shaped images.
"""
