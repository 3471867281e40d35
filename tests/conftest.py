"""Test-wide JAX setup: 8 fake CPU devices, configured once before any backend use."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") +
    " --xla_force_host_platform_device_count=8").strip()

import jax  # pylint: disable=g-import-not-at-top

jax.config.update("jax_num_cpu_devices", 8)

# Many tests compile the same small programs (model steps, the sampler);
# a persistent compilation cache shared by the session makes repeats cheap.
import tempfile  # pylint: disable=g-import-not-at-top,g-bad-import-order

_CACHE_DIR = os.environ.get(
    "RL_REWARDS_TEST_JAX_CACHE",
    os.path.join(tempfile.gettempdir(), "rl_rewards_test_jax_cache"))
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
