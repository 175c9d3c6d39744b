"""`external_plugins` entry for CPU runs of the megatron backend in tests: dagrl imports plugins in
the driver and in every Ray worker, so megatron-core gets its CPU/gloo patch wherever it runs."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.megatron_cpu_patch import apply  # noqa: E402

apply()
