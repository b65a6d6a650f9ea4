//! The engine thread's loop: up to `parallel` requests at once, each in a slot of its own (its
//! KV cache and state), one forward pass a step over all of them (continuous batching, as
//! llama-server's `-np`). A request joins at the next step; its prompt goes in chunks of
//! [`PREFILL_CHUNK`] tokens beside the others' decode tokens, cut where it would be cut alone,
//! so each reply is the bits it gets alone (tests/batch.rs, tests/serve_batch.rs).
//!
//! ```text
//! queue -> admit: the free slot whose cache holds the longest prefix of the prompt, or the prefix
//!          cache's entry if longer (copied into the least recently used free slot; what a slot
//!          held is saved there before it is overwritten)
//!       -> step:  [decode token of each replying slot | next prompt chunk of prompting slots]
//!                 -> Engine::step -> sample, reply, stop rules -> Done / Error
//! ```

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};

use super::expert_reads::ExpertReads;
use super::metrics::Metrics;
use super::worker::{Event, Finish, Job, Reply, Usage};
use super::{Server, StepReport, Watch};
use crate::engine::batch::Step;
use crate::engine::prefix_cache::PrefixCache;
use crate::engine::sampler::Sampler;
use crate::engine::tokenizer::Tok;
use crate::engine::{Engine, GenStats, PREFILL_CHUNK, Reuse, Slot, Stop};
use crate::model::Tee;
use crate::trace;

/// How many requests run at once, and the prefix cache's budget.
#[derive(Debug, Clone, Copy)]
pub struct SlotOptions {
    pub parallel: usize,
    pub cache_ram: u64,
}

/// Slots whose content is worth saving before it is overwritten: this many tokens the next
/// request would not keep.
const SAVE_MIN: usize = 64;

/// A request in a slot.
struct Active<'t> {
    job: Job,
    slot: usize,
    /// Prompt tokens in the slot's cache so far.
    done: usize,
    sampler: Sampler,
    reply: Reply<'t>,
    /// The prompt and the reply so far (what the sampler's penalties read).
    history: Vec<u32>,
    /// The latest sampled token, to be fed next.
    next: Option<u32>,
    stats: GenStats,
    max_tokens: usize,
    t0: Instant,
    start_ticks: u64,
    queued_ms: f64,
}

/// What the loop keeps between steps.
struct Slots {
    slots: Vec<Slot>,
    /// When each slot was last given a request (the least recent is overwritten first).
    used: Vec<u64>,
    clock: u64,
    cache: PrefixCache,
    /// The steps' routed-expert reads, and the pool's counters at the last step (for the
    /// trace's counter tracks).
    reads: ExpertReads,
    pool: Option<crate::experts::stats::LayerStats>,
}

/// Serve until the server stops or the queue closes.
pub fn serve(s: &Server, engine: &mut Engine, rx: &Receiver<Job>, watch: &mut dyn Watch, opts: SlotOptions) {
    let Some(tok) = engine.tokenizer().cloned() else { return };
    let parallel = opts.parallel.max(1);
    engine.fit_slots(parallel);
    let mut st = Slots {
        slots: (0..parallel).map(|_| engine.new_slot()).collect(),
        used: vec![0; parallel],
        clock: 0,
        cache: PrefixCache::new(opts.cache_ram),
        reads: ExpertReads::new(engine.config().num_experts),
        pool: engine.expert_counters(),
    };
    s.metrics.kv_capacity.store((parallel * engine.ctx_size()) as u64, Relaxed);
    let mut active: Vec<Active<'_>> = Vec::new();
    loop {
        let stopping = s.stopping.load(Relaxed);
        if stopping {
            // the running requests end here: their event channels close with them
            for a in active.drain(..) {
                Metrics::add(&s.metrics.cancelled, 1);
                end_slice(&a, "cancelled", true);
                watch.finished(&a.job.id, a.slot, "cancelled", Some(&a.stats), rx.len());
            }
            return;
        }
        // new requests into free slots: waiting for one when nothing runs
        while active.len() < parallel {
            let job = if active.is_empty() {
                watch.between(engine);
                engine.resize_auto_pool();
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(j) => j,
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            };
            s.metrics.queued.store(rx.len() as u64, Relaxed);
            if let Some(a) = admit(job, &tok, engine, &mut st, &active, s, watch, rx.len()) {
                active.push(a);
            }
        }
        s.metrics.processing.store(active.len() as u64, Relaxed);
        if active.is_empty() {
            continue;
        }
        step(s, engine, &mut st, &mut active, watch, rx.len());
    }
}

