//! From records to contrastive batches: the epoch order, the 3 rows per record, the
//! instruction negatives (drawn by [`crate::negatives`]) and the duplicate masks.
//!
//! Every random choice is a pure function of `(seed, epoch)` (the order of records) or
//! `(seed, step)` (the instruction negatives), so a resumed run draws exactly what an
//! uninterrupted one draws, and the checkpoint needs no generator state beyond the step.

use std::collections::HashSet;
use std::sync::Arc;

use burn::tensor::{Bool, Device, Tensor, TensorData};
use infembed_data::{InfIrRecord, LabelledPairs, Row, record_rows};
use infembed_encoder::Interaction;
use infembed_losses::NegativeMask;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::error::Result;
use crate::negatives::instruction_rows;

/// One contrastive batch: `3R` rows and, for each row, the rows whose instructions are its
/// instruction negatives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainBatch {
    /// Rows in record order: for each record (I+Q+ -> P+), (I-Q+ -> P1-), (I+Q- -> P2-).
    pub rows: Vec<Row>,
    /// `instruction_rows[i]`: the K rows whose instructions are combined with row i's query.
    pub instruction_rows: Vec<Vec<usize>>,
    /// Seed of the device generator for this batch's dropout masks (a function of the run's
    /// seed and the step), so that dropout is reproducible and resumable.
    pub dropout_seed: u64,
    /// Mined hard negatives of the batch's records ([`TrainBatch::with_mined`]): distinct
    /// texts, none equal to a row's passage, P-negatives of every row. Empty without mining.
    pub extra_passages: Vec<Arc<str>>,
    /// `[rows][extra]`: `true` where the extra passage is labelled relevant to the row's
    /// (instruction, query) somewhere in the training set, so it is no negative of that row.
    pub extra_excluded: Vec<Vec<bool>>,
}

/// The mined hard negatives of a training set, as batches use them: each record's list
/// (`infembed_data::read_mined_negatives`), how many of each list join a batch, and every
/// labelled (instruction, query) -> passage of the training set.
#[derive(Debug, Clone)]
pub struct MinedSet {
    lists: Vec<Vec<Arc<str>>>,
    labelled: LabelledPairs,
    per_record: usize,
}

impl MinedSet {
    /// `lists[r]`: record r's mined negatives, best first; the first `per_record` of each join
    /// its batch.
    pub fn new(lists: Vec<Vec<Arc<str>>>, records: &[InfIrRecord], per_record: usize) -> Self {
        MinedSet {
            lists,
            labelled: LabelledPairs::new(records),
            per_record,
        }
    }
}

impl TrainBatch {
    /// Builds the batch of `records` (indices into `all`): flattens them and draws the
    /// instruction negatives for `interaction` with a generator seeded by `(seed, step)`
    /// (K per row as [`instruction_negatives_per_row`](crate::instruction_negatives_per_row)
    /// says).
    pub fn new(
        all: &[InfIrRecord],
        records: &[usize],
        interaction: &Interaction,
        seed: u64,
        step: u64,
    ) -> Result<Self> {
        let rows: Vec<Row> = records
            .iter()
            .flat_map(|&r| record_rows(r, &all[r]))
            .collect();
        let instruction_rows =
            instruction_rows(interaction, rows.len(), &mut step_rng(seed, step))?;
        let n = rows.len();
        Ok(Self {
            rows,
            instruction_rows,
            dropout_seed: mix(seed, step),
            extra_passages: Vec::new(),
            extra_excluded: vec![Vec::new(); n],
        })
    }

    /// Adds the mined negatives of `records` (the indices this batch was built from): the
    /// first `per_record` of each record's list, in record order, without repeats and without
    /// texts that are already a row's passage (those are in-batch negatives already). Each is
    /// excluded for the rows it is labelled relevant to.
    pub fn with_mined(mut self, mined: &MinedSet, records: &[usize]) -> Self {
        let mut seen: HashSet<Arc<str>> =
            self.rows.iter().map(|r| Arc::clone(&r.passage)).collect();
        let mut extra = Vec::new();
        for &r in records {
            let list = mined.lists.get(r).map_or(&[][..], Vec::as_slice);
            for text in list.iter().take(mined.per_record) {
                if seen.insert(Arc::clone(text)) {
                    extra.push(Arc::clone(text));
                }
            }
        }
        self.extra_excluded = self
            .rows
            .iter()
            .map(|row| {
                extra
                    .iter()
                    .map(|p| mined.labelled.is_positive(&row.instruction, &row.query, p))
                    .collect()
            })
            .collect();
        self.extra_passages = extra;
        self
    }

