//! Which matrix-product routine computes the linear layers on a GPU device
//! ([`MatmulRoutine`]).
//!
//! burn 0.22 (without its `autotune` feature) sends every product to cubek's `Strategy::Auto`,
//! which took cubek's plain SIMT kernel for each of the encoder's products on an H100 through
//! Vulkan, at about a tenth of the GPU's f32 rate (docs/devices.md, "Where a GPU step goes").
//! `infembed devices --probe-matmul` times every routine of cubek 0.3 on those products; this
//! setting sends the linear layers' products (forward and, in training, both backward
//! products) to the routine it names, so the fastest one can be used without rebuilding. The
//! names are the probe's.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// The routines by name, in the probe's order: burn's own `matmul` (what burn chooses), cubek's
/// `auto`, its SIMT routines, this project's register-blocked SIMT kernel (`blocked`, with its
/// tile chosen per product, or fixed at `64 x 64` or `128 x 128` output blocks; `blocked_split`
/// also splits the depth of products with few blocks), then cubek's
/// tensor-core routines (`cmma`: cooperative matrices, `mma`: plane matrix instructions), as
/// burn's autotuner lists them.
const NAMES: [&str; 24] = [
    "burn",
    "auto",
    "simple_unit",
    "double_unit",
    "simple_unit_min_tile",
    "double_unit_min_tile",
    "gemm",
    "naive",
    "blocked",
    "blocked_64",
    "blocked_128",
    "blocked_split",
    "simple_cyclic_cmma",
    "simple_cyclic_cmma_multi_rows",
    "double_cyclic_cmma",
    "double_cyclic_cmma_specialized",
    "ordered_double_cmma_rows4",
    "ordered_double_cmma_rows8",
    "simple_cyclic_mma",
    "simple_cyclic_mma_multi_rows",
    "double_cyclic_mma",
    "double_cyclic_mma_specialized",
    "ordered_double_mma_rows4",
    "ordered_double_mma_rows8",
];

/// The matrix-product routine of a GPU device's linear layers: this project's register-blocked
/// SIMT kernel (`blocked_split`, the default: its tile chosen per product and the depth of
/// products whose blocks leave the device idle split into parts; `blocked` the same kernel
/// without the split; `blocked_64` and `blocked_128` fix the tile, unsplit), `burn` (burn's own
/// `matmul`, which asks cubek to choose), or one of cubek 0.3's routines by the name that
/// `infembed devices --probe-matmul` reports it under (`double_unit`, `simple_cyclic_cmma`,
/// ...; [`MatmulRoutine::all`]).
///
/// The blocked kernel is the default because on an NVIDIA H100 (through Vulkan) it computed
/// every `f32` product of all-MiniLM-L6-v2 but the `384 x 384` projections faster than burn's
/// choice (the weight gradient 17 times as fast), encoding ran 1.09x to 1.25x as fast through
/// it, and the quickstart trained 2.1 times as fast through its `128 x 128` tile. The split is
/// on by default since an NVIDIA H200 (2026-11-28) trained the quickstart at 146 rows a second
/// through `blocked_split` against 122 through `blocked`, the device time of ten profiled steps
/// 350 ms against 536, and encoded at the same rate (docs/devices.md, docs/benchmarks.md).
///
/// A routine that cubek declines for a product (a tensor-core routine on a device without
/// tensor cores for the operands' type, a layout it does not take) leaves that product to
/// burn's `matmul`, so every routine gives burn's results to float rounding. The routine
/// applies only on a cubecl GPU device (`wgpu`, `vulkan`, `cuda`) of a build without `fusion`:
/// the CPU and `fusion` builds compute their own products whatever it says, and refuse a
/// routine other than `burn` when it is asked for.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatmulRoutine(u8);

impl Default for MatmulRoutine {
    /// [`MatmulRoutine::BLOCKED_SPLIT`].
    fn default() -> Self {
        Self::BLOCKED_SPLIT
    }
}

impl MatmulRoutine {
    /// burn's own `matmul`.
    pub const BURN: Self = Self(0);

