//! Training on the tiny random BERT fixture of the encoder crate: GradCache equals the
//! full-batch gradient, clipping matches a naive norm, runs are bit-identical for a seed, and
//! a resumed run ends with the same weights as an uninterrupted one.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use common::{fixture, text, without_dropout};
use infembed_data::InfIrRecord;
use infembed_encoder::{DeviceSpec, MatmulRoutine, Precision};
use infembed_encoder::{DualEncoder, DualEncoderModel, EncoderConfig, Interaction, QueryTemplate};
use infembed_losses::{LossConfig, ObjectiveKind, Variable};
use infembed_train::{
    Error, MinedSet, TrainBatch, TrainConfig, Trainer, clip_global_norm, full_batch_step,
    global_norm, grad_cache_step, multi_device_step,
};

fn tiny_bert() -> PathBuf {
    fixture("tiny-bert")
}

/// burn's CPU backend has one random generator per process (dropout draws from it): tests
/// that train hold this lock so that parallel tests do not interleave their draws.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// A copy of the tiny BERT with dropout probabilities set to 0 (in `dir`).
fn tiny_bert_without_dropout(dir: &Path) -> PathBuf {
    without_dropout("tiny-bert", dir)
}

fn records(n: usize) -> Vec<InfIrRecord> {
    (0..n)
        .map(|i| {
            let shared = if i % 3 == 2 {
                // A passage repeated across records: a duplicate to mask.
                "the cat sat on the mat".to_string()
            } else {
                text(i, 6)
            };
            InfIrRecord::from_texts([
                &text(i + 100, 3),
                &format!("find {}", text(i + 200, 2)),
                &shared,
                &text(i + 300, 3),
                &format!("find {}", text(i + 400, 2)),
                &text(i + 500, 5),
                &text(i + 600, 4),
            ])
            .unwrap()
        })
        .collect()
}

fn write_jsonl(path: &Path, records: &[InfIrRecord]) {
    let mut f = std::fs::File::create(path).unwrap();
    for r in records {
        writeln!(f, "{}", r.to_json()).unwrap();
    }
}

fn encoder_config() -> EncoderConfig {
    EncoderConfig {
        interaction: Interaction::SelfAttention {
            template: QueryTemplate::default(),
            instruction_negatives: Some(4),
        },
        query_max_length: Some(48),
        passage_max_length: Some(64),
        encode_batch_size: 5,
        ..EncoderConfig::default()
    }
}

fn train_encoder() -> DualEncoder {
    train_encoder_from(&tiny_bert())
}

fn train_encoder_from(dir: &Path) -> DualEncoder {
    let plain = Device::flex();
    let e = DualEncoder::from_dir(dir, encoder_config(), &plain).unwrap();
    e.with_model(e.model().clone().train(), &plain.autodiff())
}

/// Every float parameter (or its gradient) as host values, in visit order.
struct Collect<'a> {
    grads: Option<&'a GradientsParams>,
    out: Vec<Vec<f32>>,
}

impl ModuleVisitor for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = match self.grads {
            Some(g) => match g.get::<D>(param.id) {
                Some(t) => t,
                None => {
                    self.out.push(Vec::new());
                    return;
                }
            },
            None => param.val(),
        };
        self.out.push(
            t.into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .unwrap(),
        );
    }
}

fn grads_of(model: &DualEncoderModel, grads: &GradientsParams) -> Vec<Vec<f32>> {
    let mut c = Collect {
        grads: Some(grads),
        out: Vec::new(),
    };
    model.visit(&mut c);
    c.out
}

fn weights_of(model: &DualEncoderModel) -> Vec<Vec<f32>> {
    let mut c = Collect {
        grads: None,
        out: Vec::new(),
    };
    model.visit(&mut c);
    c.out
}

fn max_rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a
        .iter()
        .flatten()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(1e-12);
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0f32, f32::max)
        / scale
}

fn loss(kind: ObjectiveKind, terms: &[Variable]) -> infembed_losses::ContrastiveLoss {
    LossConfig::new(kind, terms).init().unwrap()
}

#[test]
fn grad_cache_gradients_equal_full_batch_gradients() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let encoder = train_encoder_from(&tiny_bert_without_dropout(dir.path()));
    let recs = records(4);
    let batch = TrainBatch::new(&recs, &[0, 1, 2, 3], &encoder.config().interaction, 5, 0).unwrap();
    for (kind, terms) in [
        (ObjectiveKind::Multivariate, vec![Variable::P, Variable::I]),
        (
            ObjectiveKind::Univariate,
            vec![Variable::P, Variable::I, Variable::Iq],
        ),
    ] {
        let l = loss(kind, &terms);
        let full = full_batch_step(&encoder, &batch, &l, true, 1.0).unwrap();
        let full_g = grads_of(encoder.model(), &full.grads);
        assert!(full_g.iter().any(|g| g.iter().any(|v| *v != 0.0)));
        for chunk in [1, 4, 1000] {
            let gc = grad_cache_step(&encoder, &batch, &l, true, 1.0, chunk).unwrap();
            assert!(
                (gc.loss - full.loss).abs() < 1e-5,
                "{} vs {}",
                gc.loss,
                full.loss
            );
            let diff = max_rel_diff(&full_g, &grads_of(encoder.model(), &gc.grads));
            assert!(
                diff < 1e-4,
                "{kind:?} chunk {chunk}: relative difference {diff}"
            );
        }
    }
}