    /// The `[rows, extra]` exclusion mask of the extra passages (`None` without any).
    pub fn extra_mask(&self, device: &Device) -> Option<Tensor<2, Bool>> {
        let m = self.extra_passages.len();
        (m > 0).then(|| {
            let v: Vec<bool> = self.extra_excluded.iter().flatten().copied().collect();
            Tensor::from_data(TensorData::new(v, [self.rows.len(), m]), device)
        })
    }

    /// The rows as the encoder's borrowed [`BatchRow`](infembed_encoder::BatchRow)s.
    pub fn encoder_rows(&self) -> Vec<infembed_encoder::BatchRow<'_>> {
        self.rows
            .iter()
            .map(|r| infembed_encoder::BatchRow {
                instruction: &r.instruction,
                query: &r.query,
                passage: &r.passage,
            })
            .collect()
    }

    /// Negatives whose text equals the positive's, as the losses crate's
    /// [`NegativeMask`]: the same passage text (P), the same instruction text among the
    /// instruction negatives (I), the same (instruction, query) pair (IQ).
    pub fn duplicate_mask(&self, device: &Device) -> NegativeMask {
        let n = self.rows.len();
        let k = self.instruction_rows.first().map_or(0, Vec::len);
        let square = |same: &dyn Fn(&Row, &Row) -> bool| -> Tensor<2, Bool> {
            let mut v = Vec::with_capacity(n * n);
            for a in &self.rows {
                for b in &self.rows {
                    v.push(same(a, b));
                }
            }
            Tensor::from_data(TensorData::new(v, [n, n]), device)
        };
        let passages = square(&|a, b| a.passage == b.passage);
        let pairs = square(&|a, b| a.instruction == b.instruction && a.query == b.query);
        let mut v = Vec::with_capacity(n * k);
        for (i, list) in self.instruction_rows.iter().enumerate() {
            for &j in list {
                v.push(self.rows[j].instruction == self.rows[i].instruction);
            }
        }
        let instructions = Tensor::from_data(TensorData::new(v, [n, k]), device);
        NegativeMask {
            passages: Some(passages),
            pairs: Some(pairs),
            instructions: Some(instructions),
            extra_passages: None,
        }
    }
}

/// The order of the `n` records in `epoch` (a seeded shuffle).
pub(crate) fn epoch_order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(epoch as u64);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    order
}

/// Batches of an epoch: consecutive chunks of [`epoch_order`], the last one shorter unless
/// `drop_last`.
pub(crate) fn epoch_batches(
    n: usize,
    records_per_batch: usize,
    drop_last: bool,
    seed: u64,
    epoch: usize,
) -> Vec<Vec<usize>> {
    epoch_order(n, seed, epoch)
        .chunks(records_per_batch)
        .filter(|c| !drop_last || c.len() == records_per_batch)
        .map(<[usize]>::to_vec)
        .collect()
}

