"""The task as the runner sees it: problems, prompts, references and scores.

A thin adapter over `rl_rewards.tasks` so that the stages never touch a
particular task's module: they ask for problems of a split, format prompts,
get reference solutions for SFT, and score decoded responses (outcome reward
plus the ground-truth step labels when the task has them).
"""

import dataclasses
import os

from absl import logging
import jax
import numpy as np

from rl_rewards import config_data
from rl_rewards import config_lib
from rl_rewards import errors
from rl_rewards.data import builders
from rl_rewards.data import pipeline as data_pipeline
from rl_rewards.data import readers
from rl_rewards.envs import batched as batched_env
from rl_rewards.rollout import episodes
from rl_rewards.tasks import arith
from rl_rewards.tasks import hidden_operands
from rl_rewards.tasks import reasoning_gym_tasks
from rl_rewards.tasks import segmentation
from rl_rewards.tasks import tokenizer as tokenizer_lib
from rl_rewards.tasks import verifiers

# Problem indices of the RL prompt stream start here, so RL never sees the
# problems SFT was trained on (both come from the "train" split).
RL_INDEX_OFFSET = 10_000_000


def answer_width(task_config) -> int:
  """L of `answer_tokens` for the arith and hidden_operands tasks: "#", a
  sign, the digits of `max_value` and the end (EOS or end of turn)."""
  return len(str(task_config.max_value)) + 3


def _answer_arrays(token_lists, width: int):
  """(tokens [N, width] int32, mask [N, width] int32), right-padded with 0."""
  tokens = np.zeros((len(token_lists), width), np.int32)
  for row, ids in enumerate(token_lists):
    if len(ids) > width:
      raise errors.InputError(
          f"answer {ids} of row {row} is longer than {width} tokens.")
    tokens[row, :len(ids)] = ids
  mask = (np.arange(width)[None, :] <
          np.array([len(ids) for ids in token_lists])[:, None])
  return tokens, mask.astype(np.int32)


@dataclasses.dataclass(frozen=True)
class Scored:
  """Verdicts for a batch of responses (host numpy arrays)."""
  rewards: np.ndarray          # [N] float32 outcome rewards.
  num_steps: np.ndarray        # [N] int32 steps in each response.
  first_error: np.ndarray      # [N] int32, -1 when every step is correct.
  empty_steps: np.ndarray      # [N] int32 steps with no text.
  step_labels: list            # N lists of bools (ground-truth step labels).


class _PromptEncoding:
  """Prompt/SFT encoding shared by the tasks (the sampler's layout)."""

  # The model's embedding rows (set by the pipeline once the model is known);
  # token masks are padded to it when it exceeds the tokenizer's vocabulary.
  model_vocab_size = None

  # Names of the extra held-out sets (`config.eval.sets`).
  eval_set_names = ()

  def prompts(self, problems) -> list[str]:
    return [p.question for p in problems]

  def encode_prompts(self, problems):
    return tokenizer_lib.encode_prompts(
        self.tokenizer, self.prompts(problems), self.max_prompt_len)

  def encode_sft(self, problems):
    return tokenizer_lib.encode_sft_batch(
        self.tokenizer, self.prompts(problems), self.references(problems),
        max_prompt_len=self.max_prompt_len,
        max_len=self.max_prompt_len + self.max_new_tokens)

  def delimiter_mask(self) -> np.ndarray:
    return self.tokenizer.delimiter_mask(self.delimiter,
                                         self.model_vocab_size)

  def split_steps(self, text: str) -> list[str]:
    return segmentation.split_steps(text, self.delimiter)


