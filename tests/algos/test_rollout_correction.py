"""Rollout correction against values worked out by hand (dagrl/algos/rollout_correction.py)."""

import math

import pytest
import torch

from dagrl.algos.rollout_correction import (
    CorrectionLevel,
    mismatch_metrics,
    rollout_is_weights,
    rollout_log_ratio,
    rollout_rs_mask,
)
from dagrl.core.metrics import fold, reduce_all

OLD = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -3.0]])
ROLLOUT = torch.tensor([[-1.5, -1.0, 7.0], [-0.5, -1.0, -3.0]])  # 7.0 sits under the mask
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
E = math.exp


def log_ratio():
    return rollout_log_ratio(OLD, ROLLOUT, MASK)


def test_log_ratio_is_masked_difference():
    assert torch.allclose(log_ratio(), torch.tensor([[0.5, -1.0, 0.0], [0.0, 0.5, 0.0]]))


def test_token_weights_truncate_at_threshold():
    w = rollout_is_weights(log_ratio(), MASK, CorrectionLevel.token, threshold=1.5)
    expected = torch.tensor([[1.5, E(-1.0), 0.0], [1.0, 1.5, 1.0]])  # e^0.5 = 1.65 -> 1.5
    assert torch.allclose(w, expected)
    assert not w.requires_grad


def test_sequence_weights_are_the_product_per_row():
    w = rollout_is_weights(log_ratio(), MASK, CorrectionLevel.sequence, threshold=1.5)
    # row 0: e^(0.5 - 1.0) = 0.607 on its two tokens; row 1: e^0.5 = 1.65 -> 1.5 on all three
    assert torch.allclose(w, torch.tensor([[E(-0.5), E(-0.5), 0.0], [1.5, 1.5, 1.5]]))


def test_geometric_rejection_drops_whole_rows():
    keep = rollout_rs_mask(log_ratio(), MASK, CorrectionLevel.geometric, upper=1.2, lower=0.8)
    # row 0: e^(-0.5/2) = 0.779 < 0.8 -> dropped; row 1: e^(0.5/3) = 1.18 -> kept
    assert torch.equal(keep, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))


def test_token_rejection_drops_single_tokens():
    keep = rollout_rs_mask(log_ratio(), MASK, CorrectionLevel.token, upper=2.0, lower=0.5)
    assert torch.equal(keep, torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))  # e^-1 = 0.37 < 0.5


def test_rejection_bounds_are_inclusive():
    # a ratio of exactly 1 (log-ratio 0) stays at bounds of exactly 1, as [lower, upper] says;
    # a hair inside either bound drops it
    zero = torch.zeros(2, 3)
    assert torch.equal(rollout_rs_mask(zero, MASK, CorrectionLevel.token, upper=1.0, lower=1.0), MASK.float())
    for upper, lower in ((0.999, 0.5), (2.0, 1.001)):
        keep = rollout_rs_mask(zero, MASK, CorrectionLevel.token, upper=upper, lower=lower)
        assert not keep.any(), (upper, lower)


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(OLD, ROLLOUT, MASK)
    ratios = [E(0.5), E(-1.0), 1.0, E(0.5), 1.0]
    assert m["rollout_corr/logprob_abs_diff_mean"].item() == pytest.approx(2.0 / 5)
    assert m["rollout_corr/logprob_abs_diff_max"].item() == pytest.approx(1.0)
    assert m["rollout_corr/ratio_mean"].item() == pytest.approx(sum(ratios) / 5, rel=1e-6)
    assert m["rollout_corr/ratio_min"].item() == pytest.approx(E(-1.0), rel=1e-6)
    assert m["rollout_corr/ratio_max"].item() == pytest.approx(E(0.5), rel=1e-6)


def test_identical_logprobs_give_unit_ratios():
    m = mismatch_metrics(OLD, OLD, MASK)
    assert m["rollout_corr/ratio_min"].item() == m["rollout_corr/ratio_max"].item() == 1.0
    assert m["rollout_corr/logprob_abs_diff_max"].item() == 0.0


def test_fold_keeps_extremes_and_weights_means():
    acc = {}
    fold(acc, {"a_mean": torch.tensor(1.0), "a_max": torch.tensor(3.0), "a_min": torch.tensor(2.0)}, 0.25)
    fold(acc, {"a_mean": torch.tensor(3.0), "a_max": torch.tensor(5.0), "a_min": torch.tensor(-1.0)}, 0.75)
    assert float(acc["a_mean"]) == pytest.approx(0.25 * 1 + 0.75 * 3)
    assert float(acc["a_max"]) == 5.0 and float(acc["a_min"]) == -1.0
    # across mini-batches or ranks: means average, extremes keep theirs; a key one dict lacks
    # reduces over the dicts that carry it
    merged = reduce_all(
        [{"x": 1.0, "x_max": 2.0, "y_min": 4.0}, {"x": 3.0, "x_max": 7.0, "y_min": -1.0, "z_min": 5.0}]
    )
    assert merged == {"x": 2.0, "x_max": 7.0, "y_min": -1.0, "z_min": 5.0}
