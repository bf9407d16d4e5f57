//! The three matrix products of an all-MiniLM-L6-v2 layer (batch of 32 sequences of 132
//! tokens) through burn's `flex` linear op and through `infembed_encoder::bench_internals` (the
//! `f32` product, the int8 one on each instruction set this processor has, and the bf16 one where
//! it has AVX512-BF16), best of 7 runs each, in GFLOP/s (int8: the `f32` operations it stands for).
//! See `docs/benchmarks.md`.
//!
//! ```text
//! cargo build --release --workspace --examples
//! target/release/examples/gemm_shapes
//! INT8_ISA=avx512-vnni target/release/examples/gemm_shapes   # one path only (profiling; or avx512-bf16)
//! ```

use std::time::Instant;

use burn::tensor::{Device, Distribution, Tensor};
use infembed_encoder::bench_internals::{
    Activation, Epilogue, Isa, MatRef, QuantizedMatrix, gemm, qgemm_with,
};

/// Best wall time of 7 runs of `f`, in seconds.
fn best_of_7(mut f: impl FnMut()) -> f64 {
    (0..7)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let device = Device::flex();
    let (batch, tokens) = (32usize, 132usize);
    let rows = batch * tokens;
    for (d_in, d_out) in [(384usize, 384usize), (384, 1536), (1536, 384)] {
        // activations and weights of a trained layer's scale (outputs about N(0, 1)); uniform
        // [0, 1) operands would put GELU's inputs near 100, where its `exp` underflows to
        // subnormals and the epilogue measures the processor's subnormal penalty instead
        let x: Tensor<3> = Tensor::random(
            [batch, tokens, d_in],
            Distribution::Normal(0.0, 1.0),
            &device,
        );
        let w: Tensor<2> = Tensor::random(
            [d_in, d_out],
            Distribution::Normal(0.0, 1.0 / (d_in as f64).sqrt()),
            &device,
        );
        let flops = 2.0 * (rows * d_in * d_out) as f64;
        let report = |what: &str, secs: f64| {
            println!(
                "{d_in:>4} -> {d_out:<4} {what:<24} {:7.2} ms {:6.1} GFLOP/s",
                secs * 1e3,
                flops / secs / 1e9
            );
        };
        report(
            "burn flex linear",
            best_of_7(|| {
                let y = burn::tensor::module::linear(x.clone(), w.clone(), None);
                std::hint::black_box(y.into_data());
            }),
        );
        let xs = x.into_data().try_to_vec::<f32>().expect("f32");
        let ws = w.into_data().try_to_vec::<f32>().expect("f32");
        let bias = vec![0.1f32; d_out];
        let epilogues = [
            ("", Epilogue::default()),
            (
                "+bias+GELU",
                Epilogue {
                    bias: Some(&bias),
                    accumulate: false,
                    activation: Activation::Gelu,
                },
            ),
        ];
        for (what, epilogue) in epilogues {
            report(
                &format!("infembed gemm{what}"),
                best_of_7(|| {
                    let mut c = vec![0f32; rows * d_out];
                    gemm(
                        MatRef::row_major(&xs, rows, d_in),
                        MatRef::row_major(&ws, d_in, d_out),
                        &mut c,
                        epilogue,
                    );
                    std::hint::black_box(c);
                }),
            );
        }
        let q = QuantizedMatrix::new(MatRef::row_major(&ws, d_in, d_out));
        let bf16 = QuantizedMatrix::bf16(MatRef::row_major(&ws, d_in, d_out));
        let only = std::env::var("INT8_ISA").ok();
        let paths = Isa::available()
            .into_iter()
            .map(|isa| (isa, "int8", &q))
            .chain(Isa::bf16().map(|isa| (isa, "bf16", &bf16)));
        for (isa, kind, q) in
            paths.filter(|(isa, _, _)| only.as_deref().is_none_or(|o| o == isa.name()))
        {
            for (what, epilogue) in epilogues {
                report(
                    &format!("{kind} {}{what}", isa.name()),
                    best_of_7(|| {
                        let mut c = vec![0f32; rows * d_out];
                        qgemm_with(isa, MatRef::row_major(&xs, rows, d_in), q, &mut c, epilogue);
                        std::hint::black_box(c);
                    }),
                );
            }
        }
    }
}