/// The training passes' size (`batch.texts_per_pass`, larger by default on GPU devices), and
/// the passages and queries sharing those passes once it is set, do not change a step beyond
/// rounding (dropout off): the loss and gradients with one text a pass, and with the whole
/// batch in one pass, equal those of the default passes (each side in its own), for an
/// objective with instruction negatives and for one with the P term only and mined passages.
#[test]
fn the_texts_per_training_pass_do_not_change_a_step() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let mut encoder = train_encoder_from(&tiny_bert_without_dropout(dir.path()));
    let recs = records(6);
    let rows = [0, 1, 2, 3];
    let batch = TrainBatch::new(&recs, &rows, &encoder.config().interaction, 5, 0).unwrap();
    let mined = MinedSet::new(
        vec![
            vec![recs[4].document_positive.clone()],
            vec![recs[5].hard_negative_document_1.clone()],
            vec![],
            vec![recs[5].document_positive.clone()],
            vec![],
            vec![],
        ],
        &recs,
        1,
    );
    let mut p_only = batch.clone().with_mined(&mined, &rows);
    assert!(!p_only.extra_passages.is_empty());
    for list in &mut p_only.instruction_rows {
        list.clear();
    }
    for (batch, l) in [
        (
            batch,
            loss(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]),
        ),
        (p_only, loss(ObjectiveKind::Univariate, &[Variable::P])),
    ] {
        encoder.set_training_pass_texts(None);
        assert!(!encoder.shares_training_passes());
        let default = full_batch_step(&encoder, &batch, &l, true, 1.0).unwrap();
        let default_g = grads_of(encoder.model(), &default.grads);
        for texts in [1, 1000] {
            encoder.set_training_pass_texts(Some(texts));
            assert!(encoder.shares_training_passes());
            let step = full_batch_step(&encoder, &batch, &l, true, 1.0).unwrap();
            assert!(
                (step.loss - default.loss).abs() < 1e-5,
                "{texts} a pass: loss {} vs {}",
                step.loss,
                default.loss
            );
            let diff = max_rel_diff(&default_g, &grads_of(encoder.model(), &step.grads));
            assert!(diff < 1e-4, "{texts} a pass: gradients differ by {diff}");
        }
    }
    encoder.set_training_pass_texts(None);
}