    /// This project's blocked kernel with its tile chosen per product, unsplit.
    pub const BLOCKED: Self = Self(8);

    /// This project's blocked kernel with its tile chosen per product and the depth of
    /// products with few blocks split (the default).
    pub const BLOCKED_SPLIT: Self = Self(11);

    /// Every routine, in the probe's order (`burn` first).
    pub fn all() -> impl Iterator<Item = Self> {
        (0..NAMES.len() as u8).map(Self)
    }

    /// Its name, as the command line, configs and the probe spell it.
    pub fn name(self) -> &'static str {
        NAMES[usize::from(self.0)]
    }

    /// Whether this is burn's own `matmul` (no routing).
    pub fn is_burn(self) -> bool {
        self == Self::BURN
    }

    /// What launches this routine's products (`None` for burn's own `matmul`).
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    pub(crate) fn launcher(self) -> Option<Launcher> {
        use crate::ops::blocked::{Blocking, Tile};
        let blocked = |tile, parts| Launcher::Blocked(Blocking { tile, parts });
        Some(match self.name() {
            "burn" => return None,
            "blocked" => blocked(None, Some(1)),
            "blocked_64" => blocked(Some(Tile::SMALL), Some(1)),
            "blocked_128" => blocked(Some(Tile::LARGE), Some(1)),
            "blocked_split" => blocked(None, None),
            _ => Launcher::Cubek(self.strategy()),
        })
    }

    /// cubek's strategy for this routine, one of cubek's (not `burn` nor a `blocked` one:
    /// [`launcher`](Self::launcher) takes those).
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    fn strategy(self) -> cubek::matmul::strategy::Strategy {
        use cubek::matmul::multi_level::Strategy as Routine;
        use cubek::matmul::multi_level::components::tile::TileMatmulKind;
        use cubek::matmul::multi_level::routines::TileSizeSelection;
        use cubek::matmul::multi_level::routines::batch::double_buffering::DoubleBufferingArgs;
        use cubek::matmul::multi_level::routines::batch::double_unit::DoubleUnitSelectionArgs;
        use cubek::matmul::multi_level::routines::batch::ordered_double_buffering::OrderedSelectionArgs;
        use cubek::matmul::multi_level::routines::batch::simple::SimpleArgs;
        use cubek::matmul::multi_level::routines::batch::simple_unit::SimpleUnitSelectionArgs;
        use cubek::matmul::routine::BlueprintStrategy::Inferred;
        use cubek::matmul::strategy::Strategy;

        let name = self.name();
        if name == "auto" {
            return Strategy::Auto;
        }
        let tile_size = if name.ends_with("_min_tile") {
            TileSizeSelection::MinTileSize
        } else {
            TileSizeSelection::MaxTileSize
        };
        let kind = if name.contains("_mma") {
            TileMatmulKind::Mma
        } else {
            TileMatmulKind::Cmma
        };
        let cmma = kind == TileMatmulKind::Cmma;
        let simple = |multi_rows| {
            Inferred(SimpleArgs {
                tile_matmul: kind,
                multi_rows,
            })
        };
        let double = |specialized| {
            Inferred(DoubleBufferingArgs {
                tile_matmul: kind,
                specialized,
            })
        };
        let ordered = |row_count| {
            Inferred(OrderedSelectionArgs {
                tile_matmul: kind,
                partition_k: Some(2),
                row_count: Some(row_count),
                rows_per_plane: Some(2),
            })
        };
        let routine = match name.trim_end_matches("_min_tile") {
            "simple_unit" => Routine::SimpleUnit(Inferred(SimpleUnitSelectionArgs { tile_size })),
            "double_unit" => Routine::DoubleUnit(Inferred(DoubleUnitSelectionArgs { tile_size })),
            "gemm" => Routine::Gemm(Inferred(Default::default())),
            "naive" => Routine::Naive,
            n if n.starts_with("simple_cyclic") => {
                let args = simple(n.ends_with("_multi_rows"));
                if cmma {
                    Routine::SimpleCyclicCmma(args)
                } else {
                    Routine::SimpleCyclicMma(args)
                }
            }
            n if n.starts_with("double_cyclic") => {
                let args = double(n.ends_with("_specialized"));
                if cmma {
                    Routine::DoubleCyclicCmma(args)
                } else {
                    Routine::DoubleCyclicMma(args)
                }
            }
            n => {
                let args = ordered(if n.ends_with("rows4") { 4 } else { 8 });
                if cmma {
                    Routine::OrderedDoubleCmma(args)
                } else {
                    Routine::OrderedDoubleMma(args)
                }
            }
        };
        Strategy::MultiLevel(routine)
    }
}

