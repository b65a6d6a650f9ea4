//! One layer's demand on the pool: its experts pinned (hits) or queued for reading (misses),
//! handed out as they become ready and unpinned when given back.
//!
//! [`Demand`] is the protocol on the pool's state alone (testable without threads or files);
//! [`Request`] adds the lock and the waiting.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::Key;
use super::Shared;
use super::slots::{Origin, SlotState, State};
use crate::experts::store::{AlignedBuf, ReadError};
use crate::package::PackageError;
use crate::trace;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Item {
    /// Pinned slot (ready or on its way).
    Slot(usize),
    /// Waiting for a slot.
    Pending,
    /// Handed out.
    Done,
}

/// A ready expert, pinned until given back with [`Request::release`].
pub struct ExpertBuf {
    pub expert: usize,
    slot: usize,
    buf: Arc<AlignedBuf>,
    pub flow: Option<u64>,
}

impl ExpertBuf {
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }
}

/// The experts MoE layer `li` asked for, and where each one is.
pub(super) struct Demand {
    pub li: usize,
    /// (expert, where it is), in the order asked.
    pub items: Vec<(usize, Item)>,
    /// How many were handed out.
    pub done: usize,
}

impl Demand {
    /// Ask for `experts` (in compute order, no duplicates) of MoE layer `li`: hits are pinned
    /// (a queued prefetch among them promoted), misses queued as demand reads as far as slots
    /// allow. True when an I/O worker has something new to do.
    pub fn open(st: &mut State, li: usize, experts: &[usize]) -> (Demand, bool) {
        st.active_layer = li;
        st.window.layer_request(li, Instant::now());
        let token = st.token;
        {
            let State { routes, scores, .. } = &mut *st;
            routes.observe(li, experts, token, scores);
        }
        // queued predictions for this layer that the route does not want: drop them unread;
        // those already read lose their confidence (the route refuted them)
        let wanted: HashSet<usize> = experts.iter().copied().collect();
        st.drop_queued_prefetches(|k| k.0 == li && !wanted.contains(&k.1));
        for s in st.slots.iter_mut().flatten() {
            if s.key.0 == li && !wanted.contains(&s.key.1) {
                s.predicted = None;
            }
        }
        let mut d = Demand { li, items: Vec::with_capacity(experts.len()), done: 0 };
        let mut wake = false;
        for &e in experts {
            let key = (li, e);
            // a read that failed earlier is tried again
            if let Some(si) = st.map.get(&key).copied() {
                let failed_unpinned =
                    st.slots[si].as_ref().is_some_and(|s| matches!(s.state, SlotState::Failed(_)) && s.pins == 0);
                if failed_unpinned {
                    st.free_slot(si, key);
                }
            }
            let status = match st.map.get(&key).copied() {
                Some(si) => {
                    let tick = st.next_tick();
                    let slot = st.slots[si].as_mut().map(|s| {
                        s.pins += 1;
                        s.last_use = tick;
                        s.last_token = token;
                        (s.state.clone(), s.origin, s.used)
                    });
                    match slot {
                        Some((state, origin, used)) => {
                            let prefetched = origin == Origin::Prefetch && !used;
                            let stats = &mut st.stats[li];
                            stats.hits += 1;
                            if prefetched {
                                stats.prefetch_hits += 1;
                            }
                            if state == SlotState::Queued {
                                st.promote(si);
                            }
                            // a promoted read for an idle worker, or a paused speculative read
                            // that is now demanded: it goes on at once
                            wake |= matches!(state, SlotState::Queued | SlotState::Reading);
                            Item::Slot(si)
                        }
                        None => Item::Pending,
                    }
                }
                None => Item::Pending,
            };
            d.items.push((e, status));
        }
        wake |= d.fill_pending(st);
        (d, wake)
    }