#[test]
fn dropout_is_active_and_reproducible_per_batch_seed() {
    let _guard = rng_lock();
    let encoder = train_encoder();
    let recs = records(3);
    let mut batch =
        TrainBatch::new(&recs, &[0, 1, 2], &encoder.config().interaction, 1, 0).unwrap();
    let l = loss(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    let a = full_batch_step(&encoder, &batch, &l, true, 1.0).unwrap();
    let b = full_batch_step(&encoder, &batch, &l, true, 1.0).unwrap();
    assert_eq!(
        grads_of(encoder.model(), &a.grads),
        grads_of(encoder.model(), &b.grads)
    );
    batch.dropout_seed ^= 1;
    let c = full_batch_step(&encoder, &batch, &l, true, 1.0).unwrap();
    assert_ne!(a.loss, c.loss, "another dropout seed gave the same loss");
    // GradCache is reproducible too (both passes replay the chunk seeds).
    let g1 = grad_cache_step(&encoder, &batch, &l, true, 1.0, 4).unwrap();
    let g2 = grad_cache_step(&encoder, &batch, &l, true, 1.0, 4).unwrap();
    assert_eq!(
        grads_of(encoder.model(), &g1.grads),
        grads_of(encoder.model(), &g2.grads)
    );
}

#[test]
fn clipping_scales_to_the_naive_global_norm() {
    let _guard = rng_lock();
    let encoder = train_encoder();
    let recs = records(2);
    let batch = TrainBatch::new(&recs, &[0, 1], &encoder.config().interaction, 1, 0).unwrap();
    let l = loss(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    let mut grads = full_batch_step(&encoder, &batch, &l, true, 1.0)
        .unwrap()
        .grads;
    let naive: f64 = grads_of(encoder.model(), &grads)
        .iter()
        .flatten()
        .map(|v| f64::from(*v) * f64::from(*v))
        .sum::<f64>()
        .sqrt();
    let norm = global_norm(encoder.model(), &grads);
    assert!((norm - naive).abs() <= 1e-4 * naive, "{norm} vs {naive}");
    let before = grads_of(encoder.model(), &grads);
    let max = (naive / 4.0) as f32;
    clip_global_norm(encoder.model(), &mut grads, max);
    let after = grads_of(encoder.model(), &grads);
    let clipped: f64 = after
        .iter()
        .flatten()
        .map(|v| f64::from(*v) * f64::from(*v))
        .sum::<f64>()
        .sqrt();
    assert!(
        (clipped - f64::from(max)).abs() < 1e-3 * f64::from(max),
        "{clipped}"
    );
    // Direction kept: every entry scaled by the same factor.
    let f = (naive / 4.0) / naive;
    for (b, a) in before.iter().flatten().zip(after.iter().flatten()) {
        assert!((f64::from(*b) * f - f64::from(*a)).abs() < 1e-6);
    }
}

fn config(dir: &Path, out: &str) -> TrainConfig {
    let data = dir.join("train.jsonl");
    if !data.exists() {
        write_jsonl(&data, &records(7));
    }
    let mut c = TrainConfig::new(tiny_bert(), data, dir.join(out));
    c.encoder = encoder_config();
    c.epochs = 2;
    c.batch.records = 3;
    c.optimizer.lr = 1e-3;
    c.optimizer.warmup_steps = Some(1);
    c.checkpoint.every_steps = Some(2);
    c.eval.at_start = false;
    c
}

fn run(c: TrainConfig) -> (Vec<Vec<f32>>, infembed_train::TrainSummary) {
    let mut t = Trainer::new(c, &Device::flex()).unwrap().quiet(true);
    let s = t.run().unwrap();
    (weights_of(t.model()), s)
}

#[test]
fn same_seed_same_weights_other_seed_other_weights() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let (a, sa) = run(config(dir.path(), "a"));
    let (b, _) = run(config(dir.path(), "b"));
    // 7 records, 3 per batch -> 3 steps per epoch, 2 epochs.
    assert_eq!(sa.steps, 6);
    assert_eq!(a, b, "two runs with one seed differ");
    let mut other = config(dir.path(), "c");
    other.seed = 7;
    let (c, _) = run(other);
    assert_ne!(a, c, "another seed gave the same weights");
    // The trained model is saved, and its loss history is finite and decreasing overall.
    let final_dir = sa.final_dir.unwrap();
    assert!(final_dir.join("model.safetensors").is_file());
    assert_eq!(sa.history.iter().filter(|h| h.loss.is_some()).count(), 2);
    assert!(dir.path().join("a/history.json").is_file());
    // The chart, as SVG and as a PNG image.
    assert!(dir.path().join("a/training.svg").is_file());
    let png = std::fs::read(dir.path().join("a/training.png")).unwrap();
    let info = png::Decoder::new(std::io::Cursor::new(&png))
        .read_info()
        .unwrap();
    assert!(info.info().width >= 1000 && info.info().height >= 300);
    // history.jsonl: one line per step (1..=6) in order, and the mean of each window of step
    // losses is the history's loss for that evaluation (3 steps per epoch, evaluated at each
    // epoch's end).
    let steps = step_log(&dir.path().join("a"));
    assert_eq!(
        steps.iter().map(|s| s.0).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
    let losses: Vec<f64> = sa.history.iter().filter_map(|h| h.loss).collect();
    for (window, expected) in steps.chunks(3).zip(&losses) {
        let mean = window.iter().map(|s| s.1).sum::<f64>() / 3.0;
        assert!((mean - expected).abs() < 1e-12, "{mean} vs {expected}");
    }
    assert!(steps.iter().all(|s| s.1.is_finite() && s.2 >= 0.0));
}

/// The steps of `<out>/history.jsonl`: (step, loss, lr), in file order.
fn step_log(out: &Path) -> Vec<(usize, f64, f64)> {
    std::fs::read_to_string(out.join("history.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .map(|v| {
            (
                v["step"].as_u64().unwrap() as usize,
                v["loss"].as_f64().unwrap(),
                v["lr"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn training_drives_the_loss_of_a_repeated_batch_down() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "overfit");
    c.model = tiny_bert_without_dropout(dir.path());
    // One batch of all 7 records per epoch: every step sees the same rows.
    c.batch.records = 7;
    c.epochs = 12;
    c.optimizer.lr = 3e-3;
    c.optimizer.warmup_steps = None;
    c.checkpoint.every_steps = None;
    let (_, s) = run(c);
    let losses: Vec<f64> = s.history.iter().filter_map(|h| h.loss).collect();
    assert_eq!(losses.len(), 12);
    assert!(
        losses[11] < 0.8 * losses[0],
        "the loss did not go down: {losses:?}"
    );
}

#[test]
fn a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one() {
    resume_matches(&[2, 3]);
}

/// Resuming from a checkpoint written at or after an epoch's end (3 steps per epoch here) must
/// recompute the next epoch's order exactly as the uninterrupted run does.
#[test]
fn a_run_resumed_after_the_first_epoch_ends_with_the_uninterrupted_weights() {
    resume_matches(&[4, 5]);
}

fn resume_matches(stops: &[usize]) {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let (whole, _) = run(config(dir.path(), "whole"));
    for &stop in stops {
        let name = format!("resumed-{stop}");
        let mut first = Trainer::new(config(dir.path(), &name), &Device::flex())
            .unwrap()
            .quiet(true);
        let s = first.run_until(Some(stop)).unwrap();
        assert!(s.final_dir.is_none());
        drop(first);
        assert_eq!(step_log(&dir.path().join(&name)).len(), stop);
        let mut second = Trainer::new(config(dir.path(), &name), &Device::flex())
            .unwrap()
            .quiet(true);
        assert!(second.resume().unwrap());
        // Checkpoints are every 2 steps (and at the end): stopping after step 3 resumes from
        // step 2 and redoes step 3.
        assert_eq!(second.state().step, stop / 2 * 2);
        second.run().unwrap();
        assert_eq!(weights_of(second.model()), whole, "stop after {stop}");
        // The steps redone after the checkpoint replace the killed run's lines: the log is the
        // uninterrupted run's, byte for byte.
        let log = |d: &str| std::fs::read(dir.path().join(d).join("history.jsonl")).unwrap();
        assert_eq!(log(&name), log("whole"), "stop after {stop}");
    }
}

#[test]
fn resuming_under_another_config_is_refused() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let mut t = Trainer::new(config(dir.path(), "r"), &Device::flex())
        .unwrap()
        .quiet(true);
    t.run_until(Some(2)).unwrap();
    let mut other = config(dir.path(), "r");
    other.optimizer.lr = 2e-3;
    let mut t = Trainer::new(other, &Device::flex()).unwrap().quiet(true);
    let err = t.resume().unwrap_err().to_string();
    assert!(err.contains("optimizer"), "{err}");
}

#[test]
fn empty_training_data_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let c = TrainConfig::new(tiny_bert(), &empty, dir.path().join("o"));
    let err = Trainer::new(c, &Device::flex()).unwrap_err().to_string();
    assert!(
        err.contains("empty.jsonl") && err.contains("no training record"),
        "{err}"
    );
}

/// Two devices (here the CPU twice, as `--devices cpu,cpu`) share a batch of 4 records: each
/// embeds half of its texts, the loss sees all of them, and the gradient is one device's over
/// the same 4 records (dropout off), whatever the GradCache chunk.
#[test]
fn two_devices_give_the_gradient_of_one_device_over_the_whole_batch() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let encoder = train_encoder_from(&tiny_bert_without_dropout(dir.path()));
    let recs = records(4);
    let batch = TrainBatch::new(&recs, &[0, 1, 2, 3], &encoder.config().interaction, 5, 0).unwrap();
    let l = loss(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    let one = full_batch_step(&encoder, &batch, &l, true, 1.0).unwrap();
    let one_g = grads_of(encoder.model(), &one.grads);
    let replicas = [encoder.clone(), encoder.clone()];
    for chunk in [None, Some(3)] {
        let two = multi_device_step(&replicas, &batch, &l, true, 1.0, chunk).unwrap();
        assert!(
            (two.loss - one.loss).abs() < 1e-5,
            "{} vs {}",
            two.loss,
            one.loss
        );
        let diff = max_rel_diff(&one_g, &grads_of(encoder.model(), &two.grads));
        assert!(diff < 1e-5, "chunk {chunk:?}: relative difference {diff}");
    }
}

fn two_device_config(dir: &Path, out: &str, model: &Path) -> TrainConfig {
    let mut c = config(dir, out);
    c.model = model.to_path_buf();
    c.batch.records = 4;
    c.devices = Some(vec![DeviceSpec::Cpu, DeviceSpec::Cpu]);
    c
}

/// `devices = ["cpu", "cpu"]` trains as one device does (dropout off), checkpoints, and a run
/// stopped and resumed ends with the weights of an uninterrupted one, bit for bit.
#[test]
fn a_two_device_run_trains_as_one_device_and_resumes_bit_identically() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_bert_without_dropout(dir.path());
    let cpu = Device::flex();
    let two = [cpu.clone(), cpu.clone()];

    let mut single = two_device_config(dir.path(), "one", &model);
    single.devices = None;
    let mut t1 = Trainer::new(single, &cpu).unwrap().quiet(true);
    t1.run().unwrap();
    let one = weights_of(t1.model());

    let mut t2 = Trainer::on_devices(two_device_config(dir.path(), "two", &model), &two)
        .unwrap()
        .quiet(true);
    assert_eq!(t2.devices().len(), 2);
    let s2 = t2.run().unwrap();
    let whole = weights_of(t2.model());
    // 7 records, 4 per batch -> 2 steps per epoch, 2 epochs.
    assert_eq!(s2.steps, 4);
    // Each step's gradient agrees to 1e-5 (the test above), but the weights after 4 AdamW
    // steps agree less closely: Adam divides each coordinate by its own gradient's size, and
    // the attention key biases have a gradient that is zero in exact arithmetic (softmax
    // ignores a shift shared by all keys), so their float noise (1e-8 here) is turned into
    // full-size steps whose direction depends on the rounding.
    let diff = max_rel_diff(&one, &whole);
    eprintln!("two devices vs one after 4 steps: relative weight difference {diff:e}");
    assert!(
        diff < 1e-3,
        "two devices vs one: relative difference {diff}"
    );
    // Every replica holds the main device's weights.
    for replica in t2.replicas() {
        assert_eq!(weights_of(replica.model()), whole);
    }

    let mut first = Trainer::on_devices(two_device_config(dir.path(), "resumed", &model), &two)
        .unwrap()
        .quiet(true);
    first.run_until(Some(3)).unwrap();
    drop(first);
    let mut second = Trainer::on_devices(two_device_config(dir.path(), "resumed", &model), &two)
        .unwrap()
        .quiet(true);
    assert!(second.resume().unwrap());
    assert_eq!(second.state().step, 2);
    second.run().unwrap();
    assert_eq!(weights_of(second.model()), whole, "resumed two-device run");
}

#[test]
fn several_devices_need_interaction_one_and_one_device_list() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = two_device_config(dir.path(), "x", &tiny_bert());
    c.encoder.interaction = Interaction::CrossAttention(Default::default());
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("devices") && err.contains("self_attention"),
        "{err}"
    );
    let mut c = two_device_config(dir.path(), "y", &tiny_bert());
    c.device = Some(DeviceSpec::Cpu);
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("devices"), "{err}");
    let mut c = config(dir.path(), "z");
    c.dtype = Some(Precision::F16);
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("dtype") && err.contains("f16"), "{err}");
    c.dtype = Some(Precision::Bf16);
    c.validate().expect("bf16 is the CPU's mixed precision");
    c.device = Some(DeviceSpec::Wgpu(None));
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("dtype") && err.contains("wgpu"), "{err}");
}

