//! The matrix-product probe of a GPU device (`infembed devices --probe-matmul`): times each of
//! cubek's matrix-product routines on the products an encoder computes, in f32 and in f16 (f16
//! operands and output, f32 sums), and checks each result against a product computed on the
//! host in f64.
//!
//! There is no "f32 with f16 products" row: cubek 0.3 derives each routine's stage and register
//! types from the operands' global types (`MatmulElems::from_globals`), so f16 products of f32
//! tensors need the operands cast to f16 first, which is the f16 row plus two casts.
//!
//! burn 0.22 without its `autotune` feature sends every product to cubek's `Strategy::Auto`:
//! the tensor-core routine when the device lists a cooperative-matrix configuration for the
//! operands' types, else the plain SIMT routine. On an H100 through Vulkan every product of the
//! encoder took that SIMT routine, about a tenth of the GPU's f32 rate (docs/devices.md,
//! "Where a GPU step goes"), and autotuning chose slower kernels still. The probe says, for
//! one device and these shapes, which routines run, how fast, and how exactly, so that the
//! products can be routed to the best one.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use burn::backend::Cube;
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use cubek::matmul::definition::MatmulSetupError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::device::panic_message;
use crate::error::{Error, Result};
use crate::ops::routed::{LaunchError, launch};
use crate::routine::{Launcher, MatmulRoutine};

/// The shapes and repetitions of a probe. The defaults are all-MiniLM-L6-v2's products on
/// 4,096 tokens (sequences of 128).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MatmulProbe {
    /// Token rows of the per-token products (`M`).
    pub tokens: usize,
    /// The model's width.
    pub hidden: usize,
    /// The feed-forward width.
    pub intermediate: usize,
    /// Attention heads (the score products' batch is `heads * tokens / seq`).
    pub heads: usize,
    /// Sequence length of the score products.
    pub seq: usize,
    /// Timed launches per routine, after one untimed launch.
    pub repeats: usize,
    /// Only these routines (names as [`routine_names`] gives them); all when empty.
    pub routines: Vec<String>,
    /// Only these precisions; all when empty.
    pub precisions: Vec<ProbePrecision>,
}

impl Default for MatmulProbe {
    fn default() -> Self {
        Self {
            tokens: 4096,
            hidden: 384,
            intermediate: 1536,
            heads: 12,
            seq: 128,
            repeats: 20,
            routines: Vec::new(),
            precisions: Vec::new(),
        }
    }
}

/// The element types a probed product computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbePrecision {
    /// f32 operands, products and sums.
    F32,
    /// f16 operands and output, f32 sums.
    F16,
}

impl ProbePrecision {
    /// All of them, in the order probed.
    pub const ALL: [ProbePrecision; 2] = [Self::F32, Self::F16];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }

    /// The operands' and the output's type.
    fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::F16 => DType::F16,
        }
    }
}

impl std::str::FromStr for ProbePrecision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::UnknownName {
                what: "probe precision",
                name: s.to_string(),
                expected: "f32 or f16".into(),
            })
    }
}

/// What became of one routine on one product.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
#[non_exhaustive]
pub enum ProbeOutcome {
    /// It ran: the mean time of a launch, the rate, and its largest difference from the f64
    /// host product relative to that product's largest magnitude.
    Ran {
        /// Milliseconds per launch.
        ms: f64,
        /// Tera floating-point operations per second (`2 B M N K` per launch).
        tflops: f64,
        /// `max |out - ref| / max |ref|` over the sampled rows.
        rel_err: f64,
    },
    /// cubek declined it for this device, types or shape (its reason).
    Unavailable {
        /// cubek's reason.
        reason: String,
    },
    /// It failed or panicked while launching or running.
    Failed {
        /// The error or panic message.
        reason: String,
    },
}

