"""The training-step benchmark: FLOPs formula, batch layout, a tiny full run.

The full run is skipped when torch / transformers are not installed (they
are not project dependencies): `pip install torch==2.13.0
'transformers>=4.50,<5.11'`.
"""

import json

from absl import flags
from absl.testing import flagsaver
import jax
import numpy as np
import pytest

from experiments.benchmarks import train_step
from rl_rewards import models
from rl_rewards.sharding import mesh as mesh_lib


def test_flops_per_token_matches_a_hand_count():
  # The "test" preset: D=32, 2 layers, H=4, KVH=2, Dh=8, F=64; V=40, T=16.
  cfg = models.preset("test", 40)
  # Per layer: q 32·32 + k 32·16 + v 32·16 + o 32·32 + MLP 3·32·64 = 9216;
  # two layers 18432; LM head 32·40 = 1280.
  assert train_step.matmul_params(cfg) == 18432 + 1280
  flops = train_step.flops_per_token(cfg, seq_len=16)
  dense = 6 * 19712                      # 118272
  attention = 12 * 2 * 16 * 8 * 4        # 12·L·T·Dh·H = 12288
  assert flops == {"dense": dense, "noncausal": dense + attention,
                   "causal": dense + attention // 2}
  assert train_step.mfu(1000.0, 2e9, peak_tflops=1.0) == pytest.approx(2.0)


def test_tied_head_counts_once_and_qwen_sizes_match_the_published_counts():
  # Qwen2.5 model cards: 0.36 B / 1.31 B non-embedding parameters.
  for name, non_embedding in (("qwen0.5b", 0.36e9), ("qwen1.5b", 1.31e9)):
    cfg = train_step.model_config(name, 0, "bfloat16", 1024)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 151936
    head = cfg.hidden_size * cfg.vocab_size
    assert train_step.matmul_params(cfg) - head == pytest.approx(
        non_embedding, abs=0.005e9)
  untied = models.preset("test", 40)
  assert train_step.matmul_params(untied.replace(
      tie_word_embeddings=True)) == train_step.matmul_params(untied)


def test_batch_layout():
  batch = train_step.make_batch(6, 48, vocab_size=40, seed=0)
  mask, response = batch["attention_mask"], batch["response_mask"]
  assert batch["tokens"].shape == (6, 48) and batch["tokens"].dtype == np.int32
  assert ((batch["tokens"] != 0) == (mask == 1)).all()
  assert (response <= mask).all() and response.sum(1).min() > 0
  assert (batch["loss_mask"] == response).all()
  assert (response[:, :12] == 0).all()       # Prompt slots (T/4).
  assert mask[:, 11].all()                   # Prompts are left-padded.
  rows = np.flatnonzero(response.any(0))
  assert rows.min() == 12                    # Responses start after them.
  adv = batch["advantages"]
  assert (adv[response == 0] == 0).all()
  for row in range(6):                       # One advantage per row.
    assert np.unique(adv[row][response[row] == 1]).size == 1


def test_loss_agreement_detects_a_difference():
  ours = [{"loss": 1.0}, {"loss": 0.9}]
  same = train_step.loss_agreement(ours, [{"loss": 1.0 + 1e-6},
                                          {"loss": 0.9}], tolerance=1e-4)
  assert same["first_step_losses_agree"]
  differ = train_step.loss_agreement(ours, [{"loss": 1.01}, {"loss": 0.9}],
                                     tolerance=1e-4)
  assert not differ["first_step_losses_agree"]
  assert differ["first_step_loss_abs_diff"] == pytest.approx(0.01)


def test_a_loss_disagreement_exits_non_zero():
  ours = [{"loss": 1.0}, {"loss": 0.9}]
  rows = [dict(step="sft", batch=8, seq_len=32, **train_step.loss_agreement(
      ours, [{"loss": 1.0 + 1e-6}, {"loss": 0.9}], 1e-4))]
  train_step.check_loss_agreement(rows)               # Agrees: returns.
  train_step.check_loss_agreement([{"step": "sft"}])  # Ours only: nothing.
  rows.append(dict(step="policy", batch=4, seq_len=128,
                   **train_step.loss_agreement(
                       ours, [{"loss": 1.01}, {"loss": 0.9}], 1e-4)))
  with pytest.raises(SystemExit, match="policy 4x128") as stopped:
    train_step.check_loss_agreement(rows)
  assert "sft" not in str(stopped.value)


def test_policy_step_traces_at_the_qwen_half_billion_shape():
  cfg = train_step.model_config("qwen0.5b", 0, "bfloat16", 1024)
  mesh = mesh_lib.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  params = models.abstract_params(cfg)
  step, tx, _ = train_step.jit_step("policy", cfg, params, mesh, kl_coef=0.05,
                                    seq_len=1024)
  state, batch = train_step.abstract_inputs("policy", cfg, tx, 8, 1024)
  new_state, metrics = jax.eval_shape(step, state, batch)
  assert new_state.params["embed"].shape == (151936, 896)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), new_state.params) == (
      jax.tree.map(lambda x: (x.shape, x.dtype), params))
  assert {"loss", "pg_loss", "kl", "grad_norm"} <= set(metrics)
  assert metrics["loss"].shape == ()