class ArithTask(_PromptEncoding):
  """The embedded arithmetic task (docs/arith_task.md), with step labels."""

  has_step_labels = True

  def __init__(self, task_config, seed: int):
    self.config = arith.ArithConfig(
        min_ops=task_config.min_ops, max_ops=task_config.max_ops,
        max_value=task_config.max_value, fixed_width=task_config.fixed_width,
        seed=seed)
    self.delimiter = task_config.delimiter
    self.tokenizer = tokenizer_lib.CharTokenizer()
    self.max_prompt_len = task_config.max_prompt_len
    self.max_new_tokens = task_config.max_new_tokens

  @property
  def ops_range(self):
    return range(self.config.min_ops, self.config.max_ops + 1)

  def problems(self, split: str, start: int, count: int):
    return arith.make_problems(self.config, split, range(start, start + count))

  def problems_per_k(self, split: str, size_per_k: int):
    """`size_per_k` problems for each number of operations, k-major."""
    out = []
    for k in self.ops_range:
      config_k = dataclasses.replace(self.config, min_ops=k, max_ops=k)
      out.extend(arith.make_problems(config_k, split, range(size_per_k)))
    return out

  def num_ops(self, problems) -> np.ndarray:
    return np.array([p.num_ops for p in problems], np.int32)

  def references(self, problems) -> list[str]:
    return [arith.reference_solution(p, self.delimiter) for p in problems]

  def answer_tokens(self, problems):
    """The true final answer as the policy writes it after its last step:
    the answer line ("#015") and EOS. Returns (tokens, mask) [N, L] int32,
    L = `answer_width`."""
    eos = self.tokenizer.stop_ids[0]
    return _answer_arrays(
        [self.tokenizer.encode(arith.reference_lines(p)[-1]) + [eos]
         for p in problems], self._answer_width)

  @property
  def _answer_width(self) -> int:
    return len(str(self.config.max_value)) + 3

  def decode_responses(self, tokens: np.ndarray, response_mask: np.ndarray):
    """Response texts (without EOS) of sampled rows [N, P + G]."""
    texts = []
    for row, mask in zip(tokens, response_mask):
      texts.append(self.tokenizer.decode(row[mask.astype(bool)]))
    return texts

  def score(self, problems, texts, finished) -> Scored:
    """Outcome rewards and ground-truth step labels of decoded responses."""
    n = len(texts)
    rewards = np.zeros((n,), np.float32)
    num_steps = np.zeros((n,), np.int32)
    first_error = np.zeros((n,), np.int32)
    empty = np.zeros((n,), np.int32)
    labels = []
    for i, (problem, text, done) in enumerate(zip(problems, texts, finished)):
      verdict = arith.check_solution(problem, text, self.delimiter)
      rewards[i] = float(bool(done) and verdict.answer_correct)
      num_steps[i] = verdict.num_steps
      first_error[i] = verdict.first_error
      empty[i] = sum(1 for step in self.split_steps(text) if not step)
      labels.append(verdict.labels)
    return Scored(rewards=rewards, num_steps=num_steps,
                  first_error=first_error, empty_steps=empty,
                  step_labels=labels)