/// Put `job` in a slot, its cached prefix reused, and tell its client it started (None when
/// the client has gone already).
#[allow(clippy::too_many_arguments)]
fn admit<'t>(
    job: Job,
    tok: &'t Tok,
    engine: &Engine,
    st: &mut Slots,
    active: &[Active<'_>],
    s: &Server,
    watch: &mut dyn Watch,
    waiting: usize,
) -> Option<Active<'t>> {
    let start_ticks = trace::recorder::now_ticks();
    let t0 = Instant::now();
    let queued_ms = job.queued_at.elapsed().as_secs_f64() * 1000.0;
    let prompt = &job.prompt;
    let cfg = engine.config();
    // the free slot that keeps most of the prompt (ties: the least recently used)
    let free: Vec<usize> = (0..st.slots.len()).filter(|i| active.iter().all(|a| a.slot != *i)).collect();
    let best = free.iter().copied().max_by_key(|&i| (st.slots[i].reusable(prompt), std::cmp::Reverse(st.used[i])))?;
    let lru = free.iter().copied().min_by_key(|&i| st.used[i]).unwrap_or(best);
    let keep = st.slots[best].reusable(prompt);
    let (slot, from_cache) = match st.cache.best(prompt) {
        Some((e, n)) if n > keep => {
            let slot = &mut st.slots[lru];
            if slot.cached().len() >= SAVE_MIN {
                st.cache.put(cfg, slot);
            }
            (lru, st.cache.take(e, n, slot))
        }
        _ => {
            let slot = &st.slots[best];
            if slot.cached().len() >= keep + SAVE_MIN {
                st.cache.put(cfg, slot);
            }
            (best, false)
        }
    };
    st.clock += 1;
    st.used[slot] = st.clock;
    let (cached, mut reuse) = st.slots[slot].reuse(prompt);
    if from_cache && cached > 0 {
        reuse = Reuse::PrefixCache;
    }
    watch.started(&job.id, slot, prompt.len(), cached, waiting);
    if job.events.send(Event::Started { prompt_tokens: prompt.len(), cached_tokens: cached }).is_err() {
        Metrics::add(&s.metrics.cancelled, 1);
        watch.finished(&job.id, slot, "cancelled", None, waiting);
        return None;
    }
    Metrics::add(&s.metrics.cached_tokens, cached as u64);
    if job.params.return_progress {
        // the start, as llama-server sends it: what the cache already held
        let (total, cache) = (prompt.len(), cached);
        let _ = job.events.send(Event::Progress { total, cache, processed: cached, time_ms: 0 });
    }
    let left = engine.ctx_size().saturating_sub(prompt.len());
    let sampler = Sampler::new(job.params.sampler).with_adjustments(job.params.adjust.clone());
    let reply = Reply::new(tok, &job, engine.eos_ids().to_vec(), engine.kept_specials());
    Some(Active {
        slot,
        done: cached,
        sampler,
        reply,
        history: prompt.clone(),
        next: None,
        stats: GenStats::new(prompt.len() - cached, cached, reuse, 0.0),
        max_tokens: job.params.max_tokens.unwrap_or(left).min(left),
        t0,
        start_ticks,
        queued_ms,
        job,
    })
}

/// What one request puts in a step.
#[derive(Clone)]
enum Part {
    /// Its next prompt chunk (the last one: its logits wanted).
    Prompt {
        from: usize,
        to: usize,
        last: bool,
    },
    Decode(u32),
}

