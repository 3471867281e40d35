"""rl_rewards: JAX-native RL for language-model reasoning with process rewards."""

import setuptools

# The jax versions this package is tested with: 0.10 on Python 3.11 (the
# newest jax Python 3.11 gets), 0.11 and 0.12 on Python 3.12 and 3.13.
JAX_VERSIONS = ">=0.10,<0.13"


def _jax_with(extra):
  """jax with one of its accelerator extras, in the supported range."""
  return f"jax[{extra}]{JAX_VERSIONS}"


setuptools.setup(
    name="rl_rewards",
    version="0.1.0",
    description=(
        "Reinforcement learning of language-model reasoning with process "
        "rewards (PRM, PAV, min-form, implicit PRM) in JAX."),
    packages=setuptools.find_packages(include=["rl_rewards", "rl_rewards.*"]),
    # jax 0.10 needs Python 3.11; tested on 3.11, 3.12 and 3.13.
    python_requires=">=3.11,<3.14",
    install_requires=[
        "jax" + JAX_VERSIONS,
        "flax>=0.12.8,<0.13",
        "optax>=0.2.4,<0.3",
        "orbax-checkpoint>=0.12,<0.13",
        "chex>=0.1.89,<0.2",
        "ml-collections>=1.0,<2",
        "absl-py>=2.1,<3",
        "grain>=0.2.10,<0.3",
        "array-record>=0.7,<0.9",
        "tensorflow-datasets>=4.9.8,<5",
        "reasoning-gym>=0.1.19,<0.2",
        "math-verify>=0.7,<0.10",
        "safetensors>=0.4.5,<0.9",
        "tokenizers>=0.20,<1",
        # Checkpoint chat templates (`task.prompt_template="chat"`), rendered
        # as transformers renders them (needs jinja2 >= 3.1).
        "jinja2>=3.1,<4",
        # Parquet data files (rl_rewards/data/readers.py).
        "pyarrow>=14",
        "importlib_resources>=5",
        "numpy>=1.26",
        "matplotlib>=3.8",
        # TensorBoard event files (rl_rewards/event_files.py): its writer
        # needs neither TensorFlow nor PyTorch, and it gives the `tensorboard`
        # command to watch runs.
        "tensorboard>=2.12,<3",
    ],
    extras_require={
        # jax for an accelerator, for a fresh environment: `pip install -e
        # '.[cuda13]'`. A runtime whose jax already drives its accelerator
        # (Colab, Cloud TPU VMs, GPU images) needs no extra: a plain `pip
        # install -e .` keeps its jax, which the range above admits.
        # `cuda` is jax's own default (CUDA 12, the widest driver support);
        # `cuda13` needs an NVIDIA driver for CUDA 13 (>= 580).
        "cuda": [_jax_with("cuda")],
        "cuda12": [_jax_with("cuda12")],
        "cuda13": [_jax_with("cuda13")],
        "tpu": [_jax_with("tpu")],
        "test": [
            "pytest>=8,<10",
            "pytest-xdist>=3.5,<4",
            # Executes notebooks/quickstart.ipynb (tests/notebooks).
            "nbclient>=0.10,<1",
            "nbformat>=5.9,<6",
            "ipykernel>=6.29,<8",
            # The W&B logging tests (offline, no network).
            "wandb>=0.19.10,<1",
        ],
        # Weights & Biases logging (`--config.logging.wandb_project=...`).
        "wandb": [
            "wandb>=0.19.10,<1",
        ],
        # Peers for parity tests and side-by-side benchmarks. On Python 3.11
        # torch 2.13.0 is the CPU build; on 3.12 and 3.13 the index serves
        # only its CUDA build (with the nvidia-* libraries), which runs on CPU
        # as well.
        "hf": [
            "torch==2.13.0",
            "transformers>=4.50,<5.11",
        ],
    },
)
