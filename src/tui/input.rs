//! The multi-line input box: text, cursor, history.

/// Text being typed; the cursor is a byte index on a char boundary.
#[derive(Debug, Default, Clone)]
pub struct Input {
    pub text: String,
    pub cursor: usize,
    history: Vec<String>,
    /// Position while walking the history (None: editing a new entry).
    hist_pos: Option<usize>,
    draft: String,
}

impl Input {
    pub fn insert(&mut self, s: &str) {
        // pasted CRLF becomes LF
        let s = s.replace("\r\n", "\n").replace('\r', "\n");
        self.text.insert_str(self.cursor, &s);
        self.cursor += s.len();
        self.hist_pos = None;
    }

    pub fn backspace(&mut self) {
        if let Some((i, _)) = self.text[..self.cursor].char_indices().next_back() {
            self.text.replace_range(i..self.cursor, "");
            self.cursor = i;
        }
    }

    pub fn delete(&mut self) {
        if let Some(c) = self.text[self.cursor..].chars().next() {
            self.text.replace_range(self.cursor..self.cursor + c.len_utf8(), "");
        }
    }

    pub fn left(&mut self) {
        if let Some((i, _)) = self.text[..self.cursor].char_indices().next_back() {
            self.cursor = i;
        }
    }

    pub fn right(&mut self) {
        if let Some(c) = self.text[self.cursor..].chars().next() {
            self.cursor += c.len_utf8();
        }
    }

    /// Start of the cursor's line.
    pub fn home(&mut self) {
        self.cursor = self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1);
    }

    /// End of the cursor's line.
    pub fn end(&mut self) {
        self.cursor = self.text[self.cursor..].find('\n').map_or(self.text.len(), |i| self.cursor + i);
    }

    pub fn clear(&mut self) {
        self.text.clear();
        self.cursor = 0;
        self.hist_pos = None;
    }

    pub fn is_multiline(&self) -> bool {
        self.text.contains('\n')
    }

    /// Take the text to send, remembering it in the history.
    pub fn take(&mut self) -> String {
        let t = std::mem::take(&mut self.text);
        self.cursor = 0;
        self.hist_pos = None;
        if !t.trim().is_empty() && self.history.last() != Some(&t) {
            self.history.push(t.clone());
        }
        t
    }

    /// Older history entry (Up).
    pub fn prev(&mut self) {
        if self.history.is_empty() {
            return;
        }
        let pos = match self.hist_pos {
            None => {
                self.draft = self.text.clone();
                self.history.len() - 1
            }
            Some(0) => 0,
            Some(p) => p - 1,
        };
        self.hist_pos = Some(pos);
        self.text = self.history[pos].clone();
        self.cursor = self.text.len();
    }

    /// Newer history entry (Down); past the newest, the draft comes back.
    pub fn next(&mut self) {
        let Some(p) = self.hist_pos else { return };
        if p + 1 < self.history.len() {
            self.hist_pos = Some(p + 1);
            self.text = self.history[p + 1].clone();
        } else {
            self.hist_pos = None;
            self.text = std::mem::take(&mut self.draft);
        }
        self.cursor = self.text.len();
    }

    /// (line, column in chars) of the cursor.
    pub fn cursor_pos(&self) -> (usize, usize) {
        let before = &self.text[..self.cursor];
        let line = before.matches('\n').count();
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count());
        (line, col)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn editing_and_history() {
        let mut i = Input::default();
        i.insert("héllo");
        i.left();
        i.backspace();
        assert_eq!(i.text, "hélo");
        i.insert("\r\nworld");
        // CRLF pasted at the cursor (before the last 'o') becomes LF
        assert_eq!(i.text, "hél\nworldo");
        assert!(i.is_multiline());
        let sent = i.take();
        assert_eq!(sent, "hél\nworldo");
        i.insert("draft");
        i.prev();
        assert_eq!(i.text, "hél\nworldo");
        i.next();
        assert_eq!(i.text, "draft");
        i.home();
        assert_eq!(i.cursor, 0);
        i.end();
        assert_eq!(i.cursor_pos(), (0, 5));
    }
}