/// How a routine's products are launched ([`MatmulRoutine::launcher`]).
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) enum Launcher {
    /// Through one of cubek's routines.
    Cubek(cubek::matmul::strategy::Strategy),
    /// Through this project's blocked kernel, with its tile and depth split (`None`: chosen
    /// per product).
    Blocked(crate::ops::blocked::Blocking),
}

impl fmt::Debug for MatmulRoutine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MatmulRoutine({})", self.name())
    }
}

impl fmt::Display for MatmulRoutine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MatmulRoutine {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::all()
            .find(|r| r.name() == s)
            .ok_or_else(|| Error::UnknownName {
                what: "matmul routine",
                name: s.to_string(),
                expected: format!(
                    "one of {} (`infembed devices --probe-matmul` times them)",
                    NAMES.join(", ")
                ),
            })
    }
}

impl Serialize for MatmulRoutine {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for MatmulRoutine {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        let names: Vec<&str> = MatmulRoutine::all().map(MatmulRoutine::name).collect();
        assert_eq!(names.len(), NAMES.len());
        for r in MatmulRoutine::all() {
            assert_eq!(r.name().parse::<MatmulRoutine>().unwrap(), r);
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<MatmulRoutine>(&json).unwrap(), r);
        }
        assert_eq!(MatmulRoutine::default(), MatmulRoutine::BLOCKED_SPLIT);
        assert_eq!(MatmulRoutine::BLOCKED.name(), "blocked");
        assert_eq!(MatmulRoutine::BLOCKED_SPLIT.name(), "blocked_split");
        assert_eq!(MatmulRoutine::BURN.name(), "burn");
        assert!(!MatmulRoutine::default().is_burn());
        let err = "double-unit"
            .parse::<MatmulRoutine>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("matmul routine") && err.contains("double_unit"),
            "{err}"
        );
    }

    /// Every name but `burn` and the `blocked` ones maps to a cubek strategy of its own family
    /// (cubek's display name starts with it) and its own arguments (no two display names are
    /// equal); the `blocked` ones to this project's kernel, each with its own tile and split.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    #[test]
    fn every_name_maps_to_its_own_strategy() {
        use crate::ops::blocked::{Blocking, Tile};
        assert!(MatmulRoutine::BURN.launcher().is_none());
        let mut shown = std::collections::HashSet::new();
        let mut tiles = Vec::new();
        for r in MatmulRoutine::all().skip(1) {
            let s = match r.launcher() {
                Some(Launcher::Cubek(s)) => s,
                Some(Launcher::Blocked(blocking)) => {
                    assert!(r.name().starts_with("blocked"), "{r}");
                    tiles.push(blocking);
                    continue;
                }
                None => panic!("{r} has no launcher"),
            };
            let display = s.to_string();
            let family = [
                "_min_tile",
                "_multi_rows",
                "_specialized",
                "_rows4",
                "_rows8",
            ]
            .iter()
            .fold(r.name(), |n, suffix| n.trim_end_matches(suffix));
            assert!(
                display.trim_start_matches("matmul_").starts_with(family),
                "{r}: cubek's strategy is {display}"
            );
            assert!(shown.insert(display.clone()), "{r}: {display} twice");
        }
        let blocking = |tile, parts| Blocking { tile, parts };
        assert_eq!(
            tiles,
            [
                blocking(None, Some(1)),
                blocking(Some(Tile::SMALL), Some(1)),
                blocking(Some(Tile::LARGE), Some(1)),
                blocking(None, None),
            ]
        );
    }
}
