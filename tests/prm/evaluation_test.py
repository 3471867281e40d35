"""PRM metrics on hand-made score tables, against hand computations and
naive references (docs/algorithms.md, TV-14, TV-17)."""

import numpy as np
import pytest

from rl_rewards.prm import evaluation


class TestProcessBench:

  def test_tv17_metric(self):
    labels = [2, 0, 3, 1, -1, -1]
    predictions = [2, 1, 3, -1, -1, 0]
    out = evaluation.processbench_metrics(labels, predictions)
    assert out["acc_err"] == 0.5 and out["acc_cor"] == 0.5
    assert out["f1"] == pytest.approx(0.5)
    assert (out["num_err"], out["num_cor"]) == (4, 2)

  def test_tv17_threshold_rule(self):
    scores = np.array([[0.9, 0.8, 0.3, 0.7]])
    mask = np.ones((1, 4), bool)
    assert evaluation.first_error_predictions(scores, mask, 0.5)[0] == 2
    assert evaluation.first_error_predictions(scores, mask, 0.29)[0] == -1
    # A score equal to τ is wrong (ProcessBench: argmax, ties to wrong).
    assert evaluation.first_error_predictions(scores, mask, 0.3)[0] == 2

  def test_invalid_steps_never_predicted(self):
    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.0, 0.0]])
    mask = np.array([[True, False, False], [True, True, False]])
    np.testing.assert_array_equal(
        evaluation.first_error_predictions(scores, mask, 0.5), [-1, 0])

  def test_f1_harmonic_mean_and_degenerate_sets(self):
    out = evaluation.processbench_metrics([0, 1, -1], [0, 0, -1])
    assert out["acc_err"] == 0.5 and out["acc_cor"] == 1.0
    assert out["f1"] == pytest.approx(2 * 0.5 / 1.5)
    assert evaluation.processbench_metrics([0], [1])["f1"] != 0.5
    assert np.isnan(evaluation.processbench_metrics([0, 1], [0, 1])["f1"])
    assert evaluation.processbench_metrics([0, -1], [1, 0])["f1"] == 0.0

  def test_select_threshold_on_validation(self):
    # Erroneous solutions have a first wrong step at 0.3; correct ones have
    # every step at >= 0.6: any threshold in (0.3, 0.6] is perfect.
    scores = np.array([[0.9, 0.3, 0.2], [0.3, 0.9, 0.9], [0.6, 0.7, 0.8],
                       [0.9, 0.9, 0.6]])
    mask = np.ones(scores.shape, bool)
    labels = [1, 0, -1, -1]
    threshold, f1 = evaluation.select_threshold(scores, mask, labels)
    assert 0.3 < threshold <= 0.6 and f1 == 1.0
    assert threshold == 0.5  # Ties go to the threshold closest to 0.5.
    # Without correct solutions F1 is undefined: the default 0.5.
    threshold, f1 = evaluation.select_threshold(scores[:2], mask[:2],
                                                labels[:2])
    assert threshold == 0.5 and np.isnan(f1)

  def test_shape_errors(self):
    with pytest.raises(ValueError, match="step_mask"):
      evaluation.first_error_predictions(np.zeros((2, 3)),
                                         np.zeros((2, 2), bool), 0.5)
    with pytest.raises(ValueError, match="predictions"):
      evaluation.processbench_metrics([1, 2], [1])


