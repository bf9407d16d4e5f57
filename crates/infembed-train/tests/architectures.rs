//! Training the set-ups the other tests do not: a decoder (tiny Qwen2: last-token pooling,
//! left padding) under the paper's best objective, multivariate (P, I); Interaction II with
//! learnable weights; separate towers. Each run must drive the loss of a repeated batch
//! down, and its saved model must reload to the trained encoder's embeddings.

mod common;

use std::io::Write;
use std::path::Path;

use common::{fixture, text, without_dropout};

use burn::tensor::Device;
use infembed_data::InfIrRecord;
use infembed_encoder::{
    CrossAttentionConfig, CrossAttentionKind, DualEncoder, EncoderConfig, Interaction, Pooling,
    QueryTemplate, Towers,
};
use infembed_losses::{LossConfig, ObjectiveKind, Variable};
use infembed_train::{TrainConfig, Trainer};

/// burn's CPU backend has one random generator per process: tests that train hold this lock.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn write_records(path: &Path, n: usize) {
    let mut f = std::fs::File::create(path).unwrap();
    for i in 0..n {
        let r = InfIrRecord::from_texts([
            &text(i + 100, 3),
            &format!("find {}", text(i + 200, 2)),
            &text(i, 6),
            &text(i + 300, 3),
            &format!("find {}", text(i + 400, 2)),
            &text(i + 500, 5),
            &text(i + 600, 4),
        ])
        .unwrap();
        writeln!(f, "{}", r.to_json()).unwrap();
    }
}

/// Overfits one repeated batch of 6 records (a dropout-free copy of fixture `name`) for
/// `steps` steps at learning rate `lr`; returns the loss history and checks the saved model
/// against the trainer's own encoder.
fn overfit(
    name: &str,
    encoder: EncoderConfig,
    loss: LossConfig,
    steps: usize,
    lr: f64,
) -> Vec<f64> {
    let _guard = RNG.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let model = without_dropout(name, dir.path());
    let data = dir.path().join("train.jsonl");
    write_records(&data, 6);
    let mut c = TrainConfig::new(model, data, dir.path().join("run"));
    c.encoder = encoder;
    c.loss = loss;
    c.batch.records = 6;
    c.epochs = steps;
    c.optimizer.lr = lr;
    c.optimizer.warmup_steps = None;
    c.checkpoint.every_steps = None;
    c.eval.at_start = false;
    let mut t = Trainer::new(c, &Device::flex()).unwrap().quiet(true);
    let s = t.run().unwrap();
    let losses: Vec<f64> = s.history.iter().filter_map(|h| h.loss).collect();
    assert_eq!(losses.len(), steps);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");

    // The saved model embeds as the trained encoder does.
    let trained = t.encoder();
    assert!(trained.normalizes(), "the trainer scores by cosine");
    let final_dir = s.final_dir.unwrap();
    let saved = DualEncoder::load_saved(&final_dir, &Device::flex()).unwrap();
    assert!(saved.normalizes());
    assert_eq!(saved.dim(), trained.dim());
    assert_eq!(saved.model().dense.len(), trained.model().dense.len());
    assert_eq!(saved.pooling(), trained.pooling());
    assert_eq!(saved.config().towers, trained.config().towers);
    let passages = [text(1, 6), text(40, 5)];
    let passages: Vec<&str> = passages.iter().map(String::as_str).collect();
    let pairs = [("find cat news", "recent world"), ("hello", "ships ocean")];
    let rows = |t: burn::tensor::Tensor<2>| infembed_encoder::tensor_rows(t).unwrap();
    for (a, b) in [
        (
            rows(trained.encode_passages(&passages).unwrap().embeddings),
            rows(saved.encode_passages(&passages).unwrap().embeddings),
        ),
        (
            rows(trained.encode_queries(&pairs).unwrap().embeddings),
            rows(saved.encode_queries(&pairs).unwrap().embeddings),
        ),
    ] {
        for (x, y) in a.iter().zip(&b) {
            let d = x
                .iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(d <= 1e-6, "saved and trained embeddings differ by {d}");
        }
    }
    losses
}

/// The last loss is below `factor` times the first. Without dropout the batch and its
/// negatives repeat exactly, so an untrained model would show one loss throughout.
fn assert_falls(losses: &[f64], factor: f64) {
    assert!(
        losses[losses.len() - 1] < factor * losses[0],
        "the loss did not go down to {factor} x the first: {losses:?}"
    );
}

fn interaction_one() -> Interaction {
    Interaction::SelfAttention {
        template: QueryTemplate::default(),
        instruction_negatives: Some(4),
    }
}

#[test]
fn a_tiny_decoder_trains_with_the_multivariate_p_i_loss() {
    let model = fixture("tiny-qwen2");
    let probe = DualEncoder::from_dir(&model, EncoderConfig::default(), &Device::flex()).unwrap();
    assert_eq!(probe.pooling(), Pooling::Last);
    assert!(probe.tokenizer().pads_left());
    let encoder = EncoderConfig {
        interaction: interaction_one(),
        ..EncoderConfig::default()
    };
    let loss = LossConfig::new(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    assert_falls(&overfit("tiny-qwen2", encoder, loss, 12, 3e-3), 0.8);
}

/// Interaction II with learnable weights, token level on the tiny BERT and vector level on
/// the tiny Qwen2 (whose last-token states differ from text to text; the tiny BERT's
/// mean-pooled vectors are nearly parallel, so a vector-level combination of them starts
/// and stays at chance for many steps). Both start near chance (the first loss is about
/// ln(2N - 1) for N = 18 rows) and leave it slowly.
#[test]
fn interaction_two_with_learnable_weights_trains() {
    for (kind, model) in [
        (CrossAttentionKind::Token, "tiny-bert"),
        (CrossAttentionKind::Vector, "tiny-qwen2"),
    ] {
        let encoder = EncoderConfig {
            interaction: Interaction::CrossAttention(CrossAttentionConfig {
                kind,
                learnable: true,
            }),
            ..EncoderConfig::default()
        };
        let loss = LossConfig::new(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
        eprintln!("Interaction II, {kind:?}, {model}");
        assert_falls(&overfit(model, encoder, loss, 20, 1e-2), 0.92);
    }
}

#[test]
fn separate_towers_train() {
    let encoder = EncoderConfig {
        towers: Towers::Separate,
        interaction: interaction_one(),
        ..EncoderConfig::default()
    };
    let loss = LossConfig::new(ObjectiveKind::Univariate, &[Variable::P]);
    assert_falls(&overfit("tiny-bert", encoder, loss, 12, 3e-3), 0.8);
}

/// A sentence-transformers pipeline with a `Dense` module and dot-product similarity (no
/// `Normalize`): the `Dense` layer trains with the backbone, the trainer's encoder scores by
/// cosine as the objective does, and the saved model says so.
#[test]
fn a_dense_dot_product_checkpoint_trains_and_saves_as_cosine() {
    let encoder = EncoderConfig {
        interaction: interaction_one(),
        ..EncoderConfig::default()
    };
    let loss = LossConfig::new(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    assert_falls(&overfit("tiny-bert-dense", encoder, loss, 12, 3e-3), 0.8);
}
