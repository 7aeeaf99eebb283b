"""The tests that need a CUDA GPU (`pytest -m gpu tests/gpu`, `make gpu-check`'s first step).

With REHEARSAL_ENVIRONMENT set to 1 they run on CPU instead, gloo for NCCL and the host for the
GPU, the checks only CUDA can make left out (tests/test_gpu_rehearsal.py): so a test body that
would fail on its first GPU run for a reason CPU shares fails in `make test` first.
"""

REHEARSAL_ENVIRONMENT = "ZERO_LAB_GPU_TESTS_ON_CPU"