class TestAuroc:

  def test_hand_computed(self):
    # Pairs (pos, neg): (.35,.1) (.35,.4) (.8,.1) (.8,.4): 3 of 4 right.
    assert evaluation.auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert evaluation.auroc([0.5, 0.5], [0, 1]) == 0.5
    assert evaluation.auroc([0.2, 0.9], [0, 1]) == 1.0
    assert np.isnan(evaluation.auroc([0.2, 0.9], [1, 1]))

  def test_matches_pairwise_reference_with_ties(self):
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 60) / 4.0
    labels = rng.integers(0, 2, 60)
    pairs = [(s_p > s_n) + 0.5 * (s_p == s_n)
             for s_p, l_p in zip(scores, labels) if l_p
             for s_n, l_n in zip(scores, labels) if not l_n]
    assert evaluation.auroc(scores, labels) == pytest.approx(np.mean(pairs))

  def test_step_auroc_uses_valid_steps_only(self):
    scores = np.array([[0.9, 0.2, 0.99], [0.8, 0.1, 0.0]])
    mask = np.array([[True, True, False], [True, True, False]])
    labels = np.array([[1, 0, 0], [1, 0, 1]])
    assert evaluation.step_auroc(scores, mask, labels) == 1.0


class TestBestOfN:

  def test_hand_computed(self):
    scores = np.array([[0.1, 0.9, 0.5, 0.2]])
    correct = np.array([[1, 0, 1, 0]])
    assert evaluation.best_of_n_accuracy(scores, correct, 4) == 0.0
    assert evaluation.best_of_n_accuracy(scores, correct, 2) == 0.5
    assert evaluation.best_of_n_accuracy(scores, correct, 1) == 0.5
    assert evaluation.pass_at_n(correct, 4) == 1.0
    assert evaluation.pass_at_n(np.array([[0, 0, 1, 0]]), 2) == 0.5
    # Ties go to the first sample of the group.
    assert evaluation.best_of_n_accuracy([[0.5, 0.5]], [[1, 0]], 2) == 1.0
    assert evaluation.best_of_n_accuracy([[0.5, 0.5]], [[0, 1]], 2) == 0.0

  def test_matches_loop_reference(self):
    rng = np.random.default_rng(1)
    scores = rng.random((5, 12))
    correct = rng.integers(0, 2, (5, 12))
    for n in (1, 2, 3, 4, 5, 12):
      total = []
      for p in range(5):
        for start in range(0, 12 // n * n, n):
          best = max(range(start, start + n), key=lambda i: scores[p, i])
          total.append(correct[p, best])
      assert evaluation.best_of_n_accuracy(scores, correct, n) == (
          pytest.approx(np.mean(total)))

  def test_majority_and_weighted_votes(self):
    answers = [["a", "b", "a", None]]
    correct = np.array([[1, 0, 1, 0]])
    assert evaluation.majority_vote_accuracy(answers, correct, 4) == 1.0
    weights = np.array([[0.1, 0.9, 0.1, 0.0]])
    assert evaluation.majority_vote_accuracy(answers, correct, 4,
                                             weights=weights) == 0.0
    # Groups of 2: {a, b} tie -> first ("a", right); {a, None} -> a.
    assert evaluation.majority_vote_accuracy(answers, correct, 2) == 1.0
    # Nobody votes: wrong.
    assert evaluation.majority_vote_accuracy([[None, None]], [[1, 1]],
                                             2) == 0.0

  def test_votes_match_counter_reference(self):
    rng = np.random.default_rng(2)
    answers = [[rng.choice(["1", "2", "3", None]) for _ in range(8)]
               for _ in range(6)]
    truth = ["1", "2", "3", "1", "2", "3"]
    correct = np.array([[a == t for a in row] for row, t in
                        zip(answers, truth)], float)
    for n in (2, 4, 8):
      got = evaluation.majority_vote_accuracy(answers, correct, n)
      want = []
      for p, row in enumerate(answers):
        for start in range(0, 8, n):
          group = [a for a in row[start:start + n] if a is not None]
          if not group:
            want.append(0.0)
            continue
          counts = {a: group.count(a) for a in group}
          top = max(counts.values())
          winner = next(a for a in group if counts[a] == top)
          want.append(float(winner == truth[p]))
      assert got == pytest.approx(np.mean(want))

  def test_bad_n(self):
    with pytest.raises(ValueError, match="n must be"):
      evaluation.best_of_n_accuracy(np.zeros((2, 4)), np.zeros((2, 4)), 5)
