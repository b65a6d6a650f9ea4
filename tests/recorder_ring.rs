//! The recorder's cap: by default the first events are kept and later ones counted as dropped;
//! in ring mode (the workbench) the newest are kept. One test, since the recorder is global.

use moescope::trace::recorder::{self, Arg, Event};

fn recorded_ids(rec: &recorder::Recording) -> Vec<i64> {
    let mut ids: Vec<i64> = rec
        .threads
        .iter()
        .flat_map(|t| t.events.iter())
        .filter_map(|e| match e {
            Event::Slice { name: "step", args, .. } => args.iter().find_map(|(k, v)| match (k, v) {
                (&"i", Arg::I(i)) => Some(*i),
                _ => None,
            }),
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    ids
}

fn record(n: i64) {
    for i in 0..n {
        let _s = recorder::span("step").arg("i", i);
    }
}

#[test]
fn the_cap_keeps_the_oldest_or_in_ring_mode_the_newest() {
    recorder::start(64);
    record(1000);
    let rec = recorder::stop();
    assert_eq!(recorded_ids(&rec), (0..64).collect::<Vec<_>>());
    assert_eq!(rec.dropped, 1000 - 64);
    assert!(!rec.ring);

    recorder::start_ring(64);
    record(1000);
    let rec = recorder::stop();
    let ids = recorded_ids(&rec);
    assert!(rec.ring);
    // a thread drops its oldest eighth at a time: between 7/8 of the cap and the cap are held
    assert!(ids.len() <= 64 && ids.len() >= 56, "{} held", ids.len());
    assert_eq!(*ids.last().unwrap(), 999, "the newest is kept");
    assert_eq!(ids, (1000 - ids.len() as i64..1000).collect::<Vec<_>>(), "a contiguous newest window");
    assert_eq!(rec.dropped + ids.len(), 1000);
}
