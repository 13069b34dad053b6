"""Test-session setup: Triton's interpreter on CPU-only machines, hypothesis profiles, gpu marker."""

import os

import torch

# Triton reads TRITON_INTERPRET when it is first imported, so this must run before any
# fuseops import. On a machine without CUDA every kernel runs through the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The interpreter without work whose results it discards (tests/interpreter_patching.py: ~40 %
# of the suite's time); FUSEOPS_INTERPRETER_AS_SHIPPED=1 runs Triton's unchanged.
if os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("FUSEOPS_INTERPRETER_AS_SHIPPED") != "1":
    from tests.interpreter_patching import skip_overflow_checks, skip_repeated_patching

    skip_repeated_patching()
    skip_overflow_checks()

# Under pytest-xdist (the README's test command runs two workers, one per core of the CI machine)
# each worker computes on one thread, so that two workers do not ask for four.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=25,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "gpu",
    derandomize=False,
    max_examples=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=10, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        # Kernel tests on CPU tensors need the interpreter, which is off where CUDA runs.
        skip_cpu_kernels = pytest.mark.skip(reason="interpreter kernel tests run on CPU-only machines")
        for item in items:
            if "tests/kernels/" in item.nodeid and "gpu" not in item.keywords:
                item.add_marker(skip_cpu_kernels)
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