/// One forward pass over every running request that has room in it, then each one's token.
fn step(
    s: &Server,
    engine: &mut Engine,
    st: &mut Slots,
    active: &mut Vec<Active<'_>>,
    watch: &mut dyn Watch,
    waiting: usize,
) {
    // the replies' decode tokens first, then prompt chunks while they fit, in arrival order
    let budget = engine.step_rows();
    let mut rows = 0;
    let mut plan: Vec<Option<Part>> = vec![None; active.len()];
    for (i, a) in active.iter().enumerate() {
        if let Some(id) = a.next {
            plan[i] = Some(Part::Decode(id));
            rows += 1;
        }
    }
    for (i, a) in active.iter().enumerate() {
        if a.next.is_none() {
            // the chunks a prompt is cut into alone: PREFILL_CHUNK tokens from its cached prefix
            let to = (a.done + PREFILL_CHUNK).min(a.job.prompt.len());
            if rows + to - a.done <= budget {
                plan[i] = Some(Part::Prompt { from: a.done, to, last: to == a.job.prompt.len() });
                rows += to - a.done;
            }
        }
    }
    let t = Instant::now();
    let n_seqs = plan.iter().flatten().count();
    let _span = trace::span("step").arg("sequences", n_seqs).arg("tokens", rows);
    // each planned request's slot, in the plan's order
    let mut order: Vec<(usize, usize)> =
        plan.iter().enumerate().filter(|(_, p)| p.is_some()).map(|(i, _)| (i, active[i].slot)).collect();
    order.sort_by_key(|&(_, slot)| slot);
    let decode_ids: Vec<[u32; 1]> = order
        .iter()
        .map(|&(i, _)| match plan[i] {
            Some(Part::Decode(id)) => [id],
            _ => [0],
        })
        .collect();
    let result = {
        let mut steps: Vec<Step<'_>> = Vec::with_capacity(order.len());
        let mut slots = st.slots.iter_mut().enumerate();
        for (k, &(i, slot_i)) in order.iter().enumerate() {
            let Some((_, slot)) = slots.by_ref().find(|(j, _)| *j == slot_i) else { continue };
            let (tokens, logits): (&[u32], bool) = match &plan[i] {
                Some(Part::Prompt { from, to, last }) => (&active[i].job.prompt[*from..*to], *last),
                _ => (&decode_ids[k], true),
            };
            steps.push(Step { slot, tokens, logits });
        }
        // the logits stay in the engine (read below through a shared borrow, not copied)
        engine.step(&mut steps, &mut Tee(watch.passes(), &mut st.reads)).map(|_| ())
    };
    let step_ms = t.elapsed().as_secs_f64() * 1000.0;
    step_metrics(s, engine, st, (n_seqs, rows, step_ms));
    watch.step(&StepReport {
        sequences: n_seqs,
        tokens: rows,
        experts_read: st.reads.distinct,
        expert_choices: st.reads.choices,
        step_ms,
        prefix_hits: st.cache.hits,
        prefix_tokens: st.cache.hit_tokens,
    });
    let logits = match result {
        Ok(()) => engine.step_logits(),
        Err(e) => {
            // every request of the pass fails; their slots' caches are in an unknown state
            let message = e.to_string();
            let mut i = 0;
            active.retain_mut(|a| {
                let planned = plan[i].is_some();
                i += 1;
                if planned {
                    st.slots[a.slot].clear();
                    Metrics::add(&s.metrics.errors, 1);
                    let _ = a.job.events.send(Event::Error { message: message.clone() });
                    end_slice(a, &message, false);
                    watch.finished(&a.job.id, a.slot, &message, None, waiting);
                }
                !planned
            });
            return;
        }
    };
    let vocab = engine.config().vocab_size;
    let eos = engine.eos_ids().to_vec();
    // the logits rows in slot order, one per planned request that wanted them
    let mut rows_of = vec![None; active.len()];
    let mut r = 0;
    for &(i, _) in &order {
        let wants = !matches!(plan[i], Some(Part::Prompt { last: false, .. }));
        if wants {
            rows_of[i] = Some(r);
            r += 1;
        }
    }
    let mut done = vec![false; active.len()];
    for (i, a) in active.iter_mut().enumerate() {
        let Some(part) = &plan[i] else { continue };
        if let Part::Prompt { to, .. } = part {
            Metrics::add(&s.metrics.prompt_tokens, (to - a.done) as u64);
            a.done = *to;
            if a.job.params.return_progress {
                let (total, cache, time_ms) = (a.job.prompt.len(), a.stats.prompt_cached, a.t0.elapsed().as_millis());
                let _ = a.job.events.send(Event::Progress { total, cache, processed: a.done, time_ms: time_ms as u64 });
            }
            // where a later prompt that shares this much resumes (a hybrid's state)
            st.slots[a.slot].checkpoint();
        }
        let Some(row) = rows_of[i] else { continue };
        let l = &logits[row * vocab..(row + 1) * vocab];
        let id = a.sampler.sample(l, &a.history);
        if a.stats.generated.is_empty() {
            a.stats.prefill_ms = a.t0.elapsed().as_secs_f64() * 1000.0;
            a.stats.ttft_ms = a.stats.prefill_ms;
        } else {
            a.stats.decode_steps += 1;
            a.stats.passes += 1;
            a.stats.decode_ms += step_ms;
            a.stats.token_ms.push(step_ms);
        }
        a.stats.generated.push(id);
        a.history.push(id);
        Metrics::add(&s.metrics.predicted_tokens, 1);
        watch.token(a.slot, id);
        let go_on = a.reply.token(id, l);
        let cancelled = a.job.cancel.load(Relaxed);
        let stop = if !a.job.params.ignore_eos && eos.contains(&id) {
            Some(Stop::Eos)
        } else if a.stats.generated.len() >= a.max_tokens {
            Some(Stop::Length)
        } else if !go_on || cancelled {
            Some(Stop::Cancelled)
        } else if st.slots[a.slot].cached().len() + 1 > st.slots[a.slot].capacity() {
            Some(Stop::ContextFull)
        } else {
            None
        };
        match stop {
            Some(stop) => {
                a.stats.stop = stop;
                done[i] = true;
            }
            None => a.next = Some(id),
        }
    }
    // prompts still in their chunks: a client gone stops them between chunks
    for (i, a) in active.iter_mut().enumerate() {
        if a.stats.generated.is_empty() && a.job.cancel.load(Relaxed) {
            a.stats.stop = Stop::Cancelled;
            done[i] = true;
        }
    }
    let mut i = 0;
    active.retain_mut(|a| {
        let d = done[i];
        i += 1;
        if d {
            finish(s, a, watch, waiting);
        }
        !d
    });
}

