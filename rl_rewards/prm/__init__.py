"""Process reward models: labels, training, scoring, evaluation and search.

Modules:
  labels       Monte-Carlo step labels from prover rollouts (Math-Shepherd,
               PAV), OmegaPRM's binary search for the first error
  label_store  label sets on disk (JSONL shards + manifest, resumable)
  training     label arrays; PRM/PAV cross-entropy and implicit-PRM steps
  scoring      step scores [B, S] of whole solutions: score-head PRM/PAV,
               generative PRM, implicit PRM, the oracle, a random scorer
  evaluation   ProcessBench-style F1, step AUROC, Best-of-N and votes
  processbench ProcessBench-format files: reading, scoring with a PRM,
               per-file F1 / accuracies / first-error step AUROC, export
  search       step-level beam search guided by a PRM or a PAV
"""

from rl_rewards.prm.evaluation import auroc
from rl_rewards.prm.evaluation import best_of_n_accuracy
from rl_rewards.prm.evaluation import first_error_predictions
from rl_rewards.prm.evaluation import majority_vote_accuracy
from rl_rewards.prm.evaluation import pass_at_n
from rl_rewards.prm.evaluation import processbench_metrics
from rl_rewards.prm.evaluation import select_threshold
from rl_rewards.prm.evaluation import step_auroc
from rl_rewards.prm.labels import binary_search_labels
from rl_rewards.prm.labels import BinarySearch
from rl_rewards.prm.labels import math_shepherd_labels
from rl_rewards.prm.labels import monte_carlo_labels
from rl_rewards.prm.labels import PolicySampler
from rl_rewards.prm.labels import Solution
from rl_rewards.prm.scoring import generative_scorer
from rl_rewards.prm.scoring import generative_step_scores
from rl_rewards.prm.scoring import head_scorer
from rl_rewards.prm.scoring import head_step_scores
from rl_rewards.prm.scoring import implicit_scorer
from rl_rewards.prm.scoring import implicit_step_scores
from rl_rewards.prm.scoring import make_solution_batch
from rl_rewards.prm.scoring import ModelScorer
from rl_rewards.prm.scoring import OracleScorer
from rl_rewards.prm.scoring import RandomScorer
from rl_rewards.prm.scoring import SolutionBatch
from rl_rewards.prm.search import beam_search
from rl_rewards.prm.search import candidate_scores
from rl_rewards.prm.training import label_arrays
from rl_rewards.prm.training import make_implicit_step
from rl_rewards.prm.training import make_prm_step
from rl_rewards.prm.training import prm_loss