/// SplitMix64 of `(a, b)`: a well-spread 64-bit value for deriving seeds.
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a
        .wrapping_add(b.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn step_rng(seed: u64, step: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream((1u64 << 40) + step);
    rng
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: usize, shared_passage: bool) -> InfIrRecord {
        let p = if shared_passage {
            "shared passage".to_string()
        } else {
            format!("passage {i}")
        };
        InfIrRecord::from_texts([
            &format!("query {i}"),
            &format!("instruction {i}"),
            &p,
            &format!("negative query {i}"),
            &format!("negative instruction {i}"),
            &format!("hard negative one {i}"),
            &format!("hard negative two {i}"),
        ])
        .unwrap()
    }

    #[test]
    fn epochs_are_permutations_and_reproducible() {
        let a = epoch_order(50, 7, 0);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_eq!(a, epoch_order(50, 7, 0));
        assert_ne!(a, epoch_order(50, 7, 1));
        assert_ne!(a, epoch_order(50, 8, 0));
        let b = epoch_batches(10, 4, false, 1, 0);
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), vec![4, 4, 2]);
        assert_eq!(epoch_batches(10, 4, true, 1, 0).len(), 2);
    }

    #[test]
    fn mined_passages_join_once_and_skip_their_labelled_rows() {
        let records: Vec<InfIrRecord> = (0..4).map(|i| record(i, false)).collect();
        let text = |s: &str| -> Arc<str> { Arc::from(s) };
        let lists = vec![
            // Record 0: record 3's positive (labelled for record 3's pair only), then a repeat.
            vec![
                text("passage 3"),
                text("outside"),
                text("hard negative one 1"),
            ],
            // Record 1: the same "outside" again and its batch mate's passage.
            vec![text("outside"), text("passage 0"), text("unused")],
            vec![],
            vec![text("passage 0")],
        ];
        let mined = MinedSet::new(lists, &records, 2);
        let batch = TrainBatch::new(&records, &[0, 1, 3], &Interaction::default(), 1, 0)
            .unwrap()
            .with_mined(&mined, &[0, 1, 3]);
        // "passage 3" and "passage 0" are rows' passages already; "outside" once; record
        // 1's third entry is beyond per_record.
        assert_eq!(batch.extra_passages, vec![text("outside")]);
        assert!(batch.extra_excluded.iter().flatten().all(|x| !x));
        // Without record 3 in the batch, "passage 3" joins, excluded for no row of the batch
        // (record 3's pair is not among them)...
        let batch = TrainBatch::new(&records, &[0, 2], &Interaction::default(), 1, 0)
            .unwrap()
            .with_mined(&mined, &[0, 2]);
        assert_eq!(
            batch.extra_passages,
            vec![text("passage 3"), text("outside")]
        );
        assert!(batch.extra_excluded.iter().flatten().all(|x| !x));
        // ...but a record repeating record 3's pair excludes it for that row.
        let mut twin = records.clone();
        twin[2] = InfIrRecord::from_texts([
            "query 3",
            "instruction 3",
            "passage 2",
            "nq",
            "ni",
            "h1",
            "h2",
        ])
        .unwrap();
        let mined = MinedSet::new(
            vec![vec![text("passage 3")], vec![], vec![], vec![]],
            &twin,
            1,
        );
        let batch = TrainBatch::new(&twin, &[0, 2], &Interaction::default(), 1, 0)
            .unwrap()
            .with_mined(&mined, &[0, 2]);
        assert_eq!(batch.extra_passages, vec![text("passage 3")]);
        let excluded: Vec<bool> = batch.extra_excluded.iter().map(|r| r[0]).collect();
        // Rows: record 0's three, then record 2's (I+Q+ = record 3's pair) first.
        assert_eq!(excluded, vec![false, false, false, true, false, false]);
        let mask = batch.extra_mask(&Device::flex()).unwrap();
        assert_eq!(mask.dims(), [6, 1]);
    }

    #[test]
    fn rows_and_masks_follow_the_texts() {
        let records: Vec<InfIrRecord> = (0..3).map(|i| record(i, i != 1)).collect();
        let interaction = Interaction::default();
        let batch = TrainBatch::new(&records, &[0, 1, 2], &interaction, 3, 9).unwrap();
        assert_eq!(batch.rows.len(), 9);
        // K = 9/2 - 1 = 3 distinct other rows per row.
        for (i, list) in batch.instruction_rows.iter().enumerate() {
            assert_eq!(list.len(), 3);
            assert!(!list.contains(&i));
        }
        assert_eq!(
            batch,
            TrainBatch::new(&records, &[0, 1, 2], &interaction, 3, 9).unwrap()
        );
        let device = Device::flex();
        let mask = batch.duplicate_mask(&device);
        let passages = mask
            .passages
            .unwrap()
            .into_data()
            .convert::<bool>()
            .try_into_vec::<bool>()
            .unwrap();
        // Naive: records 0 and 2 share their positive passage (rows 0 and 6).
        for i in 0..9 {
            for m in 0..9 {
                let same = batch.rows[i].passage == batch.rows[m].passage;
                assert_eq!(passages[i * 9 + m], same, "({i}, {m})");
            }
        }
        assert!(passages[6]);
        // Rows 0 and 2 of a record share I+: whenever row 2 is an instruction negative of
        // row 0, it is masked.
        let instr = mask
            .instructions
            .unwrap()
            .into_data()
            .convert::<bool>()
            .try_into_vec::<bool>()
            .unwrap();
        for (i, list) in batch.instruction_rows.iter().enumerate() {
            for (k, &j) in list.iter().enumerate() {
                let same = batch.rows[i].instruction == batch.rows[j].instruction;
                assert_eq!(instr[i * 3 + k], same);
            }
        }
    }
}