/// `dtype = "bf16"` on a CPU with AVX512-BF16: one step's gradients (bf16 products, f32
/// sums) stay within bf16's rounding of the f32 gradients and differ from them, GradCache
/// still equals the full batch, and a run is reproducible and ends near the f32 run, whose
/// saved model it matches in format (f32 weights, no quantization recorded). On a processor
/// without AVX512-BF16 the trainer refuses it, naming the feature.
#[test]
fn bf16_training_tracks_f32_training() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), "bf16");
    c.dtype = Some(Precision::Bf16);
    if !infembed_testkit::cpu_has_avx512_bf16() {
        eprintln!("this processor has no AVX512-BF16: checking the refusal instead");
        let err = match Trainer::new(c, &Device::flex()) {
            Ok(_) => panic!("bf16 training accepted without AVX512-BF16"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("AVX512-BF16"), "{err}");
        return;
    }
    // one step's gradients, without dropout
    let f32_encoder = train_encoder_from(&tiny_bert_without_dropout(dir.path()));
    let mut bf16_encoder = f32_encoder.clone();
    bf16_encoder
        .set_training_precision(Precision::Bf16)
        .unwrap();
    let recs = records(4);
    let interaction = &f32_encoder.config().interaction;
    let batch = TrainBatch::new(&recs, &[0, 1, 2, 3], interaction, 5, 0).unwrap();
    let l = loss(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    let step = |e: &DualEncoder| full_batch_step(e, &batch, &l, true, 1.0).unwrap();
    let (full32, full16) = (step(&f32_encoder), step(&bf16_encoder));
    let g32 = grads_of(f32_encoder.model(), &full32.grads);
    let g16 = grads_of(bf16_encoder.model(), &full16.grads);
    let diff = max_rel_diff(&g32, &g16);
    assert!(diff > 0.0 && diff < 0.05, "bf16 vs f32 gradients: {diff}");
    assert!((full16.loss - full32.loss).abs() < 1e-2 * full32.loss.abs().max(1.0));
    let gc = grad_cache_step(&bf16_encoder, &batch, &l, true, 1.0, 3).unwrap();
    let diff = max_rel_diff(&g16, &grads_of(bf16_encoder.model(), &gc.grads));
    assert!(diff < 1e-4, "bf16 GradCache vs full batch: {diff}");
    // the f32 encoder it was cloned from still trains in f32 (the setting is per encoder)
    let again = grads_of(f32_encoder.model(), &step(&f32_encoder).grads);
    assert_eq!(again, g32, "the f32 encoder's products changed");

    // whole runs
    let (a, sa) = run(c.clone());
    c.output_dir = dir.path().join("bf16-again");
    let (b, _) = run(c);
    assert_eq!(a, b, "two bf16 runs with one seed differ");
    let (f, _) = run(config(dir.path(), "f32"));
    let diff = max_rel_diff(&f, &a);
    assert!(
        diff > 0.0 && diff < 0.02,
        "bf16 vs f32 weights after a run: {diff}"
    );
    let saved = sa.final_dir.unwrap();
    let enc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(saved.join(infembed_encoder::ENCODER_CONFIG_FILE)).unwrap(),
    )
    .unwrap();
    assert!(
        enc.get("quantize").is_none_or(|q| q == "none"),
        "the saved model records {enc}"
    );
}