/// One row of a probe: a routine on a product in a precision.
#[derive(Debug, Clone, Serialize)]
pub struct MatmulTiming {
    /// The product (`proj`, `ffn_up`, `ffn_down`, `grad_input`, `grad_weight`, `scores`).
    pub case: &'static str,
    /// `[B, M, K, N]`.
    pub shape: [usize; 4],
    /// Which operands are read as transposed views (`lhs`, `rhs`).
    pub transposed: [bool; 2],
    /// The element types.
    pub precision: ProbePrecision,
    /// The routine (`burn` is burn's own `matmul`; the models call `blocked_split` by default).
    pub routine: String,
    /// The result.
    pub outcome: ProbeOutcome,
}

/// What a probe found: the tensor-core configurations the device offers cubek, and one row per
/// product, precision and routine.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ProbeReport {
    /// The device's cooperative-matrix (tensor-core) configurations as cubecl registered them,
    /// `a x b -> c/d, MxNxK` (empty: cubek's tensor-core routines cannot run there).
    pub cmma_configs: Vec<String>,
    /// The timings.
    pub rows: Vec<MatmulTiming>,
}

/// One product of the probe.
struct Case {
    name: &'static str,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    lhs_t: bool,
    rhs_t: bool,
}

impl Case {
    /// The stored shape of an operand (`rows x cols` as multiplied, swapped when read
    /// transposed).
    fn stored(&self, rows: usize, cols: usize, transposed: bool) -> [usize; 3] {
        if transposed {
            [self.batch, cols, rows]
        } else {
            [self.batch, rows, cols]
        }
    }
}

fn cases(p: &MatmulProbe) -> Vec<Case> {
    let (t, d, f) = (p.tokens, p.hidden, p.intermediate);
    let head = d / p.heads.max(1);
    let seqs = (t / p.seq.max(1)).max(1);
    let case = |name, batch, m, k, n, lhs_t, rhs_t| Case {
        name,
        batch,
        m,
        k,
        n,
        lhs_t,
        rhs_t,
    };
    vec![
        case("proj", 1, t, d, d, false, false),
        case("ffn_up", 1, t, d, f, false, false),
        case("ffn_down", 1, t, f, d, false, false),
        // dX = dY W^T, W stored [d, f]
        case("grad_input", 1, t, f, d, false, true),
        // dW = X^T dY, X stored [t, d]
        case("grad_weight", 1, d, t, f, true, false),
        // q k^T per head, k stored [seq, head]
        case("scores", seqs * p.heads, p.seq, head, p.seq, false, true),
    ]
}

/// The routines probed ([`MatmulRoutine::all`]), with the launcher of each (`None`:
/// burn's own `matmul`).
fn routines() -> Vec<(String, Option<Launcher>)> {
    MatmulRoutine::all()
        .map(|r| (r.name().to_string(), r.launcher()))
        .collect()
}

/// The names of the routines a probe can time (`burn` is burn's own `matmul`; the names of
/// [`MatmulRoutine`]).
pub fn routine_names() -> Vec<String> {
    MatmulRoutine::all().map(|r| r.name().to_string()).collect()
}

/// Host data of one product: operands as stored, and the f64 reference of some output rows.
struct HostCase {
    lhs: Vec<f32>,
    rhs: Vec<f32>,
    /// `(batch, row)` of each sampled output row, and the rows (`n` values each).
    rows: Vec<(usize, usize)>,
    reference: Vec<f64>,
    max_ref: f64,
}

