"""GRPO on GSM8K from a Qwen2.5-style checkpoint, for one GPU/TPU host.

    python -m experiments.train --config=configs/qwen_gsm8k.py \\
        --config.model.hf_path=/path/to/Qwen2.5-Math-1.5B \\
        --config.task.train_path=/path/to/gsm8k/train.jsonl \\
        --config.task.eval_path=/path/to/gsm8k/test.jsonl \\
        --workdir=runs/qwen_gsm8k

Inputs a user provides: a Hugging Face checkpoint directory (config.json,
model.safetensors or sharded safetensors + index, tokenizer.json) of a Qwen2
or Llama model, and GSM8K-format data (`question`, `answer` ending in
"#### x") as .jsonl, .json (a list of objects), .parquet or a directory of
.parquet shards. Other layouts take `task.preset` (gsm8k, math, math500,
deepscaler, aime) and `task.fields` (dotted paths into nested rows; for
verl-style Parquet, `--config.task.preset=deepscaler
--config.task.fields=question=extra_info.question,answer=reward_model.ground_truth,solution=extra_info.answer`).
Held-out sets (`eval.sets`, NAME:PATH or NAME:PRESET:PATH) are scored with
math-verify at the end of each stage, as eval/NAME/pass@1 (mean over
`eval.sets_samples` samples) and eval/NAME/pass@K (K = eval.pass_n):

    python -m experiments.train --config=configs/qwen_gsm8k.py \\
        --config.model.hf_path=/path/to/Qwen2.5-Math-1.5B \\
        --config.task.train_path=/path/to/gsm8k/data/ \\
        --config.task.eval_path=/path/to/gsm8k/test.jsonl \\
        --config.eval.sets=math500:/path/to/math500.jsonl,aime24:aime:/path/to/aime_2024.parquet \\
        --config.eval.sets_samples=16 --config.eval.pass_n=8 \\
        --workdir=runs/qwen_gsm8k

Every file (train, eval and each set) is checked on its first row before
any work, and validated in full before it is prepared; a malformed row
fails with its file and line (JSON lines) or row (Parquet).

The model is loaded straight into the mesh shardings (parameters fully
sharded over the host's devices on the `fsdp` axis), runs in bfloat16
activations with float32 parameters, and the run starts with RL
(outcome-reward GRPO, KL 1e-3 to the initial policy); add `sft` to
`config.stages` to fine-tune on the reference solutions first. Steps are split
on blank lines ("\\n\\n"), as in PRM800K/ProcessBench-style data, for the
process-reward methods (`--config.rl.method=prime`, ...).

Memory: rows are 832 tokens (320 prompt + 512 response) and the vocabulary
151936. Layers are scanned (compile time independent of depth) and
rematerialised; the LM head runs 128 positions at a time
(`model.logits_chunk`; full [rows, 832, V] float32 logits would be 0.5 GB a
row); every update accumulates gradients over micro-batches of 16 rows
(`*.micro_batch_size`); the passes over the 512-row rollout (reference
log-probs, implicit PRM, values, verifier) run 64 rows at a time; the sampler
reads a bfloat16 copy of the policy replicated over fsdp. Planned for 8 chips
at Qwen2.5-1.5B shapes (`python -m experiments.plan --config=configs/qwen_gsm8k.py
--config.model.hf_path=configs/hf_shapes/qwen2.5-1.5b --devices=8`), every
step fits 16 GB a chip; docs/scale.md has the table for 0.5B, 1.5B and 7B.

`get_config("smoke")` shrinks lengths and batches to check the plumbing on a
small checkpoint (the test suite does this with a tiny random Qwen2).
"""

from rl_rewards import config_lib

QWEN_CHAT_PROMPT = (
    "<|im_start|>system\nPlease reason step by step, and put your final "
    "answer within \\boxed{}.<|im_end|>\n<|im_start|>user\n{question}"
    "<|im_end|>\n<|im_start|>assistant\n")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, smoke=False)
  config = config_lib.base_config()
  config.stages = "rl"
  config.model.hf_path = ""           # Set to the checkpoint directory.
  config.model.dtype = "bfloat16"
  # Sized for one 8-chip host at 1.5B (16 GB per chip; see the planner
  # table of docs/scale.md): scanned, rematerialised layers, the LM head in 128-token
  # chunks and a bfloat16 copy of the policy, replicated over fsdp, for the
  # sampler; micro-batches below.
  config.model.scan_layers = True
  config.model.remat = "full"
  config.model.logits_chunk = 128
  config.rl.sampler_dtype = "bfloat16"
  config.rl.sampler_gather_fsdp = True
  config.task.name = "gsm8k"
  config.task.prompt_template = QWEN_CHAT_PROMPT
  config.task.delimiter = "\n\n"
  config.task.max_prompt_len = 320
  config.task.max_new_tokens = 512
  config.task.max_steps = 32
  config.mesh.data = 1
  config.mesh.fsdp = -1               # Shard parameters over local devices.
  config.sft.batch_size = 64
  config.sft.learning_rate = 1e-5
  config.sft.max_steps = 500
  config.sft.target_accuracy = 1.0    # SFT runs its step budget.
  config.sft.gate_every_steps = 100
  config.sft.micro_batch_size = 16    # 4 micro-batches of the 64 rows.
  config.rl.steps = 300
  config.rl.prompts_per_step = 64
  config.rl.group_size = 8
  config.rl.learning_rate = 1e-6
  config.rl.warmup_steps = 10
  config.rl.minibatches = 4           # 128-row minibatches ...
  config.rl.micro_batch_size = 16     # ... in 8 micro-batches of 16 rows.
  config.rl.pass_micro_batch_size = 64  # Forward passes: 8 x 64 rows.
  config.prm.micro_batch_size = 16
  config.prm.pass_micro_batch_size = 64
  config.rl.kl_coef = 1e-3
  config.rl.kl_estimator = "k3"
  config.rl.eval_every_steps = 25
  config.eval.size_per_k = 1319       # The whole GSM8K test set.
  config.eval.batch_size = 256
  config.eval.pass_size = 128
  if arg.smoke:
    config.task.max_prompt_len = 64
    config.task.max_new_tokens = 24
    config.task.max_steps = 8
    config.mesh.fsdp = 1
    config.mesh.data = -1
    config.sft.batch_size = 8
    config.sft.max_steps = 2
    config.sft.gate_every_steps = 2
    config.sft.gate_eval_size = 8
    config.sft.log_every_steps = 1
    config.rl.steps = 2
    config.rl.prompts_per_step = 8
    config.rl.group_size = 2
    config.rl.minibatches = 1
    config.sft.micro_batch_size = 0
    config.rl.micro_batch_size = 8      # 2 micro-batches of the 16 rows.
    config.rl.pass_micro_batch_size = 8
    config.prm.micro_batch_size = 0
    config.prm.pass_micro_batch_size = 0
    config.rl.eval_every_steps = 1
    config.rl.checkpoint_every_steps = 1
    config.eval.size_per_k = 8
    config.eval.batch_size = 8
    config.eval.pass_size = 8
    config.eval.pass_n = 2
  return config
