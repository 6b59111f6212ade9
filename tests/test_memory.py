import platform
import subprocess
import sys

import pytest

from pretrainlab.runtime.malloc import keep_freed_memory

# Allocates and frees 64 MB and 16 MB tensors, as a training step does with its activations, and
# prints the page faults of 10 such steps after 10 warm-up steps.
SCRIPT = """
import resource, sys, torch
from pretrainlab.runtime.malloc import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():
    a = torch.empty(1 << 24).fill_(1.0)
    b = torch.empty(1 << 22).fill_(1.0)
    del a, b
for _ in range(10):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_kept_memory_is_reused_without_page_faults():
    if platform.libc_ver()[0] != "glibc":  # the contract elsewhere: nothing is changed, and it says so
        assert keep_freed_memory() is False
        return
    pages = 10 * (64 + 16) * 2**20 // 4096
    default, kept = _faults("default"), _faults("keep")
    assert default > pages // 2, default  # glibc's default maps and faults in the 64 MB tensor every step
    assert kept < pages // 100, kept  # kept memory: the same pages every step


def test_keep_freed_memory_rejects_a_limit_mallopt_cannot_take():
    with pytest.raises(ValueError, match="limit"):
        keep_freed_memory(1 << 31)
