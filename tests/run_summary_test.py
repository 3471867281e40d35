"""What a run prints: the end-of-run summary and the per-step status lines."""

from rl_rewards import metrics as metrics_lib
from rl_rewards import reports

PAV_RUN = {
    "stages": {
        "sft": {"eval/accuracy": 0.491, "eval/pass@8": 0.785,
                "eval/step_accuracy": 0.9, "sft/steps": 450,
                "sft/converged": True, "sft/compute_seconds": 210.0,
                "sft/skipped_updates": 0},
        "labels": {"labels/solutions": 256, "labels/q_mean": 0.26,
                   "labels/q_auroc_vs_oracle": 0.8125,
                   "labels/first_error_vs_oracle": 0.5459,
                   "labels/path": "runs/x/labels"},
        "prm": {"prm/valid_auroc_vs_oracle": 0.78, "prm/valid_f1_at_half": 0.5,
                "prm/valid_auroc_vs_labels": 0.8, "prm/valid_abs_error": 0.3,
                "prm/steps": 100, "prm/model": "head", "prm/beta": 0.05,
                "prm/skipped_updates": 0},
        "rl": {"eval/accuracy": 0.634, "eval/pass@8": 0.955,
               "eval/math500/pass@1": 0.125, "eval/math500/pass@8": 0.25,
               "rl/steps": 75, "rl/samples": 19200, "rl/skipped_updates": 2,
               "rl/value_skipped_updates": 1},
    },
    "wall_time_s": 600.4,
    "stage_time_s": {"sft": 238.2, "labels": 40.0, "prm": 58.0, "rl": 256.0},
}


def test_the_summary_shows_accuracies_gain_verifier_and_time():
  assert reports.summary_text(PAV_RUN).splitlines() == [
      "",
      "=== summary ===",
      "   sft: held-out accuracy 0.491; pass@8 0.785; steps 450 (238 s)",
      "labels: solutions 256, Q-hat step AUROC vs checker 0.812, first error "
      "vs checker 0.546 (40 s)",
      "   prm: validation step AUROC vs checker 0.780, first-error F1 0.500, "
      "step AUROC vs its labels 0.800, |error| vs its labels 0.300, steps 100 "
      "(58 s)",
      "    rl: held-out accuracy 0.634; pass@8 0.955; math500/pass@1 0.125; "
      "steps 75 (256 s)",
      "RL gain over SFT: +0.143 held-out accuracy (0.491 -> 0.634)",
      "updates skipped (non-finite loss or gradient): rl 2, rl value 1",
      "wall time 600 s"]


def test_the_summary_of_other_stage_sets():
  # SFT alone that missed its target, and a comparison's SFT-continued
  # baseline: the gain is against both.
  text = reports.summary_text({
      "stages": {"sft": {"eval/accuracy": 0.2, "sft/steps": 9,
                         "sft/converged": False}},
      "wall_time_s": 3.0, "stage_time_s": {"sft": 2.0}})
  assert "sft: held-out accuracy 0.200; steps 9; target accuracy not " \
         "reached (2 s)" in text
  assert "RL gain" not in text and "skipped" not in text
  text = reports.summary_text({
      "stages": {"sft": {"eval/accuracy": 0.5},
                 "sft_continue": {"eval/accuracy": 0.55},
                 "rl": {"eval/accuracy": 0.6},
                 "prm_eval": {"prm_eval/auroc": 0.7,
                              "prm_eval/f1": float("nan"),
                              "prm_eval/bon16_min": 0.65}},
      "wall_time_s": 1.0})
  assert "RL gain over SFT: +0.100 held-out accuracy (0.500 -> 0.600)" in text
  assert ("RL gain over SFT continued: +0.050 held-out accuracy "
          "(0.550 -> 0.600)") in text
  # NaN: not measured.
  assert ("prm_eval: test step AUROC 0.700, first-error F1 n/a, "
          "BoN-16 (min) 0.650") in text


def test_status_lines_show_skipped_updates_only_when_there_are_some():
  keys = ("train/loss", "time/compute_s")
  record = {"train/loss": 0.5, "time/compute_s": 1.25,
            "train/skipped_updates": 0, "train/value_skipped_updates": 0}
  assert metrics_lib.format_status("sft", 3, 10, record, keys) == (
      "[sft] step 3/10  loss 0.5  compute_s 1.25")
  record.update({"train/skipped_updates": 2,
                 "train/value_skipped_updates": 1})
  assert metrics_lib.format_status("rl", 3, 10, record, keys) == (
      "[rl] step 3/10  loss 0.5  compute_s 1.25  skipped_updates 2  "
      "value_skipped_updates 1")
