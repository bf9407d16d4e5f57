//! Shape contracts: `check` returns typed errors naming the tensor and the dimensions, and
//! `forward` panics with the same message before computing anything.

use burn::tensor::{Bool, Device, Tensor};
use infembed_losses::{
    Error, LossBatch, LossConfig, NegativeMask, ObjectiveKind, Variable, VariableSet,
};

fn device() -> Device {
    Device::flex()
}

fn zeros2(shape: [usize; 2]) -> Tensor<2> {
    Tensor::zeros(shape, &device())
}

fn all_loss() -> infembed_losses::ContrastiveLoss {
    LossConfig::new(
        ObjectiveKind::Multivariate,
        &[Variable::P, Variable::I, Variable::Iq],
    )
    .init()
    .unwrap()
}

#[test]
fn mismatched_iq_is_reported() {
    let batch = LossBatch::new(zeros2([4, 8]), zeros2([4, 7]));
    let err = batch.check(VariableSet::of(&[Variable::P])).unwrap_err();
    assert!(matches!(&err, Error::Shape { tensor: "iq", actual, .. } if actual == &vec![4, 7]));
    assert!(err.to_string().contains("[B, d] = [4, 8]"), "{err}");
}

#[test]
fn mismatched_instruction_negatives_and_masks_are_reported() {
    let base = LossBatch::new(zeros2([3, 5]), zeros2([3, 5]));
    let bad_instr = base
        .clone()
        .with_instruction_negatives(Tensor::zeros([3, 2, 4], &device()));
    let err = bad_instr.check(VariableSet::ALL).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                tensor: "iq_instr",
                ..
            }
        ),
        "{err}"
    );

    let with_instr = base.with_instruction_negatives(Tensor::zeros([3, 2, 5], &device()));
    let bad_mask = with_instr.clone().with_mask(NegativeMask {
        passages: Some(Tensor::<2, Bool>::empty([3, 2], &device())),
        ..NegativeMask::default()
    });
    let err = bad_mask.check(VariableSet::ALL).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                tensor: "mask.passages",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("[B, B] = [3, 3]"), "{err}");

    let bad_instr_mask = with_instr.clone().with_mask(NegativeMask {
        instructions: Some(Tensor::<2, Bool>::empty([3, 3], &device())),
        ..NegativeMask::default()
    });
    let err = bad_instr_mask.check(VariableSet::ALL).unwrap_err();
    assert!(err.to_string().contains("[B, K] = [3, 2]"), "{err}");

    let bad_extra = with_instr
        .clone()
        .with_extra_passages(Tensor::zeros([4, 6], &device()));
    let err = bad_extra.check(VariableSet::ALL).unwrap_err();
    assert!(err.to_string().contains("[M, d] = [M, 5]"), "{err}");
    let bad_extra_mask = with_instr
        .clone()
        .with_extra_passages(Tensor::zeros([4, 5], &device()))
        .with_mask(NegativeMask {
            extra_passages: Some(Tensor::<2, Bool>::empty([3, 3], &device())),
            ..NegativeMask::default()
        });
    let err = bad_extra_mask.check(VariableSet::ALL).unwrap_err();
    assert!(err.to_string().contains("[B, M] = [3, 4]"), "{err}");

    assert_eq!(with_instr.check(VariableSet::ALL).unwrap(), (3, 2, 5));
}

#[test]
fn missing_instruction_negatives_are_reported_only_when_needed() {
    let batch = LossBatch::new(zeros2([3, 5]), zeros2([3, 5]));
    assert!(
        batch
            .check(VariableSet::of(&[Variable::P, Variable::Iq]))
            .is_ok()
    );
    let err = all_loss().check(&batch).unwrap_err();
    assert!(matches!(
        err,
        Error::MissingTensor {
            variable: Variable::I,
            tensor: "iq_instr"
        }
    ));
}

#[test]
#[should_panic(expected = "loss input `iq` has shape [2, 3], expected [B, d] = [4, 3]")]
fn forward_panics_on_bad_shape_naming_dimensions() {
    let batch = LossBatch::new(zeros2([4, 3]), zeros2([2, 3]));
    let _ = all_loss().forward(&batch);
}

#[test]
#[should_panic(expected = "has no `iq_instr` tensor")]
fn forward_panics_without_instruction_negatives() {
    let batch = LossBatch::new(zeros2([4, 3]), zeros2([4, 3]));
    let _ = all_loss().forward(&batch);
}
