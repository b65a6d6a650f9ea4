//! Where speculative decoding's drafts come from, and how many to take: `--spec` and
//! `--draft`. A draft is a guess at the next few tokens; the engine verifies them in one forward
//! pass over the latest token and the drafts ([`super::speculate`]), so a wrong guess costs
//! compute and expert reads, never a different output.

/// `--spec`: where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecMode {
    /// No speculation: one forward pass per token.
    #[default]
    Off,
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's
    /// last few tokens ([`PromptLookup`]).
    Ngram,
}

impl SpecMode {
    /// `off` or `ngram` (`mtp` is named: the models' own heads are not run yet).
    pub fn parse(s: &str) -> Result<SpecMode, String> {
        match s {
            "off" => Ok(SpecMode::Off),
            "ngram" => Ok(SpecMode::Ngram),
            "mtp" => {
                Err("--spec mtp: the models' multi-token-prediction heads are not run yet; use ngram or off".into())
            }
            _ => Err(format!("--spec must be off or ngram, got '{s}'")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SpecMode::Off => "off",
            SpecMode::Ngram => "ngram",
        }
    }
}

/// What `--spec` and `--draft` ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    pub mode: SpecMode,
    /// The most drafts one verify pass takes.
    pub draft: usize,
}

/// `--draft`'s default, as llama.cpp's and the issue's: three drafts a pass.
pub const DEFAULT_DRAFT: usize = 3;

/// The most drafts a pass may take: each is a row of the verify pass (its experts' union and its
/// attention), and beyond a handful the chance that all before it were right is small.
pub const MAX_DRAFT: usize = 16;

impl Default for Speculation {
    fn default() -> Self {
        Speculation { mode: SpecMode::Off, draft: DEFAULT_DRAFT }
    }
}

impl Speculation {
    pub fn new(mode: SpecMode, draft: usize) -> Result<Speculation, String> {
        if !(1..=MAX_DRAFT).contains(&draft) {
            return Err(format!("--draft must be 1 to {MAX_DRAFT}, got {draft}"));
        }
        Ok(Speculation { mode, draft })
    }

    /// The draft source the mode names (None: off).
    pub fn drafter(&self) -> Option<Box<dyn Drafter + Send>> {
        match self.mode {
            SpecMode::Off => None,
            SpecMode::Ngram => Some(Box::new(PromptLookup::default())),
        }
    }
}

/// A source of drafts: up to `max` tokens guessed to follow `history` (the prompt and the reply
/// so far), into `out` (cleared first; empty: no guess, the engine decodes one token).
pub trait Drafter {
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>);
}

/// Prompt lookup decoding (Saxena, 2023; transformers' `prompt_lookup_num_tokens`, llama.cpp's
/// `lookup`): the last `n` tokens, for `n` from `longest` down to `shortest`, searched for
/// backwards in the history; the tokens after the latest earlier match are the drafts (going
/// round the match's period where they run past the end). Pays
/// where the reply copies its context: code edits, quotes, retrieval, repeated structure.
#[derive(Debug, Clone, Copy)]
pub struct PromptLookup {
    pub longest: usize,
    pub shortest: usize,
}

impl Default for PromptLookup {
    /// Matches of 3 down to 2 tokens: a single token matches almost anywhere in a long history,
    /// and drafts from it are mostly wrong (a verify pass spent for nothing).
    fn default() -> Self {
        PromptLookup { longest: 3, shortest: 2 }
    }
}

impl Drafter for PromptLookup {
    fn draft(&mut self, h: &[u32], max: usize, out: &mut Vec<u32>) {
        out.clear();
        if max == 0 {
            return;
        }
        for n in (self.shortest.max(1)..=self.longest).rev() {
            if h.len() <= n {
                continue;
            }
            let tail = &h[h.len() - n..];
            // the latest match that starts before the tail itself: something follows it
            if let Some(i) = (0..h.len() - n).rev().find(|&i| &h[i..i + n] == tail) {
                // what followed the match, read as if the text repeats with the period the
                // match gives (`d`): past the history's end the drafts go round again, so a
                // loop close behind (a repeated line, a run of one token) still fills them
                let d = h.len() - n - i;
                out.extend((0..max).map(|j| h[h.len() - d + j % d]));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafts(h: &[u32], max: usize) -> Vec<u32> {
        let mut out = vec![99];
        PromptLookup::default().draft(h, max, &mut out);
        out
    }

    #[test]
    fn the_latest_longest_match_gives_what_followed_it() {
        // "1 2 3" occurs at 0 and 5; the tail is "2 3": the latest earlier "2 3" is at 6
        assert_eq!(drafts(&[1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 2, 3], 3), vec![7, 8, 9]);
        // a 3-token match beats a later 2-token one
        assert_eq!(drafts(&[5, 2, 3, 40, 41, 2, 3, 42, 5, 2, 3], 2), vec![40, 41]);
        // past the history's end the match's period repeats: "1 2" recurs 3 tokens later
        assert_eq!(drafts(&[1, 2, 6, 1, 2], 4), vec![6, 1, 2, 6]);
        assert_eq!(drafts(&[4, 9, 9, 9], 3), vec![9, 9, 9]);
    }

    #[test]
    fn no_match_or_no_room_gives_no_drafts() {
        assert_eq!(drafts(&[1, 2, 3, 4, 5, 6], 3), Vec::<u32>::new());
        assert_eq!(drafts(&[1, 2, 1, 2], 0), Vec::<u32>::new());
        assert_eq!(drafts(&[7], 3), Vec::<u32>::new());
    }

    #[test]
    fn the_modes_parse_and_draft_counts_are_bounded() {
        assert_eq!(SpecMode::parse("ngram"), Ok(SpecMode::Ngram));
        assert!(SpecMode::parse("mtp").unwrap_err().contains("not run yet"));
        assert!(SpecMode::parse("fast").is_err());
        assert!(Speculation::new(SpecMode::Ngram, 0).is_err());
        assert!(Speculation::new(SpecMode::Ngram, MAX_DRAFT + 1).is_err());
        assert!(Speculation::new(SpecMode::Off, 3).unwrap().drafter().is_none());
    }
}
