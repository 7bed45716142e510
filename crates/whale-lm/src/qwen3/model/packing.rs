//! A padded batch's real tokens packed end to end: the sequences the training pass runs over
//! ([`super::training`]) and, per padded position, the packed row it went to.

/// The real tokens of a padded batch as sequences, and where each position went.
pub struct Packing {
    pub sequences: Vec<Vec<u32>>,
    /// Per position of the padded batch, its row among the packed tokens (`None`: padding).
    pub rows: Vec<Option<u32>>,
}

impl Packing {
    /// `ids` is row-major `[rows, steps]`; `real(at)` tells a token from padding.
    pub fn of_padded(ids: &[u32], steps: usize, real: impl Fn(usize) -> bool) -> Self {
        let mut sequences = vec![Vec::new(); ids.len().div_ceil(steps.max(1))];
        let mut packed = 0u32;
        let rows = (0..ids.len())
            .map(|at| {
                real(at).then(|| {
                    sequences[at / steps].push(ids[at]);
                    packed += 1;
                    packed - 1
                })
            })
            .collect();
        Self { sequences, rows }
    }

    /// How many tokens were packed.
    pub fn tokens(&self) -> usize {
        self.sequences.iter().map(Vec::len).sum()
    }

    pub fn sequence_slices(&self) -> Vec<&[u32]> {
        self.sequences.iter().map(Vec::as_slice).collect()
    }
}