/// After a step of `n_seqs` sequences and `rows` tokens: the metrics' slots, KV, expert reads
/// and prefix cache, and (when tracing) the step's counter tracks: the experts it read, the
/// sequences each read served, and the weights' bytes a token (experts, and all).
fn step_metrics(s: &Server, engine: &Engine, st: &mut Slots, (n_seqs, rows, step_ms): (usize, usize, f64)) {
    let m = &s.metrics;
    Metrics::add(&m.decodes, 1);
    Metrics::add(&m.busy_slots, n_seqs as u64);
    Metrics::add(&m.expert_reads, st.reads.distinct);
    Metrics::add(&m.expert_choices, st.reads.choices);
    m.kv_tokens.store(st.slots.iter().map(|s| s.cached().len() as u64).sum(), Relaxed);
    m.prefix_hits.store(st.cache.hits, Relaxed);
    m.prefix_hit_tokens.store(st.cache.hit_tokens, Relaxed);
    m.prefix_bytes.store(st.cache.bytes(), Relaxed);
    if trace::enabled() && st.reads.distinct > 0 {
        let (d, c) = (st.reads.distinct as f64, st.reads.choices as f64);
        // the weights a pass reads: the dense ones once (one token's count less its experts'),
        // and each distinct expert once
        let blob = engine.package().sizes().blob as f64;
        let moe_layers = engine.package().meta.experts.as_ref().map_or(0, |e| e.layers.len()) as f64;
        let dense = engine.model().decode_weight_bytes() as f64
            - moe_layers * engine.config().num_experts_per_tok as f64 * blob;
        let per_token = |b: f64| b / 1e6 / rows.max(1) as f64;
        trace::counter("experts read", &[("per_step", d), ("sequences_per_read", c / d)]);
        trace::counter(
            "weight MB per token",
            &[("experts", per_token(d * blob)), ("all", per_token(dense.max(0.0) + d * blob))],
        );
    }
    engine.trace_step_counters("step", rows, step_ms, &mut st.pool);
}

/// A request's end: its last text, `Done`, the metrics and the trace's slice.
fn finish(s: &Server, a: &mut Active<'_>, watch: &mut dyn Watch, waiting: usize) {
    let m = &s.metrics;
    Metrics::add(&m.prompt_us, (a.stats.prefill_ms * 1e3) as u64);
    Metrics::add(&m.predicted_us, (a.stats.decode_ms * 1e3) as u64);
    let held = (a.job.prompt.len() + a.stats.generated.len()) as u64;
    m.tokens_max.fetch_max(held, Relaxed);
    // a stop string ends a reply as its client asked; anything else that stopped it early is
    // the client going away
    if a.stats.stop == Stop::Cancelled && !a.reply.stopped {
        Metrics::add(&m.cancelled, 1);
        end_slice(a, "cancelled", true);
        watch.finished(&a.job.id, a.slot, "cancelled", Some(&a.stats), waiting);
        return;
    }
    let finish = if a.reply.stopped || a.stats.stop == Stop::Eos { Finish::Stop } else { Finish::Length };
    a.reply.finish();
    let stats = &a.stats;
    let usage = Usage {
        prompt_tokens: a.job.prompt.len(),
        completion_tokens: stats.generated.len(),
        cached_tokens: stats.prompt_cached,
        prompt_ms: stats.prefill_ms,
        predicted_ms: stats.decode_ms,
        decode_steps: stats.decode_steps,
    };
    let _ = a.job.events.send(Event::Done { finish, usage });
    end_slice(a, finish.name(), true);
    watch.finished(&a.job.id, a.slot, finish.name(), Some(&a.stats), waiting);
}

/// The request's slice on the trace's `requests` track, from its admission to now.
fn end_slice(a: &Active<'_>, outcome: &str, with_stats: bool) {
    trace::recorder::track_slice("requests", "request", a.start_ticks, {
        let mut args: trace::recorder::Args = vec![
            ("id", a.job.id.as_str().into()),
            ("slot", a.slot.into()),
            ("prompt_tokens", a.job.prompt.len().into()),
            ("cached_tokens", a.stats.prompt_cached.into()),
            ("queued_ms", a.queued_ms.into()),
            ("outcome", outcome.into()),
        ];
        if with_stats {
            args.push(("completion_tokens", a.stats.generated.len().into()));
            args.push(("decode_tok_s", a.stats.decode_tps().into()));
        }
        args
    });
}