class HiddenOperandsTask(ArithTask):
  """The embedded multi-turn task (`tasks.hidden_operands`): the chains of
  the arithmetic task behind a lookup tool, one line per turn.

  A response is an episode (`rollout.episodes.sample_episodes`): the policy's
  turns with the tool's observations between them, `max_new_tokens` slots
  for both. Its outcome reward is the final answer's (the environment's
  reward on the answer turn) and its step labels are the per-turn oracle
  labels (`hidden_operands.label_turns`), so a turn plays the part of a
  step. `score` takes each episode's list of turn texts where the
  single-turn tasks take a response text. An SFT demonstration is an
  optimal episode (`hidden_operands.reference_actions`) with its tool
  observations, which are masked out of the loss.
  """

  multi_turn = True

  def __init__(self, task_config, seed: int):
    super().__init__(task_config, seed)
    self.hidden = hidden_operands.HiddenOperandsConfig(
        chains=self.config, num_distractors=task_config.num_distractors)
    self.tokenizer = hidden_operands.make_tokenizer()
    self.max_turns = task_config.max_turns
    self.max_turn_tokens = task_config.max_turn_tokens
    self.max_observation_tokens = task_config.max_observation_tokens
    self.end_of_turn_ids = tuple(
        self.tokenizer.encode(hidden_operands.END_OF_TURN))

  def problems(self, split: str, start: int, count: int):
    return hidden_operands.make_problems(self.hidden, split,
                                         range(start, start + count))

  def problems_per_k(self, split: str, size_per_k: int):
    """`size_per_k` problems for each number of operations, k-major."""
    out = []
    for k in self.ops_range:
      chains = dataclasses.replace(self.config, min_ops=k, max_ops=k)
      out.extend(hidden_operands.make_problems(
          dataclasses.replace(self.hidden, chains=chains), split,
          range(size_per_k)))
    return out

  def num_ops(self, problems) -> np.ndarray:
    return np.array([p.chain.num_ops for p in problems], np.int32)

  def references(self, problems) -> list[str]:
    return ["".join(hidden_operands.reference_actions(p)) for p in problems]

  def answer_tokens(self, problems):
    """The answer turn of an optimal episode ("#015" and the end of turn),
    as (tokens, mask) [N, L] int32, L = `answer_width`."""
    return _answer_arrays(
        [self.tokenizer.encode(hidden_operands.reference_actions(p)[-1])
         for p in problems], self._answer_width)

  def encode_sft(self, problems):
    """SFT rows of optimal episodes, in the episodes' layout.

    Each row is the left-padded prompt, then the reference turns, each but
    the last followed by the tool's observation ("get xi" -> "xi=V"; none
    after a computation); `loss_mask` is 1 on the turns' tokens only.

    Returns:
      dict with int32 [B, P + G] `tokens`, `loss_mask`, `attention_mask`.
    """
    tokenizer = self.tokenizer
    prompt_len, width = self.max_prompt_len, self.max_new_tokens
    tokens, mask = self.encode_prompts(problems)
    batch = len(problems)
    out_tokens = np.full((batch, prompt_len + width), tokenizer.pad_id,
                         np.int32)
    loss_mask = np.zeros((batch, prompt_len + width), np.int32)
    attention = np.zeros((batch, prompt_len + width), np.int32)
    out_tokens[:, :prompt_len] = tokens
    attention[:, :prompt_len] = mask
    for row, problem in enumerate(problems):
      ids, trained = [], []
      state = hidden_operands.EpisodeState()
      actions = hidden_operands.reference_actions(problem)
      for i, action in enumerate(actions):
        turn = tokenizer.encode(action)
        ids += turn
        trained += [1] * len(turn)
        observation = hidden_operands.transition(problem, state,
                                                 action).observation
        if observation and i + 1 < len(actions):
          obs = tokenizer.encode(observation)[:self.max_observation_tokens]
          ids += obs
          trained += [0] * len(obs)
      if len(ids) > width:
        raise config_lib.ConfigError(
            f"config.task.max_new_tokens={width}: the optimal episode of a "
            f"{problem.chain.num_ops}-operation problem takes {len(ids)} "
            "tokens (turns and observations).")
      span = slice(prompt_len, prompt_len + len(ids))
      out_tokens[row, span] = ids
      loss_mask[row, span] = trained
      attention[row, span] = 1
    return {"tokens": out_tokens, "loss_mask": loss_mask,
            "attention_mask": attention}

  def sample_episodes(self, model_config, params, problems, rng, *,
                      temperature: float, top_p: float = 1.0,
                      num_samples: int = 1):
    """Episodes of `problems`, `num_samples` contiguous rows each.

    Returns:
      the `episodes.EpisodeOutput` (host numpy arrays).
    """
    if jax.process_count() > 1:
      raise config_lib.ConfigError(
          "config.task.name='hidden_operands': episodes are sampled by one "
          "process; run it on a single host.")
    rows = [p for p in problems for _ in range(num_samples)]
    envs = batched_env.BatchedEnv(hidden_operands.HiddenOperandsEnv)
    return episodes.sample_episodes(
        model_config, params, envs, rows, self.tokenizer, rng,
        **self._episode_limits(temperature, top_p))

  def continue_episodes(self, model_config, params, problems, prefix_turns,
                        rng, *, temperature: float, top_p: float = 1.0):
    """Episodes of `problems` that go on after `prefix_turns` (one row each,
    every row with the same number of turns; `episodes.continue_episodes`:
    the environment's state is restored by replaying the prefix's turns
    through a fresh `HiddenOperandsEnv`, which is deterministic).

    Returns:
      the `episodes.EpisodeOutput` of the whole episodes (host numpy).
    """
    if jax.process_count() > 1:
      raise config_lib.ConfigError(
          "config.task.name='hidden_operands': episodes are sampled by one "
          "process; run it on a single host.")
    envs = batched_env.BatchedEnv(hidden_operands.HiddenOperandsEnv)
    return episodes.continue_episodes(
        model_config, params, envs, list(problems), prefix_turns,
        self.tokenizer, rng, **self._episode_limits(temperature, top_p))

  def _episode_limits(self, temperature, top_p):
    """The episode samplers' keyword arguments from the task config."""
    return dict(
        max_prompt_len=self.max_prompt_len,
        max_episode_tokens=self.max_new_tokens, max_turns=self.max_turns,
        max_turn_tokens=self.max_turn_tokens,
        max_observation_tokens=self.max_observation_tokens,
        end_of_turn_ids=self.end_of_turn_ids, eos_id=self.tokenizer.stop_ids,
        pad_id=self.tokenizer.pad_id, temperature=temperature, top_p=top_p,
        num_tokens=self.tokenizer.vocab_size)

  def decode_responses(self, tokens, response_mask):
    raise NotImplementedError(
        "hidden_operands responses are episodes: score their turn texts "
        "(EpisodeOutput.actions).")

  def score(self, problems, texts, finished) -> Scored:
    """Outcome rewards and per-turn labels of episodes.

    Args:
      problems: the problem of each episode.
      texts: N lists of turn texts (`EpisodeOutput.actions`).
      finished: N bools (unused: an episode scores 1 iff its answer turn
        gave the right answer, which ends it).
    """
    del finished
    n = len(texts)
    rewards = np.zeros((n,), np.float32)
    num_steps = np.zeros((n,), np.int32)
    first_error = np.zeros((n,), np.int32)
    empty = np.zeros((n,), np.int32)
    labels = []
    for i, (problem, turns) in enumerate(zip(problems, texts)):
      verdict = hidden_operands.label_turns(problem, turns)
      rewards[i] = float(verdict.answer_correct)
      num_steps[i] = len(turns)
      first_error[i] = verdict.first_error
      empty[i] = sum(1 for turn in turns if not turn.strip())
      labels.append(verdict.labels)
    return Scored(rewards=rewards, num_steps=num_steps,
                  first_error=first_error, empty_steps=empty,
                  step_labels=labels)


