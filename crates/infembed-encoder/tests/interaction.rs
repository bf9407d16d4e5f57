//! Interaction I templates and Interaction II combinations against naive host
//! re-implementations, including padding invariance of the token-level variant.

mod common;

use burn::nn::LinearConfig;
use burn::prelude::*;
use common::*;
use infembed_encoder::interaction::{combine_tokens, combine_vectors};
use infembed_encoder::{CrossAttention, QueryTemplate};
use proptest::prelude::*;

/// The encoder's template is the data crate's `QueryTemplate`, re-exported; these are the
/// renderings Interaction I relied on before the two template types became one.
#[test]
fn templates_render_and_validate() {
    let t = QueryTemplate::default();
    assert_eq!(
        t.render("what is rust", Some("be brief")),
        "what is rust be brief"
    );
    let paper = QueryTemplate::new("{instruction} {query}").unwrap();
    assert_eq!(
        paper.render("what is rust", Some("be brief")),
        "be brief what is rust"
    );
    let e5 = QueryTemplate::new("Instruct: {instruction}\nQuery: {query}").unwrap();
    assert_eq!(
        e5.render("cats", Some("find news")),
        "Instruct: find news\nQuery: cats"
    );
    // Slot-like text inside the values is inserted verbatim.
    assert_eq!(t.render("q", Some("{query}")), "q {query}");
    // An empty instruction keeps the separator (as Interaction I always rendered it).
    assert_eq!(t.render("q", Some("")), "q ");
    for bad in [
        "{instruction}",
        "{query} {query} {instruction}",
        "{query} {instruction} {instruction}",
        "plain",
    ] {
        assert!(QueryTemplate::new(bad).is_err(), "{bad:?} must be rejected");
    }
    let json = serde_json::to_string(&e5).unwrap();
    assert_eq!(serde_json::from_str::<QueryTemplate>(&json).unwrap(), e5);
    assert!(serde_json::from_str::<QueryTemplate>("\"no slots\"").is_err());
}

type Mat = Vec<Vec<f32>>;

fn matvec_rows(x: &Mat, w: Option<&Mat>) -> Mat {
    // y = x W with W [d_in, d_out] (burn's Linear layout)
    match w {
        None => x.clone(),
        Some(w) => x
            .iter()
            .map(|row| {
                (0..w[0].len())
                    .map(|o| row.iter().enumerate().map(|(i, v)| v * w[i][o]).sum())
                    .collect()
            })
            .collect(),
    }
}

fn normalize(v: Vec<f32>) -> Vec<f32> {
    let n = v
        .iter()
        .map(|x| (*x as f64).powi(2))
        .sum::<f64>()
        .sqrt()
        .max(1e-12);
    v.iter().map(|x| (*x as f64 / n) as f32).collect()
}

/// Naive token-level Interaction II for one (instruction, query) pair.
fn naive_token(instr: &Mat, im: &[f32], query: &Mat, qm: &[f32], w: Option<&[Mat; 3]>) -> Vec<f32> {
    let d = query[0].len();
    let a = matvec_rows(instr, w.map(|w| &w[0]));
    let b = matvec_rows(query, w.map(|w| &w[1]));
    let c = matvec_rows(query, w.map(|w| &w[2]));
    let mut acc = vec![0f64; d];
    let mut count = 0f64;
    for (ai, &mi) in a.iter().zip(im) {
        if mi < 0.5 {
            continue;
        }
        count += 1.0;
        let scores: Vec<f64> = b
            .iter()
            .zip(qm)
            .map(|(bj, &mj)| {
                if mj < 0.5 {
                    f64::NEG_INFINITY
                } else {
                    ai.iter()
                        .zip(bj)
                        .map(|(x, y)| *x as f64 * *y as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                }
            })
            .collect();
        let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
        let z: f64 = e.iter().sum();
        for (j, ej) in e.iter().enumerate() {
            for k in 0..d {
                acc[k] += ej / z * c[j][k] as f64;
            }
        }
    }
    normalize(acc.iter().map(|x| (x / count) as f32).collect())
}

fn naive_vector(i: &[f32], q: &[f32], w: Option<&[Mat; 3]>) -> Vec<f32> {
    let d = q.len();
    let a = &matvec_rows(&vec![i.to_vec()], w.map(|w| &w[0]))[0];
    let b = &matvec_rows(&vec![q.to_vec()], w.map(|w| &w[1]))[0];
    let c = &matvec_rows(&vec![q.to_vec()], w.map(|w| &w[2]))[0];
    let s: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| *x as f64 * *y as f64 / (d as f64).sqrt())
        .collect();
    let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
    let z: f64 = e.iter().sum();
    normalize(
        e.iter()
            .zip(c)
            .map(|(ei, ci)| (ei / z * *ci as f64) as f32)
            .collect(),
    )
}

fn random_weights(d: usize) -> (CrossAttention, [Mat; 3]) {
    let dev = device();
    let lin = || LinearConfig::new(d, d).with_bias(false).init(&dev);
    let ca = CrossAttention {
        w_i: lin(),
        w_q1: lin(),
        w_q2: lin(),
    };
    let host = |l: &burn::nn::Linear| rows(l.weight.val());
    let mats = [host(&ca.w_i), host(&ca.w_q1), host(&ca.w_q2)];
    (ca, mats)
}

