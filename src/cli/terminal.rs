//! Text from the cluster (plan status, Event messages, S3 and Velero error texts) is printed to a
//! terminal: its control characters are shown escaped, so a message cannot move the cursor, retitle the
//! window or hide text (the terminal-escape injection of kubectl's CVE-2021-25743).

use std::borrow::Cow;

/// `text` with every C0 control (but newline and tab, which the layout itself uses), DEL and C1 control
/// written as `\u{..}`.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_not_run() {
        assert_eq!(escape_controls("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            escape_controls("bucket \u{1b}]0;owned\u{7}\u{1b}[2J error\r"),
            "bucket \\u{1b}]0;owned\\u{7}\\u{1b}[2J error\\u{d}"
        );
        // C1 controls (8-bit CSI) and DEL too.
        assert_eq!(escape_controls("a\u{9b}31mb\u{7f}"), "a\\u{9b}31mb\\u{7f}");
        assert!(matches!(escape_controls("ok"), Cow::Borrowed(_)));
    }
}
