//! Masked pooling and normalization against naive host re-implementations (proptest).

mod common;

use burn::prelude::*;
use common::*;
use infembed_encoder::{Pooling, l2_normalize, pool};
use proptest::prelude::*;

/// Naive pooling of one row: `h[l][d]`, `m[l]` in {0,1}.
fn naive_pool(h: &[Vec<f32>], m: &[f32], pooling: Pooling) -> Vec<f32> {
    let d = h[0].len();
    let real: Vec<usize> = (0..m.len()).filter(|&j| m[j] > 0.5).collect();
    match pooling {
        Pooling::Mean => {
            let mut s = vec![0f64; d];
            for &j in &real {
                for k in 0..d {
                    s[k] += h[j][k] as f64;
                }
            }
            let c = (real.len() as f64).max(1e-9);
            s.iter().map(|x| (*x / c) as f32).collect()
        }
        Pooling::Cls => h[*real.first().unwrap_or(&0)].clone(),
        Pooling::Last => h[*real.last().unwrap_or(&0)].clone(),
    }
}

/// A batch of `b` rows of length `l`, each with a contiguous run of real tokens placed
/// left or right, and random states.
fn batch_strategy() -> impl Strategy<Value = (Vec<Vec<Vec<f32>>>, Vec<Vec<f32>>)> {
    (1usize..5, 1usize..7, 1usize..6, any::<bool>()).prop_flat_map(|(b, l, d, left)| {
        (
            proptest::collection::vec(
                proptest::collection::vec(proptest::collection::vec(-3.0f32..3.0, d), l),
                b,
            ),
            proptest::collection::vec(1..=l, b),
        )
            .prop_map(move |(h, lens)| {
                let masks = lens
                    .iter()
                    .map(|&n| {
                        (0..l)
                            .map(|j| {
                                let real = if left { j >= l - n } else { j < n };
                                if real { 1.0 } else { 0.0 }
                            })
                            .collect()
                    })
                    .collect();
                (h, masks)
            })
    })
}

fn to_tensors(h: &[Vec<Vec<f32>>], m: &[Vec<f32>]) -> (Tensor<3>, Tensor<2>) {
    let (b, l, d) = (h.len(), h[0].len(), h[0][0].len());
    let flat: Vec<f32> = h.iter().flatten().flatten().copied().collect();
    let mflat: Vec<f32> = m.iter().flatten().copied().collect();
    (
        Tensor::from_data(TensorData::new(flat, [b, l, d]), &device()),
        Tensor::from_data(TensorData::new(mflat, [b, l]), &device()),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn pooling_matches_naive((h, m) in batch_strategy()) {
        for pooling in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
            let (th, tm) = to_tensors(&h, &m);
            let got = rows(pool(th, tm, pooling));
            for r in 0..h.len() {
                let want = naive_pool(&h[r], &m[r], pooling);
                prop_assert!(max_abs_diff(&got[r], &want) < 1e-5,
                    "{pooling:?} row {r}: {:?} vs {want:?}", got[r]);
            }
        }
    }

    #[test]
    fn normalize_matches_naive(v in proptest::collection::vec(proptest::collection::vec(-5.0f32..5.0, 4), 1..5)) {
        let n = v.len();
        let t = Tensor::<2>::from_data(TensorData::new(v.concat(), [n, 4]), &device());
        let got = rows(l2_normalize(t));
        for (g, row) in got.iter().zip(&v) {
            let norm = row.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt().max(1e-12);
            let want: Vec<f32> = row.iter().map(|x| (*x as f64 / norm) as f32).collect();
            prop_assert!(max_abs_diff(g, &want) < 1e-5);
        }
    }
}

#[test]
fn pooling_config_parses_sentence_transformers_json() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::write(
        p.join("modules.json"),
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
    )
    .unwrap();
    std::fs::create_dir(p.join("1_Pooling")).unwrap();
    std::fs::write(
        p.join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": true}"#,
    )
    .unwrap();
    std::fs::write(
        p.join("sentence_bert_config.json"),
        r#"{"max_seq_length": 77}"#,
    )
    .unwrap();
    let st = infembed_encoder::SentenceTransformersConfig::from_dir(p).unwrap();
    assert_eq!(st.pooling, Some(Pooling::Cls));
    assert_eq!(st.normalize, Some(false), "no Normalize module listed");
    assert_eq!(st.max_seq_length, Some(77));

    // Two modes at once is an error naming the file and the field.
    std::fs::write(
        p.join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true}"#,
    )
    .unwrap();
    let err = infembed_encoder::SentenceTransformersConfig::from_dir(p).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("1_Pooling") && msg.contains("pooling_mode"),
        "{msg}"
    );
}
