"""rl_rewards: JAX-native RL for language-model reasoning with process rewards."""

import setuptools

setuptools.setup(
    name="rl_rewards",
    version="0.1.0",
    description=(
        "Reinforcement learning of language-model reasoning with process "
        "rewards (PRM, PAV, min-form, implicit PRM) in JAX."),
    packages=setuptools.find_packages(include=["rl_rewards", "rl_rewards.*"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.6,<0.11",
        "flax>=0.10.6,<0.13",
        "optax>=0.2.4,<0.3",
        "orbax-checkpoint>=0.11,<0.13",
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
        "importlib_resources>=5",
        "numpy>=1.26",
        "matplotlib>=3.8",
        # TensorBoard event files (rl_rewards/event_files.py): its writer
        # needs neither TensorFlow nor PyTorch, and it gives the `tensorboard`
        # command to watch runs.
        "tensorboard>=2.12,<3",
    ],
    extras_require={
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
        # Peers for parity tests and side-by-side benchmarks (CPU torch).
        "hf": [
            "torch==2.13.0",
            "transformers>=4.50,<5.11",
        ],
    },
)