fn host_case(case: &Case, seed: u64) -> HostCase {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut fill =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let lhs = fill(case.batch * case.m * case.k);
    let rhs = fill(case.batch * case.k * case.n);
    // element (b, i, j) of an operand read as `rows x cols`
    let at = |data: &[f32], b: usize, i: usize, j: usize, rows: usize, cols: usize, t: bool| {
        let idx = if t {
            b * rows * cols + j * rows + i
        } else {
            b * rows * cols + i * cols + j
        };
        f64::from(data[idx])
    };
    let samples = 16.min(case.m);
    let mut rows = Vec::new();
    for s in 0..samples {
        let b = (s * 7919) % case.batch;
        let i = (s * case.m) / samples;
        rows.push((b, i));
    }
    let mut reference = Vec::with_capacity(rows.len() * case.n);
    for &(b, i) in &rows {
        for j in 0..case.n {
            let mut acc = 0.0;
            for l in 0..case.k {
                acc += at(&lhs, b, i, l, case.m, case.k, case.lhs_t)
                    * at(&rhs, b, l, j, case.k, case.n, case.rhs_t);
            }
            reference.push(acc);
        }
    }
    let max_ref = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    HostCase {
        lhs,
        rhs,
        rows,
        reference,
        max_ref,
    }
}

/// The operands of a case on the device, in `precision`'s global type, read as multiplied
/// (`[B, M, K]`, `[B, K, N]`, transposed views where the case says).
fn operands(
    case: &Case,
    host: &HostCase,
    precision: ProbePrecision,
    device: &Device,
) -> (Tensor<3>, Tensor<3>) {
    let make = |data: &[f32], rows, cols, t| {
        let stored = case.stored(rows, cols, t);
        let x = Tensor::<3>::from_data(TensorData::new(data.to_vec(), stored), device)
            .cast(precision.dtype());
        if t { x.swap_dims(1, 2) } else { x }
    };
    (
        make(&host.lhs, case.m, case.k, case.lhs_t),
        make(&host.rhs, case.k, case.n, case.rhs_t),
    )
}

/// `max |out - ref| / max |ref|` over the sampled rows.
fn rel_err(out: Tensor<3>, case: &Case, host: &HostCase) -> Result<f64> {
    let values = out
        .cast(DType::F32)
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| Error::Readback(format!("{e:?}")))?;
    let mut worst = 0.0f64;
    for (r, &(b, i)) in host.rows.iter().enumerate() {
        for j in 0..case.n {
            let got = f64::from(values[(b * case.m + i) * case.n + j]);
            let want = host.reference[r * case.n + j];
            let diff = if got.is_finite() {
                (got - want).abs()
            } else {
                f64::INFINITY
            };
            worst = worst.max(diff);
        }
    }
    Ok(worst / host.max_ref.max(f64::MIN_POSITIVE))
}

/// Why a routine did not run: cubek declined it (`Unavailable` / `InvalidConfig`: not for
/// this device, these types or this shape), or something failed.
enum NotRun {
    Declined(String),
    Failed(String),
}

impl From<MatmulSetupError> for NotRun {
    fn from(e: MatmulSetupError) -> Self {
        let text = format!("{e}");
        match e {
            MatmulSetupError::Unavailable(_) | MatmulSetupError::InvalidConfig(_) => {
                Self::Declined(text)
            }
            _ => Self::Failed(text),
        }
    }
}

/// Runs `launch` once (compiling its kernel), then `repeats` times, and times the repeats.
fn time_launches(
    device: &Device,
    repeats: usize,
    mut launch: impl FnMut() -> std::result::Result<Tensor<3>, NotRun>,
) -> std::result::Result<(Tensor<3>, f64), NotRun> {
    let sync = || device.sync().map_err(|e| NotRun::Failed(format!("{e:?}")));
    let out = launch()?;
    sync()?;
    let start = Instant::now();
    for _ in 0..repeats {
        launch()?;
    }
    sync()?;
    Ok((
        out,
        start.elapsed().as_secs_f64() * 1e3 / repeats.max(1) as f64,
    ))
}

impl From<LaunchError> for NotRun {
    fn from(e: LaunchError) -> Self {
        match e {
            LaunchError::Setup(e) => e.into(),
            LaunchError::Operands(e) => Self::Failed(e),
        }
    }
}

