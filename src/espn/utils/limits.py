"""The sizes espn accepts from a file it reads (a run directory, a sweep spec), checked before
anything of that size is allocated (docs/reliability.md).
"""

from __future__ import annotations

#: values in one input sample (e.g. 3 x 2048 x 2048 images fit) and its dimensions
MAX_INPUT_VALUES = 2**24
MAX_INPUT_DIMS = 8
#: classes of one task: labels up to 10^9 would allocate a head of 10^9 rows
MAX_CLASSES = 100_000
#: parameters (and buffers) of a model a run directory names: 4 GiB of float32 weights
MAX_MODEL_VALUES = 2**30
#: the width and precision a sweep's point-name template may give a field (``{seed:>8}``)
MAX_FORMAT_WIDTH = 64
