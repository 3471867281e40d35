"""Naive NumPy references (Python loops) and random batches for core tests.

The references transcribe the published algorithms (verl, PURE, PRIME loops)
position by position, so they share no code with `rl_rewards.core`.
"""

import numpy as np


def random_batch(seed, batch=6, length=12, num_steps=None, prompt=True,
                 empty_rows=True, step_end_prob=0.3):
  """A random token batch: response mask, step-end flags, step ids.

  Rows have a random prompt prefix (mask 0), a random response length (0 for
  the first row when `empty_rows`, the full remaining width for the second,
  a truncated sample) and random delimiters. Returns a dict of NumPy arrays.
  """
  rng = np.random.default_rng(seed)
  mask = np.zeros((batch, length), np.int32)
  for b in range(batch):
    start = int(rng.integers(0, length // 3 + 1)) if prompt else 0
    size = int(rng.integers(1, length - start + 1))
    if empty_rows and b == 0:
      size = 0
    if b == 1:
      size = length - start
    mask[b, start:start + size] = 1
  ends = (rng.random((batch, length)) < step_end_prob).astype(np.int32)
  ids = step_ids_reference(ends, mask)
  s = length if num_steps is None else num_steps
  return dict(mask=mask, ends=ends, ids=ids, num_steps=s,
              rewards=rng.standard_normal((batch, length)).astype(np.float32),
              values=rng.standard_normal((batch, length)).astype(np.float32))


def step_ids_reference(step_end, mask):
  ids = np.full(mask.shape, -1, np.int32)
  for b in range(mask.shape[0]):
    valid = [t for t in range(mask.shape[1]) if mask[b, t]]
    step = 0
    for i, t in enumerate(valid):
      ids[b, t] = step
      if step_end[b, t] or i == len(valid) - 1:
        step += 1
  return ids


def step_mask_reference(ids, num_steps):
  out = np.zeros((ids.shape[0], num_steps), bool)
  for b in range(ids.shape[0]):
    for k in range(int(ids[b].max()) + 1):
      out[b, k] = True
  return out


def gae_reference(rewards, values, mask, gamma, lam):
  """verl's `compute_gae_advantage_return` loop, then masked."""
  batch, length = rewards.shape
  adv = np.zeros((batch, length))
  for b in range(batch):
    next_value, last = 0.0, 0.0
    for t in reversed(range(length)):
      delta = rewards[b, t] + gamma * next_value - values[b, t]
      candidate = delta + gamma * lam * last
      if mask[b, t]:
        next_value, last = values[b, t], candidate
      adv[b, t] = last
  adv = np.where(mask, adv, 0)
  return adv, np.where(mask, adv + values, 0)


def discounted_returns_reference(rewards, mask, gamma):
  """verl's REINFORCE++ return loop, then masked: the running return is
  reset at every invalid token (`running_return *= mask[:, t]`)."""
  batch, length = rewards.shape
  out = np.zeros((batch, length))
  for b in range(batch):
    running = 0.0
    for t in reversed(range(length)):
      running = rewards[b, t] + gamma * running
      out[b, t] = running
      running *= mask[b, t]
  return np.where(mask, out, 0)


def reward_to_go_reference(rewards, mask):
  """PRIME's `(R·m).flip(-1).cumsum(-1).flip(-1)`, then masked."""
  masked = np.where(mask, rewards, 0).astype(np.float64)
  out = np.flip(np.cumsum(np.flip(masked, -1), -1), -1)
  return np.where(mask, out, 0)


def whiten_reference(x, mask, unbiased=True, eps=1e-8):
  vals = np.asarray(x, np.float64)[np.asarray(mask, bool)]
  if vals.size == 0:
    return np.zeros_like(x, np.float64)
  mean = vals.mean()
  var = vals.var(ddof=1) if (unbiased and vals.size > 1) else (
      vals.var() if not unbiased else 0.0)
  return np.where(mask, (x - mean) / np.sqrt(var + eps), 0)


def group_advantages_reference(scores, n, estimator, eps=1e-6, ddof=1):
  out = np.zeros(len(scores))
  for start in range(0, len(scores), n):
    g = np.asarray(scores[start:start + n], np.float64)
    for i in range(n):
      if n == 1:
        out[start] = g[0] / (1 + eps) if estimator == "grpo" else g[0]
        continue
      if np.all(g == g[0]):
        out[start + i] = 0
      elif estimator == "rloo":
        out[start + i] = g[i] - (g.sum() - g[i]) / (n - 1)
      elif estimator == "drgrpo":
        out[start + i] = g[i] - g.mean()
      else:
        out[start + i] = (g[i] - g.mean()) / (g.std(ddof=ddof) + eps)
  return out


def running_min_reference(r, mask, paper=False):
  out = np.zeros(r.shape)
  for b in range(r.shape[0]):
    valid = [k for k in range(r.shape[1]) if mask[b, k]]
    if not valid:
      continue
    first_min = min(valid, key=lambda k: (r[b, k], k))
    for k in valid:
      if paper and k > first_min:
        continue
      out[b, k] = min(r[b, j] for j in valid if j >= k)
  return out


def softmin_reference(r, mask, temperature):
  out = np.zeros(r.shape)
  for b in range(r.shape[0]):
    valid = [k for k in range(r.shape[1]) if mask[b, k]]
    if not valid:
      continue
    logits = np.array([-r[b, k] / temperature for k in valid], np.float64)
    w = np.exp(logits - logits.max())
    w /= w.sum()
    for i, k in enumerate(valid):
      out[b, k] = w[i] * r[b, k]
  return out


def pure_token_min_reference(token_rewards, mask):
  """PURE (verl branch) strict min-form: loop over positions."""
  returns = np.where(mask, token_rewards, 0).astype(np.float64)
  for c in reversed(range(returns.shape[1] - 1)):
    returns[:, c] = np.minimum(returns[:, c], returns[:, c + 1])
  return np.where(mask, returns, 0)
