//! SSD I/O: read throughput over time against the highest seen, reads per second, the share of
//! time with a read in flight (disk busy), queue depth, read latency, demand vs prefetch bytes, useful vs wasted prefetch, stall per token.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Sparkline};

use crate::tui::app::{App, Pane};
use crate::tui::theme::Theme;

fn mb(n: u64) -> String {
    format!("{:.1} MB", n as f64 / 1e6)
}

/// The pane's text lines (also what the tests read).
pub fn lines(app: &App) -> Vec<String> {
    let st = &app.store;
    let (Some(s), Some(view)) = (&st.step, &st.pool) else {
        return vec![match &app.knobs {
            Some(k) if !k.streaming => "experts are mapped (--no-stream): no reads of our own".into(),
            _ => "no reads yet".into(),
        }];
    };
    let t = &s.totals.stats;
    let recent = st.recent_summary();
    let io = &st.io;
    let now = io.mbps.back().copied().unwrap_or(0);
    let q = view.snapshot.queue;
    let lat = &view.snapshot.read_latency;
    let mut v = vec![
        format!(
            "read {now} MB/s (peak {} MB/s) · {:.0} reads/s · disk busy {:.0}%",
            io.max_mbps, io.reads_per_s, io.busy_pct
        ),
        format!("queue: {} demand, {} prefetch, {} in flight", q.demand, q.prefetch, q.in_flight),
        if lat.count > 0 {
            format!("latency p50 {:.2} ms · p99 {:.2} ms · {} reads", lat.p50_ms, lat.p99_ms, lat.count)
        } else {
            "latency: no reads yet".into()
        },
        format!("read: demand {} · prefetch {}", mb(t.bytes_demand), mb(t.bytes_prefetch)),
    ];
    let (u_all, w_all) = (t.prefetch_useful_bytes, t.prefetch_wasted_bytes);
    let pct = if u_all + w_all > 0 {
        format!(" ({:.0}% useful)", 100.0 * u_all as f64 / (u_all + w_all) as f64)
    } else {
        String::new()
    };
    v.push(format!("prefetch useful {} · wasted {}{pct}", mb(u_all), mb(w_all)));
    if !st.recent.is_empty() {
        v.push(format!(
            "stall {:.1} ms/token · last {} tok: prefetch useful {} wasted {}",
            recent.stall_ms,
            st.recent.len(),
            mb(recent.prefetch_useful),
            mb(recent.prefetch_wasted)
        ));
    }
    v
}

pub fn draw(f: &mut Frame, area: Rect, app: &App, th: &Theme, focused: bool) {
    let io = app.knobs.as_ref().map_or(String::new(), |_| app.info.as_ref().map_or(String::new(), |i| i.io.clone()));
    let block = super::frame(Pane::Io, io, focused, th);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let text: Vec<Line> = lines(app).into_iter().map(Line::from).collect();
    let text_h = (text.len() as u16).min(inner.height);
    let spark_h = inner.height - text_h;
    if spark_h > 0 {
        // newest on the right; the scale's top is the highest rate seen
        let w = inner.width as usize;
        let data: Vec<u64> = app.store.io.mbps.iter().rev().take(w).rev().copied().collect();
        let sp = Sparkline::default().data(&data).max(app.store.io.max_mbps.max(1)).style(th.spark());
        f.render_widget(sp, Rect { height: spark_h, ..inner });
    }
    f.render_widget(Paragraph::new(text), Rect { y: inner.y + spark_h, height: text_h, ..inner });
}