/// The wgpu device (Mesa's software Vulkan driver in CI), or a skip outside CI / a failure
/// under CI=true when the backend is not compiled in or no adapter opens.
fn wgpu(test: &str) -> Option<Device> {
    match DeviceSpec::Wgpu(None).device() {
        Ok(device) => Some(device),
        Err(e) => infembed_testkit::wgpu_missing(test, &e),
    }
}

/// The encoder of `model` in training mode on `device`'s autodiff device.
fn trainable_on(model: &Path, device: &Device) -> DualEncoder {
    let e = DualEncoder::from_dir(model, encoder_config(), device).unwrap();
    e.with_model(e.model().clone().train(), &device.clone().autodiff())
}

/// A training step on wgpu gives the CPU's loss and gradients (1e-5), for every objective,
/// and the CPU's global norm and clipped gradients.
#[test]
fn a_training_step_on_wgpu_matches_the_cpu() {
    let _guard = rng_lock();
    let Some(gpu) = wgpu("a_training_step_on_wgpu_matches_the_cpu") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_bert_without_dropout(dir.path());
    let on = |device: &Device| trainable_on(&model, device);
    let (cpu, gpu) = (on(&Device::flex()), on(&gpu));
    let recs = records(4);
    let batch = TrainBatch::new(&recs, &[0, 1, 2, 3], &cpu.config().interaction, 5, 0).unwrap();
    // Every objective: the 7 univariate ones (each non-empty set of P, I, IQ) and the 4
    // multivariate ones (each set of two or more).
    let sets: Vec<Vec<Variable>> = (1u8..8)
        .map(|bits| {
            Variable::ALL
                .iter()
                .enumerate()
                .filter(|(i, _)| bits & (1 << i) != 0)
                .map(|(_, v)| *v)
                .collect()
        })
        .collect();
    let objectives = sets
        .iter()
        .map(|t| (ObjectiveKind::Univariate, t.clone()))
        .chain(
            sets.iter()
                .filter(|t| t.len() > 1)
                .map(|t| (ObjectiveKind::Multivariate, t.clone())),
        );
    let mut checked = 0;
    for (kind, terms) in objectives {
        checked += 1;
        let l = loss(kind, &terms);
        let a = full_batch_step(&cpu, &batch, &l, true, 1.0).unwrap();
        let b = full_batch_step(&gpu, &batch, &l, true, 1.0).unwrap();
        assert!(
            (a.loss - b.loss).abs() < 1e-3,
            "{kind:?} {terms:?}: {} vs {}",
            a.loss,
            b.loss
        );
        let (ga, gb) = (
            grads_of(cpu.model(), &a.grads),
            grads_of(gpu.model(), &b.grads),
        );
        let diff = max_rel_diff(&ga, &gb);
        eprintln!("{kind:?} {terms:?}: wgpu vs cpu gradients, relative difference {diff:e}");
        // 1e-5, not the 1e-3 one might allow a GPU: burn's own GELU backward differentiates
        // the tanh approximation (2e-3 here), which `ops::gelu` replaces by the exact one.
        assert!(
            diff < 1e-5,
            "{kind:?} {terms:?}: relative gradient difference {diff}"
        );
    }
    assert_eq!(checked, 11, "7 univariate and 4 multivariate objectives");

    // the global norm (on wgpu the squares summed by one kernel a gradient) and clipping
    let l = loss(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    let mut a = full_batch_step(&cpu, &batch, &l, true, 1.0).unwrap().grads;
    let mut b = full_batch_step(&gpu, &batch, &l, true, 1.0).unwrap().grads;
    let (na, nb) = (global_norm(cpu.model(), &a), global_norm(gpu.model(), &b));
    assert!(
        (na - nb).abs() <= 1e-5 * na,
        "global norm: {na} on the CPU, {nb} on wgpu"
    );
    let max = (na / 3.0) as f32;
    clip_global_norm(cpu.model(), &mut a, max);
    clip_global_norm(gpu.model(), &mut b, max);
    let diff = max_rel_diff(&grads_of(cpu.model(), &a), &grads_of(gpu.model(), &b));
    assert!(diff < 1e-5, "clipped gradients: relative difference {diff}");
}

/// The losses of a run's steps, from its `history.jsonl`.
fn step_losses(output_dir: &Path) -> Vec<f64> {
    std::fs::read_to_string(output_dir.join("history.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("step").is_some() && v.get("lr").is_some())
        .map(|v| v["loss"].as_f64().unwrap())
        .collect()
}

/// Runs of three steps on wgpu, whose steps issue the update before reading the losses back
/// and clip with the norm left on the device (the factor computed by the update's kernel),
/// end at the CPU runs' weights, through the same losses (a model without dropout; a bound
/// far under the gradients' norm, so that the clipped gradients come near AdamW's epsilon,
/// where the factor shows in every step): one batch a step, and two batches a step
/// (`batch.accumulation = 2`, whose two losses are read after the update).
#[test]
fn a_run_on_wgpu_ends_at_the_cpu_runs_weights_through_its_losses() {
    let _guard = rng_lock();
    let Some(gpu) = wgpu("a_run_on_wgpu_ends_at_the_cpu_runs_weights_through_its_losses") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_bert_without_dropout(dir.path());
    let start = weights_of(train_encoder_from(&model).model());
    for accumulation in [1, 2] {
        let run_on = |device: &Device, out: &str| {
            let mut c = config(dir.path(), &format!("{out}-{accumulation}"));
            c.model = model.clone();
            // 7 records, 3 a batch: 3 batches an epoch, grouped in 3 steps or 2 (of two
            // batches, then one)
            c.epochs = 2;
            c.max_steps = Some(3);
            c.batch.accumulation = accumulation;
            c.checkpoint.every_steps = None;
            c.optimizer.max_grad_norm = Some(1e-5);
            let output = c.output_dir.clone();
            let mut t = Trainer::new(c, device).unwrap().quiet(true);
            let s = t.run().unwrap();
            assert_eq!(s.steps, 3);
            (
                weights_of(t.model()),
                step_losses(&output),
                t.device_clip_steps(),
            )
        };
        let (cpu_weights, cpu_losses, cpu_clips) = run_on(&Device::flex(), "cpu");
        let (gpu_weights, gpu_losses, gpu_clips) = run_on(&gpu, "wgpu");
        if gpu_clips == 0 {
            // an adapter whose f32 atomics do not add: the norm read back (a skip, a failure
            // under CI)
            let test = "a_run_on_wgpu_ends_at_the_cpu_runs_weights_through_its_losses";
            return infembed_testkit::wgpu_missing(test, &"an adapter whose f32 atomics add")
                .unwrap_or(());
        }
        assert_eq!(
            (cpu_clips, gpu_clips),
            (0, 3),
            "steps clipped on the device"
        );
        assert_eq!((cpu_losses.len(), gpu_losses.len()), (3, 3));
        assert!(gpu_weights.iter().flatten().all(|w| w.is_finite()));
        for (step, (a, b)) in cpu_losses.iter().zip(&gpu_losses).enumerate() {
            assert!(
                (a - b).abs() < 1e-4,
                "accumulation {accumulation}, step {}: loss {a} on the CPU, {b} on wgpu",
                step + 1
            );
        }
        let diff = max_rel_diff(&cpu_weights, &gpu_weights);
        eprintln!(
            "accumulation {accumulation}: wgpu vs cpu weights after 3 clipped steps: \
             relative difference {diff:e}"
        );
        assert!(
            diff < 1e-4,
            "accumulation {accumulation}: weights differ by {diff}"
        );
        assert!(
            max_rel_diff(&start, &cpu_weights) > 1e-4,
            "the weights did not move"
        );
    }
}

/// Runs `c` (one epoch, no checkpoints, clipping to 1) on the CPU and on wgpu, each to the
/// error `is_expected` accepts at step 2 (`poison` sets the test hooks that make something NaN
/// there), and checks that the weights kept are finite and those of a run of the first step
/// alone, and that wgpu clipped both steps with the norm left on the device.
fn stops_at_step_2_keeping_the_weights_before(
    test: &str,
    dir: &Path,
    adjust: impl Fn(&mut TrainConfig),
    poison: impl Fn(Trainer) -> Trainer,
    is_expected: impl Fn(&Error) -> bool,
) {
    let model = tiny_bert_without_dropout(dir);
    let run_on = |device: &Device, out: &str, steps: Option<usize>| {
        let mut c = config(dir, out);
        c.model = model.clone();
        c.epochs = 1;
        c.max_steps = steps;
        c.checkpoint.every_steps = None;
        c.optimizer.max_grad_norm = Some(1.0);
        adjust(&mut c);
        let mut t = Trainer::new(c, device).unwrap().quiet(true);
        if steps.is_none() {
            t = poison(t);
        }
        let out = t.run();
        (out, weights_of(t.model()), t.device_clip_steps())
    };
    let mut devices = vec![(Device::flex(), "cpu")];
    devices.extend(wgpu(test).map(|d| (d, "wgpu")));
    for (device, label) in devices {
        let (one, after_one, _) = run_on(&device, &format!("{label}-1"), Some(1));
        one.unwrap_or_else(|e| panic!("{label}: the first step: {e}"));
        let (err, kept, clips) = run_on(&device, label, None);
        match err {
            Err(e) if is_expected(&e) => {}
            other => panic!("{label}: {:?}", other.map(|s| s.steps)),
        }
        assert!(kept.iter().flatten().all(|w| w.is_finite()), "{label}");
        let diff = max_rel_diff(&after_one, &kept);
        assert!(diff < 1e-5, "{label}: the weights moved by {diff}");
        match (label, clips) {
            ("cpu", _) => assert_eq!(clips, 0, "the CPU reads its norm back"),
            // an adapter whose f32 atomics do not add: the norm read back (a skip, a
            // failure under CI)
            (_, 0) => infembed_testkit::wgpu_missing(test, &"an adapter whose f32 atomics add")
                .unwrap_or(()),
            _ => assert_eq!(clips, 2, "{label}: steps clipped on the device"),
        }
    }
}

/// A loss that is not finite stops the run with `Error::NonFinite` naming its step, and the
/// weights stay those of the step before (finite): on the CPU, which reads the loss before
/// the update, and on wgpu, which reads it after issuing the update when clipping computes its
/// factor there, the update's kernel then leaving the weights as they were (the norm is not
/// finite either). A learning rate of 1e30 sends the weights to about 1e30 in the first step,
/// and the second step's forward pass past f32's range.
#[test]
fn a_loss_that_is_not_finite_stops_the_run_and_keeps_the_weights_before() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    stops_at_step_2_keeping_the_weights_before(
        "a_loss_that_is_not_finite_stops_the_run_and_keeps_the_weights_before",
        dir.path(),
        |c| {
            c.optimizer.warmup_steps = Some(0);
            c.optimizer.lr = 1e30;
        },
        |t| t,
        |e| matches!(e, Error::NonFinite { step: 2, .. }),
    );
}

/// A loss made NaN by a test hook at step 2, over finite gradients, stops the run with
/// `Error::NonFinite` for that step, the weights those of the step before: the CPU reads the
/// loss before the update; on wgpu the loss guards the squares' total the update's kernel
/// reads, which then leaves the weights as they were.
#[test]
fn a_nan_loss_over_finite_gradients_stops_the_run_and_keeps_the_weights_before() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    stops_at_step_2_keeping_the_weights_before(
        "a_nan_loss_over_finite_gradients_stops_the_run_and_keeps_the_weights_before",
        dir.path(),
        |_| {},
        |t| t.poison_loss_at(2),
        |e| matches!(e, Error::NonFinite { step: 2, value } if value.is_nan()),
    );
}

/// Gradients that are NaN under a finite loss (made so by a test hook at step 2) stop the run
/// with `Error::NonFiniteGradients` naming the step, the weights those of the step before: the
/// CPU finds the norm NaN before the update, wgpu after issuing it, the update's kernel having
/// left the weights as they were.
#[test]
fn nan_gradients_under_a_finite_loss_stop_the_run_and_keep_the_weights_before() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    stops_at_step_2_keeping_the_weights_before(
        "nan_gradients_under_a_finite_loss_stop_the_run_and_keep_the_weights_before",
        dir.path(),
        |_| {},
        |t| t.poison_gradients_at(2),
        |e| matches!(e, Error::NonFiniteGradients { step: 2, norm } if norm.is_nan()),
    );
}