/// Times the routines of `probe` on `device` (a GPU device: `wgpu`, `vulkan` or `cuda`), one
/// row per product, precision and routine. A routine that cubek declines, or that fails, is a
/// row saying so; the probe goes on.
///
/// # Errors
/// [`Error::Device`] when `device` is not a cubecl device; [`Error::InvalidConfig`] for a
/// routine name it does not know or a size of 0.
pub fn probe_matmuls(device: &Device, probe: &MatmulProbe) -> Result<ProbeReport> {
    for (field, value) in [
        ("tokens", probe.tokens),
        ("hidden", probe.hidden),
        ("intermediate", probe.intermediate),
        ("heads", probe.heads),
        ("seq", probe.seq),
        ("repeats", probe.repeats),
    ] {
        if value == 0 {
            return Err(Error::InvalidConfig {
                path: "<MatmulProbe>".into(),
                field: field.to_string(),
                problem: "must be at least 1".to_string(),
            });
        }
    }
    let known = routine_names();
    if let Some(bad) = probe.routines.iter().find(|r| !known.contains(r)) {
        return Err(Error::InvalidConfig {
            path: "<MatmulProbe>".into(),
            field: "routines".to_string(),
            problem: format!(
                "unknown routine {bad:?} (expected one of {})",
                known.join(", ")
            ),
        });
    }
    let wanted = |name: &str| probe.routines.is_empty() || probe.routines.iter().any(|r| r == name);
    let precisions: Vec<ProbePrecision> = if probe.precisions.is_empty() {
        ProbePrecision::ALL.to_vec()
    } else {
        probe.precisions.clone()
    };
    let Ok(check) = Tensor::<1>::zeros([1], device).try_into_primitive::<Cube>() else {
        return Err(Error::Device {
            device: format!("{device:?}"),
            problem: "the matmul probe runs on cubecl devices (wgpu, vulkan, cuda; not a \
                      `fusion` build)"
                .to_string(),
        });
    };
    let cmma_configs = check
        .client
        .properties()
        .features
        .matmul
        .cmma
        .iter()
        .map(|c| {
            format!(
                "{} x {} -> {}, {}x{}x{}",
                c.a_type, c.b_type, c.cd_type, c.m, c.n, c.k
            )
        })
        .collect();
    let routines = routines();
    let mut rows = Vec::new();
    for (c, case) in cases(probe).iter().enumerate() {
        let host = host_case(case, 7 + c as u64);
        let flops = 2.0 * (case.batch * case.m * case.n * case.k) as f64;
        for &precision in &precisions {
            let (lhs, rhs) = operands(case, &host, precision, device);
            let finish = |timed: std::result::Result<(Tensor<3>, f64), NotRun>| match timed {
                Ok((out, ms)) => match rel_err(out, case, &host) {
                    Ok(err) => ProbeOutcome::Ran {
                        ms,
                        tflops: flops / (ms * 1e-3) / 1e12,
                        rel_err: err,
                    },
                    Err(e) => ProbeOutcome::Failed {
                        reason: e.to_string(),
                    },
                },
                Err(NotRun::Declined(reason)) => ProbeOutcome::Unavailable { reason },
                Err(NotRun::Failed(reason)) => ProbeOutcome::Failed { reason },
            };
            for (name, launcher) in &routines {
                if !wanted(name) {
                    continue;
                }
                let launch = || match launcher {
                    None => Ok(lhs.clone().matmul(rhs.clone())),
                    Some(launcher) => Ok(launch(launcher, &lhs, &rhs)?),
                };
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    finish(time_launches(device, probe.repeats, launch))
                }))
                .unwrap_or_else(|p| ProbeOutcome::Failed {
                    reason: panic_message(&p),
                });
                log::debug!(
                    "probe {} {} {name}: {outcome:?}",
                    case.name,
                    precision.name()
                );
                rows.push(MatmulTiming {
                    case: case.name,
                    shape: [case.batch, case.m, case.k, case.n],
                    transposed: [case.lhs_t, case.rhs_t],
                    precision,
                    routine: name.clone(),
                    outcome,
                });
            }
        }
    }
    Ok(ProbeReport { cmma_configs, rows })
}
