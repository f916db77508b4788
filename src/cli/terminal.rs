//! Text from the cluster (plan status, Event messages, S3 and Velero error texts) is printed to a
//! terminal: its control characters are shown escaped, so a message cannot move the cursor, retitle the
//! window or hide text (the terminal-escape injection of kubectl's CVE-2021-25743).

use std::borrow::Cow;

/// `text` with every C0 control (but newline and tab, which the layout itself uses), DEL and C1 control
/// written as `\u{..}`.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    replace_chars(
        text,
        |c| c.is_control() && c != '\n' && c != '\t',
        |c| format!("\\u{{{:x}}}", c as u32),
    )
}

/// Serialized JSON with DEL and the C1 controls written as `\u00..` escapes: serde_json escapes only
/// the C0 controls, and a terminal acts on an 8-bit CSI (U+009B) as on ESC [. Such characters appear in
/// JSON only inside strings, where an escape stands for the same character, so the document means the
/// same to a parser.
pub fn json_safe(json: String) -> String {
    replace_chars(
        &json,
        |c| c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c),
        |c| format!("\\u{:04x}", c as u32),
    )
    .into_owned()
}

/// `text` with every character `unsafe_char` picks written as `escape` gives it; borrowed when none is.
fn replace_chars(
    text: &str,
    unsafe_char: impl Fn(char) -> bool,
    escape: impl Fn(char) -> String,
) -> Cow<'_, str> {
    if !text.chars().any(&unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&escape(c));
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
    fn json_output_escapes_c1_controls_and_means_the_same() {
        let value = serde_json::json!({"message": "a\u{9b}31m b\u{7f} \u{1b}[2J ok"});
        let text = json_safe(value.to_string());
        assert!(!text.chars().any(|c| c.is_control()), "{text:?}");
        assert!(
            text.contains("\\u009b") && text.contains("\\u007f"),
            "{text}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).expect("still JSON");
        assert_eq!(back, value);
    }

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