/// A training step on wgpu with the linear layers' products through one of cubek's routines
/// (`matmul = "naive"`, quick to compile on the software driver) or this project's blocked
/// kernel (`matmul = "blocked"`), forward and both backward products, gives the CPU's loss and
/// gradients (1e-5), as burn's own matmul does; the CPU refuses a routine in one message.
#[test]
fn a_training_step_through_a_cubek_routine_matches_the_cpu() {
    let _guard = rng_lock();
    let Some(gpu) = wgpu("a_training_step_through_a_cubek_routine_matches_the_cpu") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_bert_without_dropout(dir.path());
    let on = |device: &Device| trainable_on(&model, device);
    let cpu = on(&Device::flex());
    let recs = records(4);
    let batch = TrainBatch::new(&recs, &[0, 1, 2, 3], &cpu.config().interaction, 5, 0).unwrap();
    let l = loss(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    let a = full_batch_step(&cpu, &batch, &l, true, 1.0).unwrap();
    for name in ["naive", "blocked"] {
        let routine: MatmulRoutine = name.parse().unwrap();
        let mut refused = cpu.clone();
        let err = refused.set_gpu_matmul(routine).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains("GPU"), "{err}");
        let mut gpu = on(&gpu);
        gpu.set_gpu_matmul(routine).unwrap();
        assert_eq!(gpu.gpu_matmul(), routine);
        let b = full_batch_step(&gpu, &batch, &l, true, 1.0).unwrap();
        assert!(
            (a.loss - b.loss).abs() < 1e-4,
            "{routine}: {} vs {}",
            a.loss,
            b.loss
        );
        let diff = max_rel_diff(
            &grads_of(cpu.model(), &a.grads),
            &grads_of(gpu.model(), &b.grads),
        );
        eprintln!("wgpu through {routine} vs cpu: relative gradient difference {diff:e}");
        assert!(
            diff < 1e-5,
            "{routine}: relative gradient difference {diff}"
        );
    }
}

