import os

os.environ.setdefault("TVM_NUM_THREADS", "2")
