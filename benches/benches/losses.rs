//! Forward cost of every InF-Embed objective on the CPU (`flex`) backend, d = 384, at
//! B = 8, 32, 128, 512, with the full I-marginal (K = B - 1 instruction negatives per row).
//!
//! Benchmark ids are `losses/B=<B>/<objective>`; `docs/benchmarks.md` records the
//! results and the growth exponent in B fitted from them.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::time::Duration;

use burn::tensor::Device;
use criterion::{Criterion, criterion_group, criterion_main};
use infembed_benches::losses_data;
use infembed_losses::{LossConfig, ObjectiveKind, Variable};

const D: usize = 384;
const SIZES: [usize; 4] = [8, 32, 128, 512];

fn objectives() -> Vec<(String, LossConfig)> {
    use Variable::*;
    let sets: [&[Variable]; 7] = [&[P], &[I], &[Iq], &[P, I], &[P, Iq], &[I, Iq], &[P, I, Iq]];
    let name = |set: &[Variable]| set.iter().map(|v| v.name()).collect::<Vec<_>>().join(",");
    let mut out = Vec::new();
    for set in sets {
        out.push((
            format!("uni_{{{}}}", name(set)),
            LossConfig::new(ObjectiveKind::Univariate, set),
        ));
    }
    for set in sets.iter().filter(|s| s.len() >= 2) {
        out.push((
            format!("multi_{{{}}}", name(set)),
            LossConfig::new(ObjectiveKind::Multivariate, set),
        ));
    }
    out
}

fn bench(c: &mut Criterion) {
    let device = Device::flex();
    for b in SIZES {
        let batch = losses_data::batch(b, b - 1, D, 0x1f_e1bed, &device);
        let mut group = c.benchmark_group(format!("losses/B={b}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_millis(if b >= 512 { 2500 } else { 1000 }));
        for (name, config) in objectives() {
            let loss = config.init().expect("valid objective");
            group.bench_function(&name, |bencher| {
                bencher.iter(|| {
                    // Reading the scalar back forces the computation to finish.
                    loss.forward(&batch)
                        .try_to_vec_as::<f32>()
                        .expect("loss readback")[0]
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