/// `devices = ["cpu", "wgpu"]`: the wgpu replica's gradients come back to the CPU and the
/// step equals the CPU's alone.
#[test]
fn a_cpu_and_a_wgpu_device_share_a_batch() {
    let _guard = rng_lock();
    let Some(gpu) = wgpu("a_cpu_and_a_wgpu_device_share_a_batch") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let encoder = train_encoder_from(&tiny_bert_without_dropout(dir.path()));
    let gpu = gpu.autodiff();
    let replica = encoder.with_model(encoder.model().clone().fork(&gpu), &gpu);
    let recs = records(4);
    let batch = TrainBatch::new(&recs, &[0, 1, 2, 3], &encoder.config().interaction, 5, 0).unwrap();
    let l = loss(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    let one = full_batch_step(&encoder, &batch, &l, true, 1.0).unwrap();
    let two = multi_device_step(&[encoder.clone(), replica], &batch, &l, true, 1.0, None).unwrap();
    assert!(
        (two.loss - one.loss).abs() < 1e-4,
        "{} vs {}",
        two.loss,
        one.loss
    );
    let diff = max_rel_diff(
        &grads_of(encoder.model(), &one.grads),
        &grads_of(encoder.model(), &two.grads),
    );
    eprintln!("cpu + wgpu vs cpu alone: relative difference {diff:e}");
    assert!(diff < 1e-5, "relative difference {diff}");
}

/// Mined hard negatives join the P-marginal: the loss equals a naive f64 computation from the
/// encoder's own embeddings (rows' passages, the mined passages, the rows' queries), and
/// GradCache (any chunk) gives the full batch's gradient with them (dropout off).
#[test]
fn mined_passages_enter_the_p_marginal_and_grad_cache_agrees() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let encoder = train_encoder_from(&tiny_bert_without_dropout(dir.path()));
    let recs = records(6);
    let mined = MinedSet::new(
        vec![
            vec![
                recs[4].document_positive.clone(),
                recs[5].hard_negative_document_1.clone(),
            ],
            vec![recs[5].document_positive.clone()],
            vec![],
            vec![],
            vec![],
            vec![],
        ],
        &recs,
        2,
    );
    let batch = TrainBatch::new(&recs, &[0, 1, 3], &encoder.config().interaction, 5, 0)
        .unwrap()
        .with_mined(&mined, &[0, 1, 3]);
    assert_eq!(batch.extra_passages.len(), 3);
    let l = loss(ObjectiveKind::Univariate, &[Variable::P]);
    let mut plain_batch = batch.clone();
    for list in &mut plain_batch.instruction_rows {
        list.clear();
    }
    let full = full_batch_step(&encoder, &plain_batch, &l, true, 1.0).unwrap();

    // Naive: embeddings without a graph, the P term in f64 with the duplicate-text rule.
    let host = |t: Tensor<2>| -> Vec<Vec<f64>> {
        let [n, d] = t.dims();
        let v = t
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .unwrap();
        (0..n)
            .map(|i| {
                v[i * d..(i + 1) * d]
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect()
            })
            .collect()
    };
    let unit = |rows: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
        rows.into_iter()
            .map(|r| {
                let norm = r.iter().map(|x| x * x).sum::<f64>().sqrt();
                r.iter().map(|x| x / norm).collect()
            })
            .collect()
    };
    let passages: Vec<&str> = batch.rows.iter().map(|r| &*r.passage).collect();
    let extras: Vec<&str> = batch.extra_passages.iter().map(|p| &**p).collect();
    let pairs: Vec<(&str, &str)> = batch
        .rows
        .iter()
        .map(|r| (&*r.instruction, &*r.query))
        .collect();
    let p = unit(host(encoder.encode_passages(&passages).unwrap().embeddings));
    let e = unit(host(encoder.encode_passages(&extras).unwrap().embeddings));
    let q = unit(host(encoder.encode_queries(&pairs).unwrap().embeddings));
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let scale = l.scale();
    let n = p.len();
    let naive: f64 = (0..n)
        .map(|i| {
            let pos = scale * dot(&p[i], &q[i]);
            let mut z = 0.0;
            for (m, pm) in p.iter().enumerate() {
                if m == i || batch.rows[m].passage != batch.rows[i].passage {
                    z += (scale * dot(pm, &q[i])).exp();
                }
            }
            for x in &e {
                z += (scale * dot(x, &q[i])).exp();
            }
            z.ln() - pos
        })
        .sum::<f64>()
        / n as f64;
    assert!(
        (f64::from(full.loss) - naive).abs() < 1e-4 * naive.abs().max(1.0),
        "burn {} vs naive {naive}",
        full.loss
    );
    // Without the mined passages the loss is lower (they only add negatives).
    let without = {
        let mut b = plain_batch.clone();
        b.extra_passages.clear();
        b.extra_excluded = vec![Vec::new(); n];
        full_batch_step(&encoder, &b, &l, true, 1.0).unwrap().loss
    };
    assert!(without < full.loss, "{without} vs {}", full.loss);

    // GradCache and two devices, with the I term too.
    let l = loss(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    let one = full_batch_step(&encoder, &batch, &l, true, 1.0).unwrap();
    let one_g = grads_of(encoder.model(), &one.grads);
    for (replicas, chunk) in [
        (vec![encoder.clone()], Some(4)),
        (vec![encoder.clone(), encoder.clone()], None),
    ] {
        let other = multi_device_step(&replicas, &batch, &l, true, 1.0, chunk).unwrap();
        assert!(
            (other.loss - one.loss).abs() < 1e-5,
            "{} vs {}",
            other.loss,
            one.loss
        );
        let diff = max_rel_diff(&one_g, &grads_of(encoder.model(), &other.grads));
        assert!(diff < 1e-5, "chunk {chunk:?}: relative difference {diff}");
    }
}