    /// Reserve slots and queue demand reads for the pending experts, in order, while slots can
    /// be had. True when a read was queued.
    pub fn fill_pending(&mut self, st: &mut State) -> bool {
        let mut queued = false;
        for i in 0..self.items.len() {
            if self.items[i].1 != Item::Pending {
                continue;
            }
            let key = (self.li, self.items[i].0);
            // another request (or a prefetch) may have loaded it meanwhile
            if let Some(&si) = st.map.get(&key) {
                if let Some(s) = st.slots[si].as_mut() {
                    s.pins += 1;
                }
                self.items[i].1 = Item::Slot(si);
                continue;
            }
            let Some(si) = st.reserve(key, Origin::Demand, None) else {
                break;
            };
            if let Some(s) = st.slots[si].as_mut() {
                s.pins = 1;
            }
            st.stats[self.li].misses += 1;
            st.demand_q.push_back(si);
            self.items[i].1 = Item::Slot(si);
            queued = true;
        }
        queued
    }

    pub fn finished(&self) -> bool {
        self.done == self.items.len()
    }

    /// The first expert whose read has landed (pinned, counted as used), or its read's error
    /// (the slot forgotten, so a later request reads it again); None while every remaining one
    /// is still being read.
    pub fn take_ready(&mut self, st: &mut State) -> Option<Result<ExpertBuf, ReadError>> {
        let blob = st.read_bytes(self.li);
        for i in 0..self.items.len() {
            let (e, item) = self.items[i];
            let Item::Slot(si) = item else { continue };
            let Some(slot) = st.slots[si].as_mut() else { continue };
            match &slot.state {
                SlotState::Ready => {
                    let Some(buf) = slot.buf.clone() else {
                        let msg = format!("expert {e} of MoE layer {}: a ready slot has no buffer", self.li);
                        return Some(Err(PackageError::ExpertRead(msg)));
                    };
                    let first_use = !slot.used;
                    slot.used = true;
                    let was_prefetch = slot.origin == Origin::Prefetch && first_use;
                    slot.predicted = None;
                    let flow = slot.flow_use.take();
                    if was_prefetch {
                        st.stats[self.li].prefetch_useful_bytes += blob;
                    }
                    self.items[i].1 = Item::Done;
                    self.done += 1;
                    return Some(Ok(ExpertBuf { expert: e, slot: si, buf, flow }));
                }
                SlotState::Failed(_) => {
                    let key = slot.key;
                    let err = match std::mem::replace(&mut slot.state, SlotState::Queued) {
                        SlotState::Failed(m) => m,
                        _ => String::new(),
                    };
                    slot.pins = slot.pins.saturating_sub(1);
                    self.items[i].1 = Item::Done;
                    self.done += 1;
                    st.free_slot(si, key);
                    return Some(Err(PackageError::ExpertRead(err)));
                }
                _ => {}
            }
        }
        None
    }

    /// Unpin every slot still held and not handed out; a failed read nobody waits for any more
    /// is forgotten, so it is tried again.
    pub fn unpin_rest(&self, st: &mut State) {
        for (_, item) in &self.items {
            if let Item::Slot(si) = *item {
                let failed = match st.slots[si].as_mut() {
                    Some(s) => {
                        s.pins = s.pins.saturating_sub(1);
                        (matches!(s.state, SlotState::Failed(_)) && s.pins == 0).then_some(s.key)
                    }
                    None => None,
                };
                if let Some(key) = failed {
                    st.free_slot(si, key);
                }
            }
        }
    }
}

/// Give a handed-out expert back (unpin it).
pub(super) fn unpin(st: &mut State, b: &ExpertBuf) {
    if let Some(s) = st.slots[b.slot].as_mut() {
        s.pins = s.pins.saturating_sub(1);
    }
}

/// One layer's demand: hands out its experts as they become ready.
pub struct Request {
    pub(super) shared: Arc<Shared>,
    pub(super) demand: Demand,
}

