"""autofuse: autotuning search over operator-fusion plans (TVM builds, Optuna searches)."""

import os as _os

# TVM uses half the cores on x86 unless told otherwise; every kernel autofuse runs
# should use all of them (or what the user set). Must happen before TVM's first parallel launch.
_os.environ.setdefault("TVM_NUM_THREADS", str(_os.cpu_count() or 1))

__version__ = "0.1.0"
