"""dice_semimetric_loss: hand-derived values, JDTLoss's mIoU^D through independent closed forms (float64,
1e-9), and the semimetric properties (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softdeploy.distill import dice_semimetric_loss
from softdeploy.errors import ArgumentError

D = torch.float64


def closed_form(x: torch.Tensor, y: torch.Tensor, norm: int, s: float, alpha: float, beta: float) -> torch.Tensor:
    """Per-class Tversky loss written without the tp = (|x|+|y|-|x-y|)/2 identity: for norm 1,
    tp = sum min(x, y) ((a + b - |a - b|)/2 = min(a, b) for a, b >= 0); for norm 2, tp = <x, y>.
    x, y: [B, C, N]; sums over B and N."""
    if norm == 1:
        tp = torch.minimum(x, y).sum((0, 2))
        xc, yc = x.sum((0, 2)), y.sum((0, 2))
    else:
        tp = (x * y).sum((0, 2))
        xc, yc = (x * x).sum((0, 2)), (y * y).sum((0, 2))
    return 1 - (tp + s) / (tp + alpha * (xc - tp) + beta * (yc - tp) + s)


def test_hand_derived_values() -> None:
    x = torch.tensor([[[0.8, 0.3], [0.2, 0.7]]], dtype=D)  # [B=1, C=2, N=2], softmax over C
    y = torch.tensor([[[1.0, 0.5], [0.0, 0.5]]], dtype=D)
    logits = torch.log(x)
    # class 0: |x-y|_1 = 0.4, |x|+|y| = 2.6; class 1: 0.4 and 1.4
    got = dice_semimetric_loss(logits, y, smooth=0.0)
    assert float(got) == pytest.approx((0.4 / 2.6 + 0.4 / 1.4) / 2, abs=1e-12)
    s = 1e-3
    got = dice_semimetric_loss(logits, y, smooth=s)
    assert float(got) == pytest.approx((1 - (1.1 + s) / (1.3 + s) + 1 - (0.5 + s) / (0.7 + s)) / 2, abs=1e-12)
    # norm 2: DML_2 = 1 - 2<x,y>/(|x|^2+|y|^2): class 0: 1 - 2*0.95/(0.73+1.25); class 1: 1 - 2*0.35/(0.53+0.25)
    got = dice_semimetric_loss(logits, y, norm=2, smooth=0.0)
    assert float(got) == pytest.approx((1 - 1.9 / 1.98 + 1 - 0.7 / 0.78) / 2, abs=1e-12)
    # Jaccard (alpha = beta = 1), norm 1, s = 0: 1 - tp / (|x| + |y| - tp): class 0: 1 - 1.1/1.5, class 1: 1 - 0.5/0.9
    got = dice_semimetric_loss(logits, y, smooth=0.0, alpha=1.0, beta=1.0)
    assert float(got) == pytest.approx((1 - 1.1 / 1.5 + 1 - 0.5 / 0.9) / 2, abs=1e-12)


@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize(("alpha", "beta"), [(0.5, 0.5), (1.0, 1.0), (0.3, 0.7)])
def test_soft_labels_match_the_closed_form(norm: int, alpha: float, beta: float) -> None:
    g = torch.Generator().manual_seed(norm)
    logits = torch.randn(3, 5, 4, 6, generator=g, dtype=D)
    y = torch.softmax(2 * torch.randn(3, 5, 4, 6, generator=g, dtype=D), dim=1)
    x = torch.softmax(logits, 1).reshape(3, 5, -1)
    want = closed_form(x, y.reshape(3, 5, -1), norm, 1e-3, alpha, beta).mean()
    got = dice_semimetric_loss(logits, y, norm=norm, alpha=alpha, beta=beta)
    assert abs(float(got) - float(want)) < 1e-9


@pytest.mark.parametrize("norm", [1, 2])
def test_hard_labels_present_classes_weights_and_ignore_index(norm: int) -> None:
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 4, 9, generator=g, dtype=D)
    labels = torch.tensor([[0, 0, 1, 1, 1, 0, 255, 1, 0], [1, 0, 0, 1, 1, 255, 1, 0, 0]])  # classes 2, 3 absent
    keep = (labels != 255).unsqueeze(1).to(D)
    x = torch.softmax(logits, 1) * keep
    y = torch.nn.functional.one_hot(labels.clamp(0, 3), 4).permute(0, 2, 1).to(D) * keep
    per_class = closed_form(x, y, norm, 1e-3, 0.5, 0.5)
    got = dice_semimetric_loss(logits, labels, norm=norm, active="PRESENT", ignore_index=255)
    assert abs(float(got) - float(per_class[:2].mean())) < 1e-9
    w = [2.0, 0.5, 1.0, 1.0]
    got = dice_semimetric_loss(logits, labels, norm=norm, active="ALL", ignore_index=255, class_weights=w)
    assert abs(float(got) - float((per_class * torch.tensor(w, dtype=D)).mean())) < 1e-9


def test_hard_labels_equal_soft_dice() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 3, 10, generator=g, dtype=D)
    labels = torch.randint(0, 3, (4, 10), generator=g)
    x = torch.softmax(logits, 1)
    y = torch.nn.functional.one_hot(labels, 3).permute(0, 2, 1).to(D)
    soft_dice = 1 - 2 * (x * y).sum((0, 2)) / (x.sum((0, 2)) + y.sum((0, 2)))
    assert abs(float(dice_semimetric_loss(logits, labels, smooth=0.0)) - float(soft_dice.mean())) < 1e-12
    assert abs(float(dice_semimetric_loss(logits, y, smooth=0.0)) - float(soft_dice.mean())) < 1e-12


def test_no_active_class_keeps_the_graph() -> None:
    logits = torch.zeros(1, 3, 2, dtype=D, requires_grad=True)
    loss = dice_semimetric_loss(logits, torch.zeros(1, 3, 2, dtype=D), active="PRESENT")
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert logits.grad is not None


def test_errors() -> None:
    logits = torch.zeros(2, 3, 4)
    with pytest.raises(ArgumentError, match="norm 0"):
        dice_semimetric_loss(logits, torch.zeros(2, 3, 4), norm=0)
    with pytest.raises(ArgumentError, match="active 'SOME'"):
        dice_semimetric_loss(logits, torch.zeros(2, 3, 4), active="SOME")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="hard labels of shape \\[2, 3\\]"):
        dice_semimetric_loss(logits, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ArgumentError, match="2 class weights for 3 classes"):
        dice_semimetric_loss(logits, torch.zeros(2, 3, 4), class_weights=[1.0, 1.0])


@st.composite
def simplex_points(draw: st.DrawFn, classes: int) -> torch.Tensor:
    w = draw(st.lists(st.floats(0.0, 1.0), min_size=classes, max_size=classes).filter(lambda v: sum(v) > 1e-3))
    p = torch.tensor(w, dtype=D)
    return p / p.sum()


def _d(x: torch.Tensor, y: torch.Tensor, **kw: object) -> float:
    """The loss of prediction x (given as probabilities: logits = log x) against soft label y; one position."""
    return float(dice_semimetric_loss(torch.log(x).view(1, -1, 1), y.view(1, -1, 1), smooth=0.0, **kw))


@settings(max_examples=80, deadline=None)
@given(data=st.data(), c=st.integers(2, 6))
def test_semimetric_properties(data: st.DataObject, c: int) -> None:
    # predictions come from a softmax: strictly positive entries
    x, y, z = (data.draw(simplex_points(c)) * 0.98 + 0.02 / c for _ in range(3))
    for norm in (1, 2):
        assert _d(x, x, norm=norm) == pytest.approx(0.0, abs=1e-12)
        assert _d(x, y, norm=norm) == pytest.approx(_d(y, x, norm=norm), abs=1e-12)
        if (x - y).abs().max() > 1e-6:
            assert _d(x, y, norm=norm) > 0
    # norm 1 on simplex points: a mean over classes of |a - b| / (a + b), each a metric on [0, inf)
    assert _d(x, z) <= _d(x, y) + _d(y, z) + 1e-12
