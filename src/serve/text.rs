//! Stop strings over streamed text: a stop string is never sent, and text that may still grow
//! into one is held back until the next piece decides it (OpenAI's `stop`, llama-server's
//! behaviour). Partial UTF-8 is held back earlier, by the tokenizer's `StreamDecoder`.

/// Text released so far and what is held back.
#[derive(Debug, Default)]
pub struct StopText {
    stops: Vec<String>,
    held: String,
}

/// What one piece of text gave.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    /// Text that can be sent now.
    pub text: String,
    /// A stop string was found: `text` ends just before it, and nothing follows.
    pub stopped: bool,
}

impl StopText {
    /// `stops` must not be empty strings (the request's validation refuses them).
    pub fn new(stops: Vec<String>) -> StopText {
        StopText { stops, held: String::new() }
    }

    /// Add `piece`; returns the text that no stop string can claim any more.
    pub fn push(&mut self, piece: &str) -> Released {
        self.held.push_str(piece);
        // the earliest stop string wins (as text reads)
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let text = self.held[..at].to_string();
            self.held.clear();
            return Released { text, stopped: true };
        }
        let stops: Vec<&str> = self.stops.iter().map(String::as_str).collect();
        let keep = held_back(&self.held, &stops);
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Released { text, stopped: false }
    }

    /// At the end of generation: what was held back (it never became a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Bytes at the end of `s` that may still grow into one of `pats`: the longest suffix, on a
/// character boundary, that is the start of one of them (a whole one is found before this is
/// asked). The stop strings, the tool-call and the thinking tags all hold text back by it.
pub fn held_back(s: &str, pats: &[&str]) -> usize {
    let longest = pats.iter().map(|p| p.len()).max().unwrap_or(0);
    let from = s.len().saturating_sub(longest.saturating_sub(1));
    (from..s.len())
        .filter(|&i| s.is_char_boundary(i))
        .find(|&i| pats.iter().any(|p| p.starts_with(&s[i..])))
        .map_or(0, |i| s.len() - i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: the text before the earliest stop string in the whole text.
    fn oracle(text: &str, stops: &[&str]) -> (String, bool) {
        match stops.iter().filter_map(|s| text.find(s)).min() {
            Some(i) => (text[..i].to_string(), true),
            None => (text.to_string(), false),
        }
    }

    fn run(pieces: &[&str], stops: &[&str]) -> (String, bool, Vec<String>) {
        let mut st = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let (mut out, mut sent) = (String::new(), Vec::new());
        for p in pieces {
            let r = st.push(p);
            out.push_str(&r.text);
            sent.push(r.text);
            if r.stopped {
                return (out, true, sent);
            }
        }
        out.push_str(&st.finish());
        (out, false, sent)
    }

    #[test]
    fn matches_the_oracle_on_every_split() {
        let texts = ["hello world. The end", "ab</s>cd", "aaab", "no stop here", "éé<é>é", "x\n\nUser:"];
        let stops: &[&[&str]] = &[&["</s>"], &["aab", "b"], &["\n\nUser:"], &["<é>", "é<"], &["end", "."]];
        for t in texts {
            let chars: Vec<(usize, char)> = t.char_indices().collect();
            for s in stops {
                // every way to cut the text in two or three pieces at character boundaries
                for i in 0..=chars.len() {
                    for j in i..=chars.len() {
                        let at = |k: usize| chars.get(k).map_or(t.len(), |c| c.0);
                        let pieces = [&t[..at(i)], &t[at(i)..at(j)], &t[at(j)..]];
                        let (out, stopped, _) = run(&pieces, s);
                        assert_eq!((out, stopped), oracle(t, s), "{t:?} {s:?} {pieces:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn holds_back_only_what_may_become_a_stop() {
        let (_, _, sent) = run(&["Hello <", "/s", "x"], &["</s>"]);
        assert_eq!(sent, ["Hello ", "", "</sx"]);
        let (_, _, sent) = run(&["Hello"], &["</s>"]);
        assert_eq!(sent, ["Hello"]);
    }
}