fn t3(x: &[Mat]) -> Tensor<3> {
    let (n, l, d) = (x.len(), x[0].len(), x[0][0].len());
    Tensor::from_data(
        TensorData::new(
            x.iter().flatten().flatten().copied().collect::<Vec<_>>(),
            [n, l, d],
        ),
        &device(),
    )
}
fn t2(x: &[Vec<f32>]) -> Tensor<2> {
    let (n, d) = (x.len(), x[0].len());
    Tensor::from_data(TensorData::new(x.concat(), [n, d]), &device())
}

/// Random states `[n][l][d]` and right-aligned or left-aligned masks with >= 1 real token.
fn states(n: usize, l: usize, d: usize) -> impl Strategy<Value = (Vec<Mat>, Vec<Vec<f32>>)> {
    (
        proptest::collection::vec(
            proptest::collection::vec(proptest::collection::vec(-2.0f32..2.0, d), l),
            n,
        ),
        proptest::collection::vec((1..=l, any::<bool>()), n),
    )
        .prop_map(move |(h, lens)| {
            let m = lens
                .iter()
                .map(|&(k, left)| {
                    (0..l)
                        .map(|j| {
                            if (left && j >= l - k) || (!left && j < k) {
                                1.0
                            } else {
                                0.0
                            }
                        })
                        .collect()
                })
                .collect();
            (h, m)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn token_interaction_matches_naive(
        (ih, im) in states(3, 4, 5),
        (qh, qm) in states(4, 3, 5),
        learnable in any::<bool>(),
        full in any::<bool>(),
    ) {
        let (ca, mats) = random_weights(5);
        let w = learnable.then_some(&mats);
        // `full` exercises the whole-grid path, otherwise the per-pair path.
        let pairs: Vec<(usize, usize)> = if full {
            (0..4).flat_map(|q| (0..3).map(move |i| (i, q))).collect()
        } else {
            vec![(0, 0), (2, 3)]
        };
        let got = rows(combine_tokens(t3(&ih), t2(&im), t3(&qh), t2(&qm), learnable.then_some(&ca), &pairs));
        for (k, &(i, q)) in pairs.iter().enumerate() {
            let want = naive_token(&ih[i], &im[i], &qh[q], &qm[q], w);
            prop_assert!(max_abs_diff(&got[k], &want) < 1e-4, "pair {i},{q}: {:?} vs {want:?}", got[k]);
        }
    }

    #[test]
    fn vector_interaction_matches_naive(
        i in proptest::collection::vec(proptest::collection::vec(-3.0f32..3.0, 6), 2),
        q in proptest::collection::vec(proptest::collection::vec(-3.0f32..3.0, 6), 3),
        learnable in any::<bool>(),
    ) {
        let (ca, mats) = random_weights(6);
        let pairs = vec![(0, 0), (1, 0), (1, 2), (0, 1)];
        let got = rows(combine_vectors(t2(&i), t2(&q), learnable.then_some(&ca), &pairs));
        for (k, &(a, b)) in pairs.iter().enumerate() {
            let want = naive_vector(&i[a], &q[b], learnable.then_some(&mats));
            prop_assert!(max_abs_diff(&got[k], &want) < 1e-5);
        }
    }
}

#[test]
fn token_interaction_ignores_padding_content_and_amount() {
    // One instruction (3 real tokens) and one query (2 real tokens), then the same with
    // extra padding on both sides holding large garbage values.
    let d = 4;
    let ih: Mat = vec![
        vec![0.5, -1.0, 2.0, 0.1],
        vec![1.5, 0.2, -0.3, 0.7],
        vec![-0.4, 0.9, 0.0, 1.1],
    ];
    let qh: Mat = vec![vec![1.0, 0.0, -1.0, 0.5], vec![0.3, 0.3, 0.8, -2.0]];
    let base = rows(combine_tokens(
        t3(std::slice::from_ref(&ih)),
        t2(&[vec![1.0; 3]]),
        t3(std::slice::from_ref(&qh)),
        t2(&[vec![1.0; 2]]),
        None,
        &[(0, 0)],
    ));
    let garbage = vec![1e4f32; d];
    let mut ih_p = vec![garbage.clone(), garbage.clone()];
    ih_p.extend(ih.iter().cloned()); // left padding
    let mut qh_p = qh.clone();
    qh_p.extend([garbage.clone(), garbage.clone(), garbage]); // right padding
    let padded = rows(combine_tokens(
        t3(&[ih_p]),
        t2(&[vec![0.0, 0.0, 1.0, 1.0, 1.0]]),
        t3(&[qh_p]),
        t2(&[vec![1.0, 1.0, 0.0, 0.0, 0.0]]),
        None,
        &[(0, 0)],
    ));
    assert!(
        max_abs_diff(&base[0], &padded[0]) < 1e-5,
        "{base:?} vs {padded:?}"
    );
}
