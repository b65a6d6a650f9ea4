//! What the pool shows the workbench: each (layer, expert)'s state, read under the pool's lock.

use super::slots::{Origin, SlotState, State};

/// What one (layer, expert) of the pool is doing, for the workbench's residency grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    Free,
    Resident,
    /// A demand read queued or in flight.
    Reading,
    /// Queued, in flight or loaded by a prediction and not used yet.
    Predicted,
    /// Evicted within the last two tokens.
    Evicted,
}

/// The pool's state, `cells[layer * num_experts + expert]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Residency {
    pub n_layers: usize,
    pub num_experts: usize,
    pub cells: Vec<Cell>,
    pub resident_bytes: u64,
    pub budget_bytes: u64,
}

impl State {
    /// What every (layer, expert) is doing now.
    pub(super) fn residency(&self) -> Residency {
        let d = self.dims;
        let mut cells = vec![Cell::Free; d.n_layers * d.num_experts];
        for (&(l, e), &t) in &self.evicted_at {
            if t + 2 > self.token {
                cells[l * d.num_experts + e] = Cell::Evicted;
            }
        }
        let mut resident = 0u64;
        for s in self.slots.iter().flatten() {
            let c = match (&s.state, s.origin) {
                (SlotState::Ready, Origin::Prefetch) if !s.used => Cell::Predicted,
                (SlotState::Ready, _) => Cell::Resident,
                (SlotState::Queued | SlotState::Reading, Origin::Prefetch) => Cell::Predicted,
                (SlotState::Queued | SlotState::Reading, Origin::Demand) => Cell::Reading,
                (SlotState::Failed(_), _) => Cell::Free,
            };
            if s.state == SlotState::Ready {
                resident += d.blob_len as u64;
            }
            cells[s.key.0 * d.num_experts + s.key.1] = c;
        }
        Residency {
            n_layers: d.n_layers,
            num_experts: d.num_experts,
            cells,
            resident_bytes: resident,
            budget_bytes: self.capacity as u64 * d.blob_len as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::slots::Origin;
    use super::super::slots::tests::{load, state};
    use super::*;
    use crate::experts::policy::PolicyKind;

    #[test]
    fn cells_show_what_each_expert_is_doing() {
        let mut st = state(4, PolicyKind::Lru);
        load(&mut st, (0, 0));
        st.reserve((0, 1), Origin::Demand, None).unwrap();
        st.reserve((1, 3), Origin::Prefetch, Some(0.7)).unwrap();
        let r = st.residency();
        assert_eq!(r.cells[0], Cell::Resident);
        assert_eq!(r.cells[1], Cell::Reading);
        assert_eq!(r.cells[4 + 3], Cell::Predicted);
        assert_eq!(r.cells.iter().filter(|c| **c == Cell::Free).count(), 8 - 3);
        assert_eq!((r.resident_bytes, r.budget_bytes), (4096, 4 * 4096));
    }
}