@pytest.mark.parametrize("kind", ["sft", "policy"])
def test_main_runs_both_sides_and_their_losses_agree(tmp_path, kind):
  pytest.importorskip("torch", reason="PyTorch is needed for the benchmark.")
  pytest.importorskip("transformers",
                      reason="transformers is needed for the benchmark.")
  out = tmp_path / "train_step.json"
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  # --batch is shared with advantages.py, whose default (1024) wins when
  # that module is imported later in the same process: unset it here.
  with flagsaver.flagsaver(out=str(out), model="test", vocab_size=40,
                           batch=None, seq_len=None,
                           shapes=["8x32"], steps=[kind], repeats=1,
                           torch_threads=1, num_devices=2):
    train_step.main([])
  results = json.loads(out.read_text())
  assert results["backend"] == "cpu"
  [row] = results["rows"]
  assert row["step"] == kind and row["model"] == "test"
  assert (row["batch"], row["seq_len"], row["tokens"]) == (8, 32, 256)
  assert row["devices"] == 2 and row["torch_threads"] == 1
  for key in ("ours_s", "torch_s", "ours_first_call_s", "torch_first_call_s",
              "ours_tok_s", "torch_tok_s"):
    assert row[key] > 0, key
  assert row["ours_tok_s"] == pytest.approx(256 / row["ours_s"])
  assert row["ours_times_s"] == [row["ours_s"]]
  assert row["torch_times_s"] == [row["torch_s"]]
  assert row["ratio"] == pytest.approx(row["ours_tok_s"] / row["torch_tok_s"])
  cfg = models.preset("test", 40)
  assert row["flops_per_token_causal"] == (
      train_step.flops_per_token(cfg, 32)["causal"])
  assert "ours_mfu_causal" not in row           # CPU: no MFU.
  # Two warm-up calls and one timed call per side.
  assert len(row["ours_losses"]) == len(row["torch_losses"]) == 3
  assert np.isfinite(row["first_step_loss_ours"])
  assert row["first_step_losses_agree"], row
  assert row["first_step_loss_rel_diff"] <= 1e-5
  if kind == "sft":  # An NLL near log V at init.
    assert abs(row["first_step_loss_ours"] - np.log(40)) < 1.0
    return
  # Policy: both loss parts agree, the KL term is on, and after one
  # identical AdamW update (lr 5e-5, no warm-up) the losses still agree.
  for part in ("pg_loss", "kl"):
    assert row[f"first_step_{part}_rel_diff"] <= 1e-5, part
  assert row["first_step_kl_ours"] > 1e-3
  assert row["second_step_loss_ours"] != row["first_step_loss_ours"]
  assert row["second_step_loss_rel_diff"] <= 1e-4


def test_mfu_fields_and_the_gpu_table(capsys):
  cfg = models.preset("test", 40)
  flops = train_step.flops_per_token(cfg, 16)
  row = {"step": "sft", "model": "test", "dtype": "bfloat16", "batch": 4,
         "seq_len": 16, "ours_tok_s": 1e6, "ours_first_call_s": 3.0,
         "ours_losses": [3.7]}
  fields = train_step.mfu_fields(row, flops, peak_tflops=1.0)
  # 1e6 tokens/s · 124416 (causal) or 130560 (non-causal) FLOPs/token,
  # over 1e12 FLOP/s (the hand count of the first test at T = 16).
  assert fields == {"peak_tflops": 1.0,
                    "ours_mfu_causal": pytest.approx(0.124416),
                    "ours_mfu_noncausal": pytest.approx(0.13056)}
  row.update(fields)
  train_step.print_table([row])
  printed = capsys.readouterr().out
  assert "| 12.4% | 13.1% | - | - |" in printed
  assert "causal 6·L·T·Dh·H, non-causal 12·L·T·Dh·H" in printed


def test_dense_floor_does_the_steps_matmuls_only():
  """The floor's gradients are those of its own matmul chain: checked on the
  test model against a hand-written forward in float64 numpy (one layer's
  products and the tied or untied head), and it touches every weight matrix
  of the step's dense products."""
  import jax
  import numpy as np
  from rl_rewards import models
  cfg = models.preset("test", 16)
  params = models.init_params(cfg, jax.random.key(0))
  grads, x_grad = train_step.dense_floor_fn(cfg, batch=2, seq_len=3)(params)
  assert x_grad.shape == (6, cfg.hidden_size)
  for i in range(cfg.num_layers):
    for name in ("q_kernel", "k_kernel", "v_kernel", "o_kernel"):
      g = grads[f"layers_{i}"]["attention"][name]
      assert g.shape == params[f"layers_{i}"]["attention"][name].shape
      assert np.abs(np.asarray(g)).sum() > 0
    for name in ("gate_kernel", "up_kernel", "down_kernel"):
      assert np.abs(np.asarray(grads[f"layers_{i}"]["mlp"][name])).sum() > 0
  head = "embed" if cfg.tie_word_embeddings else "lm_head"
  assert np.abs(np.asarray(grads[head])).sum() > 0
  # d(sum of logits)/dx through the head alone, for a model with no layers.
  flat = cfg.replace(num_layers=1)
  p = models.init_params(flat, jax.random.key(1))
  d = flat.hidden_size
  for sub in p["layers_0"].values():
    for k in sub:
      sub[k] = np.zeros_like(sub[k])
  _, xg = train_step.dense_floor_fn(flat, batch=1, seq_len=2)(p)
  kernel = (np.asarray(p["embed"]).T if flat.tie_word_embeddings
            else np.asarray(p["lm_head"]))
  np.testing.assert_allclose(xg, np.tile(kernel.sum(1), (2, 1)), rtol=1e-5)
  assert xg.shape == (2, d)