@dataclasses.dataclass(frozen=True)
class TextProblem:
  """One question of a text dataset."""
  question: str
  answer: str          # The reference final answer.
  solution: str        # The reference solution (SFT target).
  index: int
  entry: object = None  # The reasoning-gym entry (for its scorer).


# Verifier outcomes that are logged when they happen.
_TROUBLE = ("timeouts", "errors", "crashes", "wrong_type", "oversize")


class TextTask(_PromptEncoding):
  """A question/answer dataset: GSM8K/MATH-style data files, or reasoning-gym.

  Files are read by `rl_rewards.data.readers` (JSONL, JSON, Parquet or a
  directory of Parquet shards) with the field map of `task.preset` and
  `task.fields`; every file, the held-out sets of `eval.sets` included, is
  checked on its first row before any is prepared. Records come from tfds
  builders prepared as array_record in `<workdir>/data` (no TensorFlow); the
  train split is visited in a permutation reshuffled every epoch (seeded),
  so the problems of any index are a pure function of (seed, index).
  Outcome rewards come from the verifier of the dataset kind (GSM8K numeric
  match, math-verify in a process pool, reasoning-gym's own scorer; the
  held-out sets always use math-verify), each call with a time and size
  limit. These datasets have no ground-truth step labels.
  """

  has_step_labels = False
  _VERIFIER = {"gsm8k": "gsm8k", "math": "math",
               "reasoning_gym": "reasoning_gym"}
  # The verifier of the `eval.sets` problems.
  EVAL_SET_VERIFIER = "math"

  def __init__(self, task_config, seed: int, tokenizer, data_dir: str,
               eval_sets=()):
    self.kind = task_config.name
    # What the verifier did: the last batch, and all batches so far.
    self.last_verifier_stats = verifiers.VerifierStats()
    self.verifier_stats_total = verifiers.VerifierStats()
    self.seed = seed
    self.delimiter = task_config.delimiter
    self.tokenizer = tokenizer
    self.max_prompt_len = task_config.max_prompt_len
    self.max_new_tokens = task_config.max_new_tokens
    self.verifier_timeout_s = task_config.verifier_timeout_s
    # Reasoning-gym entries have no solution; SFT trains on the answer.
    self.has_references = True
    files = []  # (config key, path, field map) of every data file.
    if self.kind != "reasoning_gym":
      fields = config_data.task_fields(task_config)
      self.has_references = fields.has_solution
      for key in ("train_path", "eval_path"):
        if not task_config[key]:
          raise config_lib.ConfigError(
              f"config.task.{key}: the {self.kind} task needs a data file.")
        files.append((f"task.{key}", task_config[key], fields))
    files.extend((f"eval.sets ({s.name})", s.path, s.fields)
                 for s in eval_sets)
    for key, path, fields in files:
      # Before any file is prepared: each exists and its first row maps.
      try:
        readers.check_first_record(path, fields)
      except errors.InputError as e:
        raise config_lib.ConfigError(f"config.{key}: {e}") from None
    if self.kind == "reasoning_gym":
      builder = builders.reasoning_gym_task(
          task_config.dataset, {"train": task_config.train_size,
                                "eval": task_config.eval_size}, seed, data_dir)
      self._rg = {split: reasoning_gym_tasks.create_dataset(
          task_config.dataset, size, builder.builder_config.split_seed(split))
                  for split, size in (("train", task_config.train_size),
                                      ("eval", task_config.eval_size))}
    else:
      builder = _text_files(
          "task.train_path/eval_path", {"train": task_config.train_path,
                                        "eval": task_config.eval_path},
          data_dir, files[0][2])
      self._rg = None
    self._sources = {split: builders.data_source(builder, split)
                     for split in ("train", "eval")}
    for eval_set in eval_sets:
      self._sources["set_" + eval_set.name] = builders.data_source(
          _text_files(f"eval.sets ({eval_set.name})", {"eval": eval_set.path},
                      data_dir, eval_set.fields), "eval")
    self.eval_set_names = tuple(s.name for s in eval_sets)

  def _record(self, split, index):
    record = self._sources[split][index]
    rg_split = self._rg.get(split) if self._rg else None
    entry = rg_split[index] if rg_split is not None else None
    text = data_pipeline.as_text
    solution = text(record["solution"])
    if rg_split is not None:
      solution = solution or text(record["answer"])
    return TextProblem(question=text(record["question"]),
                       answer=text(record["answer"]), solution=solution,
                       index=int(index), entry=entry)

  def eval_set_problems(self, name: str, size: int = 0):
    """The first `size` problems of held-out set `name` (0: all, in order)."""
    source = self._sources["set_" + name]
    count = len(source) if size <= 0 else min(size, len(source))
    return [self._record("set_" + name, i) for i in range(count)]

  def problems(self, split: str, start: int, count: int):
    """Problems start..start+count-1 of a split (train: epoch-shuffled)."""
    source_split = "train" if split == "train" else "eval"
    size = len(self._sources[source_split])
    out = []
    for i in range(start, start + count):
      epoch, position = divmod(i, size)
      if source_split == "train":
        perm = np.random.default_rng([self.seed, epoch]).permutation(size)
        position = int(perm[position])
      out.append(self._record(source_split, position))
    return out

  def problems_per_k(self, split: str, size: int):
    """The first `size` held-out problems (text tasks have no k)."""
    del split
    return [self._record("eval", i)
            for i in range(min(size, len(self._sources["eval"])))]

  ops_range = range(1)

  def num_ops(self, problems):
    del problems
    return None

  def references(self, problems):
    if not self.has_references:
      raise config_lib.ConfigError(
          "config.task.fields: the data has no reference solutions (map one "
          "with task.fields=solution=PATH); SFT needs them.")
    return [p.solution for p in problems]

  def decode_responses(self, tokens, response_mask):
    return [self.tokenizer.decode(row[mask.astype(bool)], errors="replace")
            for row, mask in zip(tokens, response_mask)]

  def score(self, problems, texts, finished, *, verifier=None) -> Scored:
    """Outcome rewards of decoded responses.

    Args:
      problems: the problem of each response.
      texts: N response texts.
      finished: N bools; an unfinished (truncated) response scores 0.
      verifier: the verifier kind; None: the task's own.
    """
    kind = verifier or self._VERIFIER[self.kind]
    predictions = [t if done else None for t, done in zip(texts, finished)]
    if kind == "reasoning_gym":
      # The answer is the last non-empty line of the response.
      predictions = [None if p is None else
                     (p.strip().splitlines() or [""])[-1] for p in predictions]
      references = [p.entry for p in problems]
    elif kind == "gsm8k":
      references = [f"#### {p.answer}" for p in problems]
    else:
      references = [p.answer for p in problems]
    rewards, stats = verifiers.verify_batch(
        kind, predictions, references, timeout_s=self.verifier_timeout_s)
    self.last_verifier_stats = stats
    self.verifier_stats_total = self.verifier_stats_total + stats
    trouble = {k: v for k, v in stats.as_dict().items()
               if k in _TROUBLE and v}
    if trouble:
      # Each of these scored 0; none stalls training (verifiers.py).
      logging.warning("verifier %s: %s of %d calls (max call %.2f s); since "
                      "the start: %s", kind, trouble, stats.calls,
                      stats.max_call_s,
                      {k: v for k, v in self.verifier_stats_total.as_dict()
                       .items() if k in _TROUBLE or k == "calls"})
    n = len(texts)
    num_steps = np.array([len(self.split_steps(t)) for t in texts], np.int32)
    empty = np.array([sum(1 for s in self.split_steps(t) if not s)
                      for t in texts], np.int32)
    return Scored(rewards=rewards.astype(np.float32), num_steps=num_steps,
                  first_error=np.full((n,), -1, np.int32), empty_steps=empty,
                  step_labels=[[] for _ in range(n)])