impl Request {
    /// The next ready expert (any order), waiting for reads as needed; None when all were
    /// handed out. A failed read is an error naming the expert; the request's other pins are
    /// released when it is dropped.
    pub fn next_ready(&mut self) -> Result<Option<ExpertBuf>, ReadError> {
        if self.demand.finished() {
            return Ok(None);
        }
        let sh = self.shared.clone();
        let mut st = sh.lock();
        let mut waited: Option<(Instant, trace::Span)> = None;
        loop {
            if self.demand.fill_pending(&mut st) {
                sh.work.notify_all();
            }
            if let Some(got) = self.demand.take_ready(&mut st) {
                match (&got, waited.take()) {
                    (Ok(_), Some((t0, span))) => {
                        let s = &mut st.stats[self.demand.li];
                        s.stalls += 1;
                        s.stall_ns += t0.elapsed().as_nanos() as u64;
                        st.window.stalled();
                        drop(span);
                    }
                    // a failed read's slot was freed: a waiting request may take it
                    (Err(_), _) => sh.ready.notify_all(),
                    _ => {}
                }
                if self.demand.finished() {
                    st.window.layer_ready(Instant::now());
                }
                return got.map(Some);
            }
            if waited.is_none() {
                waited = Some((Instant::now(), trace::span("wait_read").arg("layer", self.demand.li)));
            }
            st = sh.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Every expert ready now, waiting for reads only when none is (empty when all were handed
    /// out): what a layer can compute together. Errors as [`next_ready`](Self::next_ready).
    pub fn ready_batch(&mut self) -> Result<Vec<ExpertBuf>, ReadError> {
        let Some(first) = self.next_ready()? else { return Ok(Vec::new()) };
        let mut batch = vec![first];
        let sh = self.shared.clone();
        let mut st = sh.lock();
        if self.demand.fill_pending(&mut st) {
            sh.work.notify_all();
        }
        while !self.demand.finished() {
            match self.demand.take_ready(&mut st) {
                Some(Ok(b)) => batch.push(b),
                Some(Err(e)) => {
                    sh.ready.notify_all();
                    drop(st);
                    for b in batch {
                        self.release(b);
                    }
                    return Err(e);
                }
                None => break,
            }
        }
        if self.demand.finished() {
            st.window.layer_ready(Instant::now());
        }
        Ok(batch)
    }

    /// Give an expert back (unpin it).
    pub fn release(&mut self, b: ExpertBuf) {
        let mut st = self.shared.lock();
        unpin(&mut st, &b);
        drop(b);
        self.shared.ready.notify_all();
    }
}

impl Drop for Request {
    /// Unpin what the layer did not take. A request that ends early (a read failed, or the
    /// pass was cancelled) first waits, a few seconds at most, for its reads still in flight:
    /// one that read a damaged blob must not hand its error to the next request, which would
    /// otherwise find the read under way and wait on it (the file may have been repaired since).
    fn drop(&mut self) {
        let sh = self.shared.clone();
        let mut st = sh.lock();
        let keys: Vec<(usize, Key)> = self
            .demand
            .items
            .iter()
            .filter_map(|(_, item)| match *item {
                Item::Slot(si) => st.slots[si].as_ref().map(|s| (si, s.key)),
                _ => None,
            })
            .collect();
        self.demand.unpin_rest(&mut st);
        sh.ready.notify_all();
        let in_flight = |st: &State| {
            keys.iter().any(|&(si, key)| {
                st.slots[si]
                    .as_ref()
                    .is_some_and(|s| s.key == key && matches!(s.state, SlotState::Queued | SlotState::Reading))
            })
        };
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while in_flight(&st) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = match sh.ready.wait_timeout(st, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::slots::tests::{load, read, state};
    use super::*;
    use crate::experts::policy::PolicyKind;

    #[test]
    fn hits_are_handed_out_at_once_and_misses_after_their_reads() {
        let mut st = state(4, PolicyKind::Lru);
        load(&mut st, (0, 2));
        let (mut d, wake) = Demand::open(&mut st, 0, &[1, 2, 3]);
        assert!(wake, "two misses queued");
        assert_eq!((st.stats[0].hits, st.stats[0].misses), (1, 2));
        let hit = d.take_ready(&mut st).unwrap().unwrap();
        assert_eq!(hit.expert, 2);
        assert!(d.take_ready(&mut st).is_none(), "the misses are still queued");
        // the I/O worker reads the second miss first: hand-out follows readiness, not order
        let (m1, m3) = (st.map[&(0, 1)], st.map[&(0, 3)]);
        assert_eq!(st.demand_q, [m1, m3]);
        read(&mut st, m3, true);
        assert_eq!(d.take_ready(&mut st).unwrap().unwrap().expert, 3);
        read(&mut st, m1, true);
        assert_eq!(d.take_ready(&mut st).unwrap().unwrap().expert, 1);
        assert!(d.finished());
    }

    #[test]
    fn handed_out_experts_stay_pinned_until_given_back() {
        let mut st = state(2, PolicyKind::Lru);
        load(&mut st, (0, 0));
        load(&mut st, (0, 1));
        let (mut d, _) = Demand::open(&mut st, 0, &[0, 1]);
        let a = d.take_ready(&mut st).unwrap().unwrap();
        let b = d.take_ready(&mut st).unwrap().unwrap();
        assert_eq!(st.reserve((1, 0), Origin::Demand, None), None, "both are pinned");
        unpin(&mut st, &a);
        assert!(st.reserve((1, 0), Origin::Demand, None).is_some(), "the given-back one can go");
        assert!(st.map.contains_key(&(0, 1)), "the held one stays");
        unpin(&mut st, &b);
    }

    #[test]
    fn a_pool_smaller_than_the_route_hands_out_in_turns() {
        // two slots, three experts: the third waits for a slot a given-back expert frees
        let mut st = state(2, PolicyKind::Lru);
        let (mut d, _) = Demand::open(&mut st, 1, &[0, 1, 2]);
        assert_eq!(st.demand_q.len(), 2);
        assert_eq!(d.items[2].1, Item::Pending);
        for si in st.demand_q.clone() {
            read(&mut st, si, true);
        }
        let a = d.take_ready(&mut st).unwrap().unwrap();
        let b = d.take_ready(&mut st).unwrap().unwrap();
        assert!(!d.fill_pending(&mut st), "no slot while both are held");
        unpin(&mut st, &a);
        assert!(d.fill_pending(&mut st), "a given-back slot goes to the pending expert");
        let si = st.map[&(1, 2)];
        read(&mut st, si, true);
        assert_eq!(d.take_ready(&mut st).unwrap().unwrap().expert, 2);
        unpin(&mut st, &b);
    }

    #[test]
    fn a_failed_read_is_an_error_and_is_read_again_next_time() {
        let mut st = state(2, PolicyKind::Lru);
        let (mut d, _) = Demand::open(&mut st, 0, &[3]);
        let si = st.map[&(0, 3)];
        read(&mut st, si, false);
        assert!(matches!(d.take_ready(&mut st), Some(Err(PackageError::ExpertRead(_)))));
        assert!(!st.map.contains_key(&(0, 3)), "forgotten");
        let (_, wake) = Demand::open(&mut st, 0, &[3]);
        assert!(wake && st.demand_q.len() == 1, "queued again");
    }

    #[test]
    fn a_demand_drops_queued_predictions_its_route_refutes_and_promotes_the_others() {
        let mut st = state(4, PolicyKind::Lru);
        let p = st.reserve((0, 1), Origin::Prefetch, Some(0.9)).unwrap();
        let q = st.reserve((0, 2), Origin::Prefetch, Some(0.8)).unwrap();
        st.prefetch_q.extend([(p, 0.9), (q, 0.8)]);
        let (d, _) = Demand::open(&mut st, 0, &[2]);
        assert!(!st.map.contains_key(&(0, 1)), "refuted prediction dropped unread");
        assert_eq!(st.demand_q, [q], "the wanted one is promoted");
        assert_eq!(st.stats[0].prefetch_hits, 1);
        d.unpin_rest(&mut st);
        assert_eq!(st.slots[q].as_ref().unwrap().pins, 0);
    }
}