/// `batch.mined_per_record` trains from a mined file (other weights than without it, the same
/// for two runs), and the config refuses it without a file or without P.
#[test]
fn a_run_with_mined_negatives_trains_and_bad_configs_are_refused() {
    let _guard = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let base = config(dir.path(), "plain");
    let recs = records(7);
    // Mine with fixed pseudo-random scores (the filter still applies).
    let cands = infembed_data::mining_candidates(&recs);
    let scores: Vec<f32> = (0..recs.len() * cands.len())
        .map(|x| ((x * 7919) % 101) as f32 / 101.0)
        .collect();
    let lists = infembed_data::select_hard_negatives(
        &recs,
        &cands,
        &scores,
        &vec![1.0; recs.len()],
        infembed_data::MiningOptions::new(3),
    )
    .unwrap();
    let file = dir.path().join("mined.jsonl");
    std::fs::write(&file, infembed_data::mined_negatives_jsonl(&recs, &lists)).unwrap();

    let mut with = config(dir.path(), "mined");
    with.data.mined_negatives = Some(file.clone());
    with.batch.mined_per_record = 2;
    let (a, _) = run(with.clone());
    with.output_dir = dir.path().join("mined2");
    let (b, _) = run(with.clone());
    let (plain, _) = run(base);
    assert_eq!(a, b);
    assert_ne!(a, plain);

    let mut no_file = with.clone();
    no_file.data.mined_negatives = None;
    let err = no_file.validate().unwrap_err().to_string();
    assert!(
        err.contains("batch.mined_per_record") && err.contains("data.mined_negatives"),
        "{err}"
    );
    let mut unused = with.clone();
    unused.batch.mined_per_record = 0;
    let err = unused.validate().unwrap_err().to_string();
    assert!(err.contains("data.mined_negatives"), "{err}");
    let mut no_p = with.clone();
    no_p.loss = LossConfig::new(ObjectiveKind::Univariate, &[Variable::I]);
    let err = no_p.validate().unwrap_err().to_string();
    assert!(err.contains("must have P"), "{err}");
    // A file mined from other records is refused by the trainer, naming its line.
    std::fs::write(
        &file,
        infembed_data::mined_negatives_jsonl(&records(9)[2..], &lists),
    )
    .unwrap();
    let err = Trainer::new(with, &Device::flex())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("mined.jsonl") && err.contains("line 1"),
        "{err}"
    );
}