def _text_files(key, split_files, data_dir, fields):
  """`builders.text_files`, its data errors prefixed with the config key."""
  try:
    return builders.text_files(split_files, data_dir, fields)
  except errors.InputError as e:
    raise config_lib.ConfigError(f"config.{key}: {e}") from None


def make_task(task_config, seed: int, *, tokenizer=None, workdir: str = "",
              eval_sets=()):
  """Builds the task named by `config.task.name`.

  Args:
    task_config: the `task` section.
    seed: the run's seed.
    tokenizer: the HF tokenizer of a text task.
    workdir: data is prepared under `<workdir>/data`.
    eval_sets: the held-out sets, `config_data.eval_sets(config)`.
  """
  if task_config.name == "arith":
    if eval_sets:
      raise config_lib.ConfigError(
          "config.eval.sets: held-out sets are for text tasks.")
    return ArithTask(task_config, seed)
  if task_config.name == "hidden_operands":
    if eval_sets:
      raise config_lib.ConfigError(
          "config.eval.sets: held-out sets are for text tasks.")
    return HiddenOperandsTask(task_config, seed)
  if task_config.name in ("gsm8k", "math", "reasoning_gym"):
    if tokenizer is None:
      raise ValueError(
          f"config.task.name={task_config.name!r} needs a real tokenizer: set "
          "config.model.hf_path (with tokenizer.json) or "
          "config.model.tokenizer_path.")
    return TextTask(task_config, seed, tokenizer,
                    os.path.join(workdir, "data"), eval_sets=eval_sets)
  raise ValueError(f"config.task.name: unknown task {task_config.name!r}.")
